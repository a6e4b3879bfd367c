"""Dynamic methods without call history: each forward's frequencies depend on its own length only.

transformers' `dynamic_rope_update` (modeling_rope_utils.py in 4.57 and 5.23) keeps state in the
rotary module: it recomputes `inv_freq` only when a forward is longer than the longest seen so
far, and its reset (for a forward shorter than L) restores `inv_freq` but not
`attention_scaling`. So after a long forward, a forward between L and the longest length keeps
the long one's frequencies, and a forward shorter than L keeps the long one's attention scale
(dynamic YaRN: 1.114 instead of 1.0 after 3·L) — the output depends on what came before.

`make_history_free(module)` adds a forward pre-hook to one rotary module: before each forward it
sets the frequencies and attention scale from the rope init function at this forward's length
(max position + 1), then sets `max_seq_len_cached` so transformers' update finds nothing to do.
It is per module, never global: `hf_posext.patch` adds it to the modules it builds; for
hf_posext's own dynamic rope type (`dynamic_yarn`) our rope init function adds it to the module
being constructed, so a checkpoint reloaded by `AutoModelForCausalLM.from_pretrained` after
`import hf_posext` gets it too (docs/dynamic.md says where transformers' behaviour remains).

Rotary modules come in two layouts, both handled through "slots": one rope per module
(`rope_type` a string, attributes `inv_freq`, `attention_scaling`), or 5.x per-layer-type
modules (Gemma 3: `rope_type` a dict, attributes `<layer_type>_inv_freq`, ...).
"""

from __future__ import annotations

import sys

import torch
from transformers import modeling_rope_utils

# A rope_type without "dynamic" in it: transformers' update and our hook then leave the
# frequencies alone (used by `generation.fixed_rope_scale` to hold them for a whole generate).
FROZEN = "hf_posext_fixed"
_HOOKED = "_hf_posext_history_free"


def slots(module: torch.nn.Module) -> list[str | None]:
    """The rope slots of a rotary module: [None] for one rope, the layer types for 5.x Gemma 3."""
    rope_type = getattr(module, "rope_type", None)
    if isinstance(rope_type, dict):
        return list(rope_type)
    return [None] if isinstance(rope_type, str) else []


def _name(slot: str | None, attr: str) -> str:
    return attr if slot is None else f"{slot}_{attr}"


def slot_type(module, slot: str | None) -> str:
    return module.rope_type if slot is None else module.rope_type[slot]


def set_slot_type(module, slot: str | None, rope_type: str) -> None:
    if slot is None:
        module.rope_type = rope_type
    else:
        module.rope_type[slot] = rope_type


def is_dynamic_type(rope_type) -> bool:
    """transformers' test in `dynamic_rope_update`: "dynamic" in the type's name."""
    return isinstance(rope_type, str) and "dynamic" in rope_type


def get_frequencies(module, slot: str | None) -> tuple[torch.Tensor, float]:
    return getattr(module, _name(slot, "inv_freq")), getattr(module, _name(slot, "attention_scaling"))


def set_frequencies(module, slot: str | None, inv_freq: torch.Tensor, scale: float) -> None:
    module.register_buffer(_name(slot, "inv_freq"), inv_freq, persistent=False)
    setattr(module, _name(slot, "attention_scaling"), scale)


def frequencies_at(module, slot: str | None, seq_len: int, device=None, rope_type=None):
    """(inv_freq, attention_scale) of the module's rope type at length `seq_len`."""
    init_fn = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type or slot_type(module, slot)]
    layer = {} if slot is None else {"layer_type": slot}
    return init_fn(module.config, device, seq_len=seq_len, **layer)


def _pre_hook(module, args, kwargs):
    x = args[0] if args else kwargs["x"]
    position_ids = args[1] if len(args) > 1 else kwargs["position_ids"]
    slot = args[2] if len(args) > 2 else kwargs.get("layer_type")
    if not is_dynamic_type(slot_type(module, slot)):
        return None  # static type, or frozen by fixed_rope_scale
    seq_len = int(position_ids.max()) + 1
    inv_freq, scale = frequencies_at(module, slot, seq_len, x.device)
    set_frequencies(module, slot, inv_freq, scale)
    # transformers' update: growth only if seq_len > cached, reset only if cached > original
    setattr(module, _name(slot, "max_seq_len_cached"), max(seq_len, module.original_max_seq_len))
    return None


def make_history_free(module: torch.nn.Module) -> bool:
    """Add the pre-hook to a rotary module with a dynamic rope type (idempotent).
    Returns whether the module has it."""
    if getattr(module, _HOOKED, False):
        return True
    if not any(is_dynamic_type(slot_type(module, s)) for s in slots(module)):
        return False
    module.register_forward_pre_hook(_pre_hook, with_kwargs=True)
    setattr(module, _HOOKED, True)
    return True


def is_history_free(module: torch.nn.Module) -> bool:
    return bool(getattr(module, _HOOKED, False))


def hook_module_under_construction(config) -> bool:
    """Called by hf_posext's rope init function at construction (seq_len None) with the config it
    was given: add the pre-hook to the rotary module being built with that very config object.

    Why a frame look-up (the one place hf_posext reads the call stack), checked in 4.57 and 5.23:
    - the rope-init contract (`ROPE_INIT_FUNCTIONS`) passes (config, device, seq_len[,
      layer_type]), never the module; `XRotaryEmbedding.__init__` sets `self.config = config`
      and then calls the init function with `self.config` (modeling_llama.py);
    - a model built by `AutoModelForCausalLM.from_pretrained` is never handed to hf_posext, and
      transformers has no per-module construction hook;
    - torch's construction-time hooks (`register_module_buffer_registration_hook`, global
      forward pre-hooks) are process-wide: every module of every model would pass through them.
    So the rotary module is the `self` of the nearest `__init__` frame whose `self.config` *is*
    `config` (identity, not the stack depth); anything else calling the init function
    (transformers' `_init_weights`, `fixed_rope_scale`) finds none and is left alone.
    tests/test_dynamic.py fails if the contract changes (then use the module it passes)."""
    frame = sys._getframe(1)
    for _ in range(_FRAMES):
        frame = frame.f_back
        if frame is None:
            return False
        module = frame.f_locals.get("self")
        if frame.f_code.co_name == "__init__" and isinstance(module, torch.nn.Module) \
                and getattr(module, "config", None) is config and hasattr(module, "rope_type"):
            return make_history_free(module)
    return False


_FRAMES = 4  # init fn <- __init__ (4.57, 5.23); a little room for a wrapper in between

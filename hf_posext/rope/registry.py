"""The one registry: methods -> RoPE math, hf_posext's rope types -> transformers, and the
model types the patcher supports (keyed by `config.model_type`, as Liger-Kernel keys its own):
the decoder families found in transformers' own modules (rope/families.py) minus the refusals,
computed from their code (rope/families_support.py) or explicit here, each with its reason.

`register()` runs on `import hf_posext`. It only *adds* entries (`ntk`, `ntk_by_parts`,
`dynamic_yarn`) to transformers' `ROPE_INIT_FUNCTIONS` and their validators; transformers' own
types are never replaced, so models that do not use ours are untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from transformers import modeling_rope_utils

from . import dynamic, families, families_support, methods
from .compat import GLOBAL_LAYER_TYPE, IS_V5, get_rope_parameters, rotary_dim, text_config
from .config import RopeExtensionConfig, method_of_rope_type
from .units import REGISTERED_ROPE_TYPES, STATIC_METHODS, UNITS

# On transformers 4.x: the families hf_posext's suite ran there (4.57); the found table
# (rope/families.py) is tested on 5.x.
TESTED_ON_V4 = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "olmo2", "granite",
                "gpt_neox", "stablelm", "phi3")
# Model types whose config accepts no rope type but plain RoPE and `longrope`: static methods
# are saved there in their exact longrope form (hf_posext/rope/longrope.py; static NTK stays a plain
# theta change), dynamic ones are refused with this reason.
LONGROPE_ONLY: dict[str, str] = {
    "phi3": ("transformers' Phi3Config accepts only rope_type 'longrope' (5.x refuses any other "
             "type; 4.57 and 5.x rewrite a saved 'yarn' to 'longrope' on load), and a dynamic "
             "method has no longrope form: its frequencies follow the current length. Use a "
             f"static method ({', '.join(STATIC_METHODS)}) or an attention-level one"),
}
# On 4.x, where even the longrope form cannot be saved (reason); NTK's plain theta change can.
LONGROPE_REFUSED_V4: dict[str, str] = {} if IS_V5 else {
    "phi3": ("transformers 4.57's Phi3Config reloads a longrope config only as exactly {type, "
             "short_factor, long_factor} and derives the attention factor from "
             "max_position_embeddings, so the explicit attention_factor that makes the longrope "
             "form exact cannot be saved. Use transformers 5.x, or 'ntk' (a plain theta change)"),
}
# Rotary modules that keep their own rope: Gemma 3's sliding-window layers use a local base
# (rope_local_base_freq) that its long-context configs never scale. In 4.57 that is a second
# module built from a private config copy (`rotary_emb_local`); in 5.x it is the
# "sliding_attention" entry of the per-layer-type rope dict, which `compat` leaves alone.
LOCAL_ROTARY: dict[str, tuple[str, ...]] = {"gemma3_text": ("rotary_emb_local",)}
# RoPE families found with the shared rotary pattern that hf_posext cannot extend exactly, and
# why (each checked against transformers' own modules; the found table's other refusals are
# computed from the code by `families_support.refusal_from_code`).
EXPLICIT_REFUSALS: dict[str, str] = {
    "ministral3": ("its rope dict also carries `llama_4_scaling_beta`, and its attention scales the "
                   "queries by 1 + beta·log(1 + floor(position / original_max_position_embeddings)) "
                   "(modeling_ministral3 `get_llama_4_attn_scale`): a second, position-dependent "
                   "temperature that hf_posext's methods do not define"),
    "phimoe": ("PhimoeConfig.validate_rope accepts only plain RoPE and `longrope` with its own "
               "short_mscale / long_mscale keys, a form hf_posext does not write"),
    "phi4_multimodal": ("Phi4MultimodalConfig.validate_rope accepts only plain RoPE and `longrope`, "
                        "and hf_posext's longrope form is tested on Phi-3's text model only"),
    "lfm3": ("its full-attention layers use transformers' own rope type `proportional`, on which "
             "hf_posext does not stack a method"),
    "beam": ("its full-attention layers carry no rope (rope_parameters['full_attention'] is None) "
             "and its sliding-window layers are the local ones long-context configs leave alone"),
    "zaya": ("its rope dict is nested by layer types without full_attention ('hybrid', "
             "'hybrid_sliding'), and no long-context config of it says which entry to scale"),
    "ergo": ("its full-attention layers carry no rope (rope_parameters['full_attention'] is None) "
             "and its sliding-window layers are the local ones long-context configs leave alone"),
    # found and following the shared pattern, but hf_posext's tests cannot build a tiny model
    "dbrx": ("not verified: DbrxConfig keeps its rope base in attn_config, and a tiny Dbrx with a "
             "rope dict fails inside transformers ('DbrxAttentionConfig' has no rope_theta), so "
             "hf_posext's tests cannot compare it with transformers' own rope types"),
    "dory": ("not verified: a tiny Dory model fails in transformers' own eager attention (its "
             "mask is longer than the keys), so hf_posext's tests cannot compare it"),
    "longcat_flash": ("not verified: a tiny LongCat-Flash model fails in its own interleaved MLA "
                      "rope, so hf_posext's tests cannot compare it"),
    "qwen4_exp_text": ("not verified: its sparse indexer needs settings (token_budget, "
                       "compress_ratio) a tiny test config lacks, so hf_posext's tests cannot "
                       "compare it"),
    "cohere_compass_text": ("not verified: its config carries no rope dict by default, so "
                            "hf_posext's tests cannot compare it"),
    "kolibri1_1": ("not verified: its indexed-attention layers need settings (index_num_heads, "
                   "index_layers) a tiny test config lacks, so hf_posext's tests cannot compare it"),
    "blt": ("not verified: its smallest model (byte patcher and latent transformer sub-configs) "
            "is too large for hf_posext's tiny-model tests"),
    "emu3": ("not verified: its smallest model (with the VQ image tokenizer) is too large for "
             "hf_posext's tiny-model tests"),
}
if not IS_V5:
    EXPLICIT_REFUSALS["olmo2"] = (
        "transformers 4.57's Olmo2Config accepts only rope_scaling {'type': 'linear' or "
        "'dynamic', 'factor'} and refuses any other rope config on load, so an extended OLMo 2 "
        "checkpoint could not be reloaded. Use transformers 5.x, where OLMo 2 is supported")


def refusal(model_type: str | None) -> str | None:
    """Why a found RoPE family cannot be extended (None: it can, or it is not a RoPE family)."""
    if model_type in EXPLICIT_REFUSALS:
        return EXPLICIT_REFUSALS[model_type]
    if not IS_V5 and model_type in TESTED_ON_V4:
        return None
    fam = families.family(model_type) if isinstance(model_type, str) else None
    if fam is None:
        return None
    if not IS_V5:
        return "hf_posext tests this family on transformers 5.x only; upgrade transformers"
    return families_support.refusal_from_code(fam)


def _found(model_type: object) -> bool:
    if not isinstance(model_type, str):
        return False
    return (not IS_V5 and model_type in TESTED_ON_V4) or families.family(model_type) is not None


def _found_types() -> Iterator[str]:
    found = [f.model_type for f in families.all_families()]
    return iter(found if IS_V5 else dict.fromkeys([*TESTED_ON_V4, *found]))


class _Table(Mapping[str, Any]):
    """A read-only mapping over the found families, built lazily (rope/families.py): a lookup
    reads one family's module, iterating reads them all (once)."""

    def __init__(self, keep: Callable[[str], bool], value: Callable[[str], Any]):
        self._keep, self._value = keep, value

    def __contains__(self, model_type: object) -> bool:
        return _found(model_type) and self._keep(model_type)  # type: ignore[arg-type]  # a str

    def __getitem__(self, model_type: str) -> Any:
        if model_type not in self:
            raise KeyError(model_type)
        return self._value(model_type)

    def __iter__(self) -> Iterator[str]:
        return (t for t in _found_types() if self._keep(t))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: {v!r}' for k, v in self.items())}}}"


# model_type -> its rotary class names: every found family hf_posext extends (tested with tiny
# random configs of each: tests/test_families_found.py, tests/test_families_new.py).
SUPPORTED_MODEL_TYPES: Mapping[str, tuple[str, ...]] = _Table(
    lambda t: refusal(t) is None, lambda t: getattr(families.family(t), "rotary_classes", ()))
# model_type -> why a found RoPE family cannot be extended.
UNSUPPORTED_MODEL_TYPES: Mapping[str, str] = _Table(
    lambda t: refusal(t) is not None, lambda t: refusal(t))


def compute(spec: RopeExtensionConfig, dim: int, base: float, seq_len: int | torch.Tensor | None = None,
            device=None) -> methods.Freqs:
    """inv_freq [dim/2] (float32) and the cos/sin scale of `spec` for a rotary dim and base."""
    if isinstance(seq_len, torch.Tensor):
        seq_len = int(seq_len.max().item())
    return UNITS[spec.method].compute(spec, dim, base, seq_len, device)


def _rope_init_fn(config, device=None, seq_len=None, layer_type=None, **_: Any):
    """transformers' ROPE_INIT_FUNCTIONS contract: (config, device, seq_len) -> (inv_freq, scale).
    5.x per-layer-type modules (Gemma 3) pass the layer type whose rope dict to read."""
    rope = get_rope_parameters(config, layer_type)
    spec = RopeExtensionConfig.from_rope_dict(rope, config.max_position_embeddings)
    if seq_len is None and spec.is_dynamic:
        dynamic.hook_module_under_construction(config)
    return compute(spec, rotary_dim(config, layer_type), float(rope["rope_theta"]), seq_len, device)


def _validate_v5(self, rope_parameters: dict, ignore_keys=None) -> None:
    """5.x config validator (`_validate_<type>_rope_parameters`): strict, raises on bad values."""
    RopeExtensionConfig.from_rope_dict(rope_parameters, getattr(self, "max_position_embeddings", None))


def _validate_v4(config, ignore_keys=None) -> None:
    """4.x validator (`ROPE_VALIDATION_FUNCTIONS`)."""
    RopeExtensionConfig.from_rope_dict(get_rope_parameters(config), config.max_position_embeddings)


def register() -> None:
    """Add hf_posext's rope types to transformers (idempotent; never overrides a foreign entry)."""
    table = modeling_rope_utils.ROPE_INIT_FUNCTIONS
    for rope_type in REGISTERED_ROPE_TYPES:
        assert method_of_rope_type(rope_type) is not None
        current = table.get(rope_type)
        if current is not None and current is not _rope_init_fn:
            raise RuntimeError(f"transformers already defines rope_type {rope_type!r}; hf_posext "
                               "will not replace it. Please report this with your versions.")
        table[rope_type] = _rope_init_fn
        if IS_V5:
            from transformers.configuration_utils import PreTrainedConfig

            setattr(PreTrainedConfig, f"_validate_{rope_type}_rope_parameters", _validate_v5)
        else:
            modeling_rope_utils.ROPE_VALIDATION_FUNCTIONS[rope_type] = _validate_v4  # type: ignore[attr-defined]  # 4.x only; checked against 5.x


def rotary_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """Every (parent, attribute name, rotary embedding module) inside `model` that an extension
    applies to (for a supported type: its rotary class, without the local ones)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    fam = families.family(model_type) if isinstance(model_type, str) else None
    wanted = fam.rotary_classes if fam is not None else None
    local = LOCAL_ROTARY.get(model_type, ())
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            kind = type(child).__name__
            if (kind in wanted if wanted else kind.endswith("RotaryEmbedding")) and name not in local:
                found.append((parent, name, child))
    return found


# Error messages point here rather than list every family (listing them reads every modeling
# module of transformers, `families.all_families`).
WHERE_LISTED = "hf_posext.SUPPORTED_MODEL_TYPES lists the supported families (docs/families.md)"


def _unsupported_reason(model: torch.nn.Module, rope: dict) -> str | None:
    """Why a RoPE model cannot be extended by hf_posext, when that can be told from the model."""
    if "mrope_section" in rope or "mrope_section" in (rope.get("rope_scaling") or {}):
        return ("it uses multimodal RoPE (mrope_section): frequencies are split across temporal, "
                "height and width position axes, and the scaling rules here are defined for one "
                "text position axis")
    config = text_config(model.config)
    params = getattr(config, "rope_parameters", None) if IS_V5 else None
    nested = config.nested_rope_parameter_keys(params) if isinstance(params, dict) else []
    if nested and not isinstance(params.get(GLOBAL_LAYER_TYPE), dict):
        return (f"its rope dict is nested by layer types {', '.join(nested)} with no rope for "
                "full_attention layers, the ones long-context configs scale")
    if getattr(config, "is_heterogeneous", False):
        return ("its config sets head_dim and head counts per layer (per_layer_config), while "
                "hf_posext's rope types read one rotary dim per rope dict")
    for _, name, module in rotary_modules(model):
        if not dynamic.slots(module) or not hasattr(module, "config"):
            return (f"its rotary module {type(module).__name__} does not build its frequencies "
                    "from transformers' shared rope functions (ROPE_INIT_FUNCTIONS and the "
                    "config's rope dict), which is how hf_posext extends a model")
        if module.config is not config:
            return (f"its rotary module {name!r} is built from a private copy of the config, "
                    "which a patched config does not reach")
    return None


def check_supported(model: torch.nn.Module) -> None:
    """Raise a clear error unless `model` is a RoPE model of a supported architecture."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if config is None:
        raise TypeError(f"hf_posext.patch expects a transformers model with a .config, got "
                        f"{type(model).__name__}")
    if not rotary_modules(model):   # a RoPE-free family, or one whose config turns rope off
        raise ValueError(f"model_type {model_type!r} ({type(model).__name__}) has no rotary position "
                         "embedding (RoPE) to extend: it uses another kind of position encoding. "
                         f"{WHERE_LISTED}.")
    reason = refusal(model_type) or _unsupported_reason(model, get_rope_parameters(text_config(config)))
    if reason:
        raise ValueError(f"model_type {model_type!r} uses RoPE but hf_posext cannot extend it: "
                         f"{reason}. {WHERE_LISTED}.")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} uses RoPE but is not supported by hf_posext: "
                         "transformers' causal-LM table has no rotary class built for its config "
                         f"class (rope/families.py finds families there). {WHERE_LISTED}.")

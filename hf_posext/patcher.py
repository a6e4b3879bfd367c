"""The one patcher: `patch(model, method, factor)` / `unpatch(model)` on a loaded model.

A method is a rope config: patching writes it into the model's config (through `compat`) and
rebuilds the model's rotary embedding modules from that config, exactly as transformers builds
them at load time. So a patched model and the same checkpoint reloaded by `from_pretrained` run
the same code. Only this model's config and modules change; nothing global is touched.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from . import attention, portable
from .compat import fill_head_dim, get_rope_parameters, rotary_dim, set_rope_parameters, text_config
from .config import PASSTHROUGH_TYPES, RopeExtensionConfig, method_of_rope_type
from .registry import check_supported, rotary_modules

_STATE_ATTR = "_hf_posext_state"
_RAW_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "max_position_embeddings", "head_dim",
             portable.BLOCK, *attention.RAW_KEYS)


@dataclass
class _PatchState:
    """What `unpatch` restores: the config's raw rope attributes and the original modules."""
    raw_config: dict[str, Any]
    modules: list[tuple[torch.nn.Module, str, torch.nn.Module]]
    rope: dict[str, Any]
    max_position_embeddings: int


def _base_rope(rope: dict[str, Any], max_pos: int) -> tuple[dict[str, Any], int]:
    """The plain RoPE under a config and its trained length L, so a second patch replaces the
    first (and a checkpoint saved extended can be re-extended) instead of compounding."""
    rope_type = rope.get("rope_type", "default")
    base = {k: rope[k] for k in ("rope_theta", "partial_rotary_factor") if k in rope}
    base["rope_type"] = "default"
    if rope_type == "default":
        return base, max_pos
    if method_of_rope_type(rope_type) is not None:
        spec = RopeExtensionConfig.from_rope_dict(rope, max_pos)
        return base, spec.original_max_position_embeddings
    raise ValueError(f"This model already uses transformers' rope_type {rope_type!r}; hf_posext does "
                     "not stack a second extension on it. Load the un-extended base model, or keep "
                     f"{rope_type!r} as it is.")


def _resolve_factor(factor, target, trained: int) -> float:
    if target is not None:
        if isinstance(target, bool) or not isinstance(target, int) or target <= 0:
            raise ValueError(f"max_position_embeddings (the target length) must be a positive "
                             f"integer, got {target!r}")
        if target < trained:
            raise ValueError(f"target length max_position_embeddings={target} is shorter than the "
                             f"trained length {trained}; context extension needs a target >= {trained}.")
        implied = target / trained
        if factor is None:
            return implied
        if isinstance(factor, (int, float)) and not math.isclose(factor, implied, rel_tol=1e-9):
            raise ValueError(f"factor={factor} and max_position_embeddings={target} disagree: "
                             f"{target} / trained length {trained} = {implied:g}. Pass only one.")
    if factor is None:
        raise ValueError("Pass factor= (the scale s, e.g. 4.0) or max_position_embeddings= (the "
                         "target context length); got neither.")
    return factor


def _build_spec(method, factor, target, trained: int, params: dict[str, Any]) -> RopeExtensionConfig:
    if isinstance(method, RopeExtensionConfig):
        if factor is not None or target is not None or params:
            raise ValueError("Pass either a RopeExtensionConfig or method/factor/params, not both.")
        spec = copy.deepcopy(method)
        if spec.original_max_position_embeddings is None:
            spec.original_max_position_embeddings = trained
        return spec
    L = params.pop("original_max_position_embeddings", None)
    L = trained if L is None else L
    factor = _resolve_factor(factor, target, L)
    try:
        return RopeExtensionConfig(method, factor, L, **params)
    except TypeError as err:  # an unknown keyword: name it rather than drop it
        known = "beta_fast, beta_slow, mscale_coefficient, attention_factor, " \
                "original_max_position_embeddings, max_position_embeddings"
        raise TypeError(f"Unknown parameter for method {method!r}: {err}. Known: {known}.") from None


def _attention_factor(factor, target, trained: int) -> float:
    """An attention method's factor only records the target length (s·L); it is optional."""
    s = 1.0 if factor is None and target is None else _resolve_factor(factor, target, trained)
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 1:
        raise ValueError(f"factor must be a number >= 1 (target length / trained length), got {s!r}")
    return float(s)


def _passthrough_rope(method: str, factor, target, trained: int, base: dict, params: dict) -> dict:
    """transformers' own `llama3` / `longrope`: written as given, validated by transformers."""
    unknown = set(params) - PASSTHROUGH_TYPES[method]
    if unknown:
        raise TypeError(f"{method!r} does not take {sorted(unknown)}; it takes "
                        f"{sorted(PASSTHROUGH_TYPES[method])}.")
    rope = {**base, "rope_type": method, **params}
    if factor is not None or target is not None:
        rope["factor"] = float(_resolve_factor(factor, target, trained))
    rope.setdefault("original_max_position_embeddings", trained)
    return rope


def patch(model: torch.nn.Module, method, factor: float | None = None, *,
          max_position_embeddings: int | None = None, **params: Any) -> torch.nn.Module:
    """Extend a loaded Llama/Mistral model in place and return it.

    Args:
        model: a transformers causal LM (or base model) of a type in SUPPORTED_MODEL_TYPES.
        method: a name in `hf_posext.METHODS` (or `llama3` / `longrope`, passed to
            transformers), or a `RopeExtensionConfig`.
        factor: the scale s >= 1. May be omitted when `max_position_embeddings` is given.
        max_position_embeddings: the target context length; factor = target / trained length.
        **params: the method's knobs (beta_fast, beta_slow, mscale_coefficient,
            attention_factor, original_max_position_embeddings). Unknown ones raise.

    Patching again replaces the previous extension; `unpatch` restores the original.
    Static methods raise `config.max_position_embeddings` to the target length. Dynamic ones
    leave it at the trained length: transformers' dynamic update reads it as L.
    """
    check_supported(model)
    config = text_config(model.config)
    state: _PatchState | None = getattr(model, _STATE_ATTR, None)
    if state is None:
        state = _PatchState(
            raw_config={k: copy.deepcopy(config.__dict__[k]) for k in _RAW_KEYS if k in config.__dict__},
            modules=rotary_modules(model),
            rope=_logical_rope(config),
            max_position_embeddings=config.max_position_embeddings)
    base, trained = _base_rope(state.rope, state.max_position_embeddings)
    trained = attention.saved_trained_length(state.raw_config) or trained
    # attention-level methods (hf_posext/attention): plain RoPE underneath, or log-n on a rope method
    attn_spec, method, params = attention.split(method, params, trained)

    if method is None:
        new_rope, spec = dict(base), None
        new_max = round(trained * _attention_factor(factor, max_position_embeddings, trained))
    elif isinstance(method, str) and method.lower() in PASSTHROUGH_TYPES:
        new_rope = _passthrough_rope(method.lower(), factor, max_position_embeddings, trained, base, params)
        spec = None
        new_max = max_position_embeddings or round(trained * new_rope.get("factor", 1.0))
    else:
        spec = _build_spec(method, factor, max_position_embeddings, trained, dict(params))
        new_rope = portable.saved_rope(spec, base, rotary_dim(config))  # the portable form
        if spec.factor == 1.0:
            # s = 1 is no extension: write plain RoPE. (Every static formula reduces to it; the
            # dynamic rules would still grow with length, which is an extension of its own.)
            new_rope, new_max = dict(base), spec.original_max_position_embeddings
        elif spec.is_dynamic:
            new_max = spec.original_max_position_embeddings
        else:
            new_max = max_position_embeddings or round(spec.original_max_position_embeddings * spec.factor)

    try:
        fill_head_dim(config)
        config.max_position_embeddings = int(new_max)
        set_rope_parameters(config, new_rope)
        portable.set_block(config, spec, base["rope_theta"])
        attention.install(config, attn_spec, state.raw_config)
    except Exception:
        config.__dict__.update(copy.deepcopy(state.raw_config))
        raise
    _install_rotary(model, state, config)
    setattr(model, _STATE_ATTR, state)
    return model


def _install_rotary(model, state: _PatchState, config) -> None:
    """Rebuild every rotary module from the (patched) config, as transformers does at load."""
    for parent, name, original in state.modules:
        new = type(original)(config=config)
        new.to(original.inv_freq.device)  # device only: inv_freq stays float32
        setattr(parent, name, new)


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Restore the model exactly as it was before the first `patch` (config and modules)."""
    state: _PatchState | None = getattr(model, _STATE_ATTR, None)
    if state is None:
        raise ValueError("This model was not patched by hf_posext.patch, so there is nothing to undo.")
    config = text_config(model.config)
    for key in _RAW_KEYS:
        if key not in state.raw_config:
            config.__dict__.pop(key, None)
    config.__dict__.update(copy.deepcopy(state.raw_config))
    for parent, name, original in state.modules:
        setattr(parent, name, original)
    delattr(model, _STATE_ATTR)
    return model


def trained_length(model: torch.nn.Module) -> int:
    """The context L the model was trained at, seen through any extension: ours in memory, one
    saved in the checkpoint (a `linear` config keeps only s·L), or transformers' llama3/longrope."""
    state: _PatchState | None = getattr(model, _STATE_ATTR, None)
    config = text_config(model.config)
    rope = state.rope if state else _logical_rope(config)
    max_pos = state.max_position_embeddings if state else config.max_position_embeddings
    saved = attention.saved_trained_length(state.raw_config if state else config.__dict__)
    if saved:  # an attention method keeps plain RoPE and records L in its block
        return saved
    if rope.get("rope_type") in PASSTHROUGH_TYPES:
        return int(rope.get("original_max_position_embeddings") or max_pos)
    return _base_rope(rope, max_pos)[1]


def _logical_rope(config) -> dict[str, Any]:
    """The rope as hf_posext reads it: a portable save (e.g. `ntk` as plain RoPE with the raised
    theta) is seen through its `config.hf_posext` block as the method on the original theta."""
    return portable.logical_rope(config, get_rope_parameters(config), rotary_dim(config))


def is_patched(model: torch.nn.Module) -> bool:
    return getattr(model, _STATE_ATTR, None) is not None

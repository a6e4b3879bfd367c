"""The one patcher: `patch(model, method, factor)` / `unpatch(model)` on a loaded model.

A method is a rope config: patching writes it into the model's config (through `compat`) and
rebuilds the model's rotary embedding modules from that config, exactly as transformers builds
them at load time. So a patched model and the same checkpoint reloaded by `from_pretrained` run
the same code. Only this model's config and modules change; nothing global is touched.

`patch` is atomic: it first plans the new rope config without touching anything (`plan`, also
used by `hf_posext.from_pretrained` before any weight loads), then applies it inside a
transaction that puts the config, the rotary modules and the patch state back exactly as they
were if anything raises (our validation, transformers' own, or a rotary constructor).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from . import attention
from .catalog import canonical_method
from .errors import ConfigError, plain_number, refuse_renamed
from .portability import portable
from .rope import dynamic, families, softmax_scale
from .rope.families_support import attention_refusal
from .rope.compat import fill_head_dim, get_rope_parameters, rotary_dim, set_rope_parameters, text_config
from .rope.config import (KNOBS, MAX_FACTOR, PASSTHROUGH, PASSTHROUGH_TYPES, RopeExtensionConfig,
                          _check_number, check_target, method_of_rope_type)
from .rope.knobs import FACTOR, NATIVE_TRAINED_KEY, RENAMED, TARGET_LENGTH, TRAINED_LENGTH
from .rope.units import PASSTHROUGH_UNITS
from .rope.registry import LONGROPE_ONLY, LONGROPE_REFUSED_V4, check_supported, rotary_modules

_STATE_ATTR = "_hf_posext_state"
_RAW_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "max_position_embeddings", "head_dim",
             NATIVE_TRAINED_KEY, "rope_local_base_freq", portable.ENTRY,
             *attention.RAW_KEYS)


@dataclass
class _PatchState:
    """What `unpatch` restores: the config's raw rope attributes and the original modules."""
    raw_config: dict[str, Any]
    modules: list[tuple[torch.nn.Module, str, torch.nn.Module]]
    rope: dict[str, Any]
    max_position_embeddings: int
    # DeepSeek-family attention modules and their constructed softmax scales (rope/softmax_scale.py)
    scalings: list[tuple[Any, float]] = dataclasses.field(default_factory=list)


def _base_rope(rope: dict[str, Any], max_pos: int) -> tuple[dict[str, Any], int]:
    """The plain RoPE under a config and its trained length L, so a second patch replaces the
    first (and a checkpoint saved extended can be re-extended) instead of compounding."""
    rope_type = rope.get("rope_type", "default")
    base: dict[str, Any] = {k: rope[k] for k in ("rope_theta", "partial_rotary_factor") if k in rope}
    base["rope_type"] = "default"
    if rope_type == "default":
        return base, max_pos
    if method_of_rope_type(rope_type) is not None:
        spec = RopeExtensionConfig.from_rope_dict(rope, max_pos)
        return base, spec.trained_length
    raise ValueError(f"This model already uses transformers' rope_type {rope_type!r}; hf_posext does "
                     "not stack a second extension on it. Load the un-extended base model, or keep "
                     f"{rope_type!r} as it is.")


def _resolve_factor(factor, target, trained: int) -> float:
    if target is not None:
        target = TARGET_LENGTH.check(target, trained)
        implied = target / trained
        if factor is None:
            return implied
        if isinstance(factor, (int, float)) and not math.isclose(factor, implied, rel_tol=1e-9):
            raise ValueError(f"factor={factor} and {TARGET_LENGTH.name}={target} disagree: "
                             f"{target} / trained length {trained} = {implied:g}. Pass only one.")
    if factor is None:
        raise ValueError(f"Pass factor= (the scale s, e.g. 4.0) or {TARGET_LENGTH.name}= (the "
                         "target context length); got neither.")
    return factor


def _build_spec(method, factor, target, trained: int, params: dict[str, Any]) -> RopeExtensionConfig:
    if isinstance(method, RopeExtensionConfig):
        if factor is not None or target is not None or params:
            raise ValueError("Pass either a RopeExtensionConfig or method/factor/params, not both.")
        if method.trained_length is None:
            return dataclasses.replace(method, trained_length=trained)
        return method  # immutable: safe to share
    canonical_method(method)  # an unknown name: the error lists every method (catalog.METHODS)
    L = params.pop(TRAINED_LENGTH.name, None)
    L = trained if L is None else L
    factor = _resolve_factor(factor, target, L)
    try:
        return RopeExtensionConfig(method, factor, L, **params)
    except TypeError as err:  # an unknown keyword: name it rather than drop it
        if "unexpected keyword" not in str(err):
            raise
        known = ", ".join((*KNOBS, TRAINED_LENGTH.name, TARGET_LENGTH.name))
        raise TypeError(f"Unknown parameter for method {method!r}: {err}. Known: {known}.") from None


def _attention_factor(factor, target, trained: int) -> float:
    """An attention method's factor only records the target length (s·L); it is optional."""
    s = 1.0 if factor is None and target is None else _resolve_factor(factor, target, trained)
    s = FACTOR.check(s, trained)
    check_target(s, trained)
    return float(s)


def _passthrough_rope(method: str, factor, target, trained: int, base: dict, params: dict, dim: int) -> dict:
    """transformers' own `llama3` / `longrope`, with the same guards as our methods: known and
    required knobs, the trained length (its knob's check), factor >= 1, target >= the trained
    length (so max_position_embeddings can never drop below L), then the unit's checks against
    the rotary dim. The frequencies themselves are transformers' own. The input `trained_length`
    goes into the rope dict under transformers' key (NATIVE_TRAINED_KEY), which it reads."""
    unknown = set(params) - PASSTHROUGH_TYPES[method]
    if unknown:
        raise TypeError(f"{method!r} does not take {sorted(unknown)}; it takes "
                        f"{sorted(PASSTHROUGH_TYPES[method])}.")
    unit = PASSTHROUGH_UNITS[method]
    missing = [k for k in PASSTHROUGH[method][0] if k not in params]
    if missing:
        helps = "; ".join(f"{k.name}: {k.help}" for k in unit.knobs if k.name in missing)
        raise ValueError(f"{method!r} needs {missing} (transformers' {method} has no defaults for "
                         f"them): {helps}.")
    params, name = dict(params), TRAINED_LENGTH.name
    L = TRAINED_LENGTH.validate(params.pop(name) if name in params else TRAINED_LENGTH.default_at(trained), trained)
    rope = {**base, "rope_type": method, **params, NATIVE_TRAINED_KEY: L}
    if factor is not None or target is not None:
        rope["factor"] = _check_number("factor", _resolve_factor(factor, target, L), minimum=1.0,
                                       maximum=MAX_FACTOR)
        check_target(rope["factor"], L)
    if unit.check_rotary is not None:
        unit.check_rotary(rope, dim)
    return rope


@dataclass(frozen=True)
class PatchPlan:
    """What `patch` writes: the rope dict (in its portable saved form), max_position_embeddings,
    the method's spec for the `config.hf_posext` entry (None for plain RoPE and transformers'
    own llama3/longrope) and the attention-level method (hf_posext/attention), if any."""
    rope: dict[str, Any]
    max_position_embeddings: int
    spec: RopeExtensionConfig | None
    attention: Any
    rope_theta: float


def plan(rope: dict[str, Any], max_pos: int, method, factor=None, target=None,
         params: dict[str, Any] | None = None, *, dim: int, saved_trained: int | None = None,
         model_type: str | None = None) -> PatchPlan:
    """What `patch` would write, from the model's original rope dict and max_position_embeddings.
    Pure: touches no model, raises on any bad argument, so `from_pretrained` can run it on the
    config before loading weights. `model_type` picks the saved form (`LONGROPE_ONLY`)."""
    base, trained = _base_rope(rope, max_pos)
    trained = saved_trained or trained
    if isinstance(method, attention.AttentionExtensionConfig):
        method, factor, target, params = _from_attention_config(method, factor, target, params, trained)
    # numpy / torch scalars as plain numbers (messages, and config.json must stay JSON)
    factor, target = plain_number(factor), plain_number(target)
    params = {k: [plain_number(x) for x in (v.tolist() if hasattr(v, "tolist") else v)]
              if isinstance(v, (list, tuple)) or getattr(v, "ndim", 0) >= 1 else plain_number(v)
              for k, v in (params or {}).items()}
    # attention-level methods run on plain RoPE, or add log-n on top of a rope method
    attn_target = (round(trained * _attention_factor(factor, target, trained))
                   if attention.is_attention_method(method) else None)
    attn_spec, method, params = attention.split(method, dict(params or {}), trained, attn_target)
    theta = base["rope_theta"]
    if method is None and attn_spec is None:   # patch(model, None, ...) would only raise max_pos
        raise ConfigError("method is None: name a method (one of hf_posext.METHODS, e.g. 'yarn'); "
                          "to undo a patch use hf_posext.unpatch(model).")
    if method is None and not attn_spec.changes_positions and rope.get("rope_type", "default") != "default":
        # log-n alone keeps the rope it is given: a checkpoint saved extended keeps its extension
        method = _kept_extension(rope, max_pos, factor, target)
        factor = target = None
    if method is None:
        s = _attention_factor(factor, target, trained)
        return PatchPlan(dict(base), round(trained * s), None, attn_spec, theta)
    if isinstance(method, str) and method.lower() in PASSTHROUGH_TYPES:
        new_rope = _passthrough_rope(method.lower(), factor, target, trained, base, params, dim)
        L = new_rope[NATIVE_TRAINED_KEY]
        return PatchPlan(new_rope, target or round(L * new_rope.get("factor", 1.0)), None, attn_spec, theta)
    spec = _build_spec(method, factor, target, trained, params)
    L = spec.trained_length
    if spec.factor == 1.0:
        # s = 1 is no extension: write plain RoPE. (Every static formula reduces to it; the
        # dynamic rules would still grow with length, which is an extension of its own.)
        return PatchPlan(dict(base), L, None, attn_spec, theta)
    longrope_only = model_type in LONGROPE_ONLY
    if longrope_only and spec.is_dynamic:
        raise ValueError(f"{spec.method!r} cannot extend model_type {model_type!r}: "
                         f"{LONGROPE_ONLY[model_type]}.")
    # the form most readers run exactly
    new_rope = portable.saved_rope(spec, base, dim, longrope_only)
    if new_rope["rope_type"] == "longrope" and model_type in LONGROPE_REFUSED_V4:
        raise ValueError(f"{spec.method!r} cannot extend model_type {model_type!r} here: "
                         f"{LONGROPE_REFUSED_V4[model_type]}.")
    if spec.is_dynamic and not spec.finetuned:
        # transformers' dynamic update reads max_position_embeddings as the length up to
        # which the construction-time frequencies hold: L here, s·L in fine-tuned mode.
        return PatchPlan(new_rope, L, spec, attn_spec, theta)
    return PatchPlan(new_rope, target or round(L * spec.factor), spec, attn_spec, theta)


def _kept_extension(rope: dict[str, Any], max_pos: int, factor, target) -> RopeExtensionConfig:
    """The saved extension `logn` alone runs on. Its factor only records a target length, which the
    saved one covers up to its own s; a larger one would need another extension, so it is refused."""
    spec = RopeExtensionConfig.from_rope_dict(rope, max_pos)
    asked = factor if target is None else target / spec.trained_length
    if asked is not None and float(asked) > spec.factor * (1 + 1e-9):
        raise ConfigError(f"'logn' keeps this model's saved {spec.method!r} at factor {spec.factor:g}, "
                          f"short of {float(asked):g}. Re-extend with log-n on top instead: "
                          f"patch(model, {spec.method!r}, {float(asked):g}, logn=True).")
    return spec


def _from_attention_config(config, factor, target, params, trained: int):
    """`patch(model, AttentionExtensionConfig(...))`, as `patch(model, RopeExtensionConfig(...))`
    works for rope methods: the config's method, knobs and target length become the arguments."""
    if factor is not None or target is not None or params:
        raise ValueError("Pass either an AttentionExtensionConfig or method/factor/params, not both.")
    if config.trained_length != trained:
        raise ConfigError(f"The AttentionExtensionConfig says trained_length={config.trained_length}, but "
                          f"this model was trained at {trained} tokens: build it with "
                          f"trained_length={trained}.")
    knobs = {k: v for k, v in config.knobs.items() if k != "target_length"}
    return config.method, None, config.target_length, knobs


def plan_for_config(config, method, factor=None, target=None, params=None) -> PatchPlan:
    """`plan` for an unpatched (text) config, e.g. a checkpoint's before its weights load."""
    return plan(_logical_rope(config), config.max_position_embeddings, method, factor, target,
                params, dim=rotary_dim(config),
                saved_trained=attention.saved_trained_length(config.__dict__),
                model_type=getattr(config, "model_type", None))


def apply_to_config(config, new: PatchPlan, raw_config: dict[str, Any]) -> None:
    """Write a plan into a (text) config and run transformers' validation on it. `raw_config`
    holds the attributes the config had before hf_posext touched it."""
    fill_head_dim(config)
    config.max_position_embeddings = int(new.max_position_embeddings)
    keeps_l = NATIVE_TRAINED_KEY in config.__dict__   # Phi-3 keeps L beside the dict
    if NATIVE_TRAINED_KEY in new.rope and (keeps_l or new.rope["rope_type"] == "longrope"):
        # transformers 5.x prefers that top-level copy of L; 4.57 switches longrope's short /
        # long factor sets only at it, else at max_position_embeddings (s·L here), while 5.x
        # switches at the dict's L (modeling_rope_utils `longrope_frequency_update`). Written for
        # every longrope, both versions switch at L.
        config.original_max_position_embeddings = new.rope[NATIVE_TRAINED_KEY]
    set_rope_parameters(config, new.rope)
    portable.set_entry(config, new.spec, new.rope_theta)
    if new.attention is not None:
        model_type = getattr(config, "model_type", None)
        why = attention_refusal(families.family(model_type) if isinstance(model_type, str) else None,
                                config)
        if why:
            raise ValueError(f"{new.attention.method!r} cannot run on model_type {model_type!r}: {why}.")
    attention.install(config, new.attention, raw_config)


@contextmanager
def _atomic(model: torch.nn.Module, config):
    """Undo every change to `config`, the rotary modules and the patch state if the block raises."""
    saved = {k: (v, copy.deepcopy(v)) for k, v in config.__dict__.items()}
    modules = [(parent, name, child) for parent, name, child in rotary_modules(model)]
    scalings = softmax_scale.snapshot(model)
    state = model.__dict__.get(_STATE_ATTR)
    try:
        yield
    except BaseException:
        for key in set(config.__dict__) - set(saved):
            del config.__dict__[key]
        for key, (original, snapshot) in saved.items():
            try:  # the original object back, unless it was mutated in place
                intact = bool(original == snapshot)
            except Exception:  # values without a plain truth value
                intact = False
            config.__dict__[key] = original if intact else snapshot
        for parent, name, child in modules:
            setattr(parent, name, child)
        softmax_scale.restore(scalings)
        if state is None:
            model.__dict__.pop(_STATE_ATTR, None)
        else:
            model.__dict__[_STATE_ATTR] = state
        raise


_Model = TypeVar("_Model", bound=torch.nn.Module)   # patch returns the very model it was given


def patch(model: _Model, method, factor: float | None = None, *,
          target_length: int | None = None, **params: Any) -> _Model:
    """Extend a loaded model in place and return it.

    Args:
        model: a transformers causal LM (or base model) of a type in SUPPORTED_MODEL_TYPES
            (the families found in transformers' modules, docs/families.md).
        method: a name in `hf_posext.METHODS` (or `llama3` / `longrope`, passed to
            transformers), or a `RopeExtensionConfig`.
        factor: the scale s >= 1. May be omitted when `target_length` is given.
        target_length: the target context length T; factor = T / trained length.
        **params: the method's knobs (beta_fast, beta_slow, truncate, mscale_coefficient,
            attention_factor, mscale, mscale_all_dim, finetuned, trained_length). Unknown ones
            raise, and so do
            transformers' names for the lengths (`max_position_embeddings`,
            `original_max_position_embeddings`), naming ours.

    Patching again replaces the previous extension; `unpatch` restores the original. Any error
    leaves the model exactly as it was before the call. Attention modules that take their softmax
    scale from the rope dict at construction (DeepSeek's `mscale_all_dim`) get it recomputed from
    the patched config (`rope/softmax_scale.py`), as a reload of the saved model computes it.
    Static methods raise `config.max_position_embeddings` to the target length. Dynamic ones
    leave it at the trained length (transformers' dynamic update reads it as L), and their
    rotary modules get a per-module hook that makes each forward's frequencies and attention
    scale depend on that forward's length only (`hf_posext.rope.dynamic`).
    """
    refuse_renamed("patch", params, RENAMED)
    check_supported(model)
    config = text_config(model.config)
    state: _PatchState | None = getattr(model, _STATE_ATTR, None)
    if state is None:
        state = _PatchState(
            raw_config={k: copy.deepcopy(config.__dict__[k]) for k in _RAW_KEYS if k in config.__dict__},
            modules=rotary_modules(model),
            rope=_logical_rope(config),
            max_position_embeddings=config.max_position_embeddings,
            scalings=softmax_scale.snapshot(model))
    new = plan(state.rope, state.max_position_embeddings, method, factor, target_length,
               params, dim=rotary_dim(config),
               saved_trained=attention.saved_trained_length(state.raw_config),
               model_type=getattr(config, "model_type", None))
    with _atomic(model, config):
        apply_to_config(config, new, state.raw_config)
        _install_rotary(model, state, config)
        softmax_scale.apply(model, config)
        setattr(model, _STATE_ATTR, state)
    return model


def _install_rotary(model, state: _PatchState, config) -> None:
    """Rebuild every extended rotary module from the (patched) config, as transformers does at
    load, and give dynamic ones the history-free hook."""
    for parent, name, original in state.modules:
        new = type(original)(config=config)
        new.to(original.inv_freq.device if hasattr(original, "inv_freq") else  # type: ignore[arg-type]  # a buffer, not a Module
               next(original.buffers()).device)  # device only: frequencies stay float32
        dynamic.make_history_free(new)
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
    softmax_scale.restore(state.scalings)
    delattr(model, _STATE_ATTR)
    return model


def trained_length(model: Any) -> int:  # a model, or anything with its .config (checked below)
    """The context L the model was trained at, seen through any extension: ours in memory, one
    saved in the checkpoint (a `linear` config keeps only s·L), or transformers' llama3/longrope."""
    if getattr(model, "config", None) is None:
        raise TypeError(f"trained_length expects a loaded transformers model (with a .config), got "
                        f"{type(model).__name__} {model!r:.40}; load it first (e.g. "
                        "hf_posext.from_pretrained(name)).")
    state: _PatchState | None = getattr(model, _STATE_ATTR, None)
    config = text_config(model.config)
    rope = state.rope if state else _logical_rope(config)
    max_pos = state.max_position_embeddings if state else config.max_position_embeddings
    saved = attention.saved_trained_length(state.raw_config if state else config.__dict__)
    if saved:  # an attention method keeps plain RoPE and records L in its entry
        return saved
    if rope.get("rope_type") in PASSTHROUGH_TYPES:
        return int(rope.get(NATIVE_TRAINED_KEY) or max_pos)
    return _base_rope(rope, max_pos)[1]


def _logical_rope(config) -> dict[str, Any]:
    """The rope as hf_posext reads it: a portable save (e.g. `ntk` as plain RoPE with the raised
    theta) is seen through its `config.hf_posext` entry as the method on the original theta."""
    return portable.logical_rope(config, get_rope_parameters(config), rotary_dim(config))


def is_patched(model: torch.nn.Module) -> bool:
    return getattr(model, _STATE_ATTR, None) is not None

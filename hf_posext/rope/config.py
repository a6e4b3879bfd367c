"""`RopeExtensionConfig`: one validated, serialisable description of a context-extension method.

In the style of a PEFT config: a dataclass, checked on construction, with `to_dict` / `from_dict`
(our own layout) and `to_rope_dict` / `from_rope_dict` (transformers' rope layout). Knobs a
method does not use are refused rather than ignored, so nothing is silently dropped.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..errors import plain_number
from .units import ROPE_METHODS, UNITS

# The longest target s·L any method is planned for (int32 positions; no model has a longer
# cache) and the largest scale (beyond it L·s overflows or rounds to an absurd length: 1e308
# would reach `round(inf)`). attention/config.py fits its "auto" knobs under the same bounds.
MAX_TARGET_LENGTH = 2 ** 31   # positions 0 .. 2^31 - 1
MAX_FACTOR = 2 ** 20

# ROPE_METHODS (from the units) + the attention-level names: hf_posext.catalog.METHODS.
ALIASES = {"dynamic": "dynamic_ntk", "pi": "linear", "ntk_aware": "ntk"}
# transformers' own rope types that hf_posext passes through untouched (no math of ours):
# type -> (required keys, optional keys). The required ones have no default in transformers (its
# validators would raise deep inside `patch`; the patcher names them first).
PASSTHROUGH: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "llama3": (("low_freq_factor", "high_freq_factor"), ("factor", "original_max_position_embeddings")),
    "longrope": (("short_factor", "long_factor"),
                 ("factor", "original_max_position_embeddings", "attention_factor")),
}
PASSTHROUGH_TYPES = {t: set(req + opt) for t, (req, opt) in PASSTHROUGH.items()}


def canonical_method(method: str, known: tuple[str, ...] = ROPE_METHODS) -> str:
    """Resolve aliases (`dynamic` -> `dynamic_ntk`); raise a helpful error for names not in
    `known` (the rope methods here; `hf_posext.catalog` passes every method)."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a string such as 'yarn', got {type(method).__name__}")
    name = ALIASES.get(method.lower(), method.lower())
    if name not in known:
        hint = ("; attention-level methods (hf_posext.ATTENTION_METHODS) are not rope configs: use "
                "hf_posext.patch(model, method) or AttentionExtensionConfig") if known is ROPE_METHODS else ""
        raise ValueError(f"Unknown RoPE extension method {method!r}. Use one of: {', '.join(known)} "
                         f"(aliases: {', '.join(ALIASES)}){hint}.")
    return name


def rope_type_of(method: str) -> str:
    return UNITS[canonical_method(method)].rope_type


def is_dynamic(method: str) -> bool:
    return UNITS[canonical_method(method)].dynamic


def method_of_rope_type(rope_type: str) -> str | None:
    """The hf_posext method a transformers rope_type stands for, or None."""
    for name, unit in UNITS.items():
        if unit.rope_type == rope_type:
            return name
    return None


def _check_number(name: str, value: Any, *, minimum: float | None = None, strict: bool = False,
                  maximum: float | None = None) -> float:
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        rel = ">" if strict else ">="
        raise ValueError(f"{name} must be {rel} {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}={value:g} is past {maximum:,.0f}: the target length (factor x trained "
                         f"length) must stay within {MAX_TARGET_LENGTH:,} positions (int32); ask "
                         "for a smaller factor.")
    return value


def check_target(factor: float, trained: int) -> None:
    """The target s·L within MAX_TARGET_LENGTH (a countable, int32 position), s <= MAX_FACTOR."""
    if factor > MAX_FACTOR or factor * trained > MAX_TARGET_LENGTH:
        raise ValueError(f"factor={factor:g} x trained length {trained} = {factor * trained:.4g} "
                         f"tokens, past {MAX_TARGET_LENGTH:,} positions (int32); ask for a smaller "
                         f"factor (<= {min(MAX_FACTOR, MAX_TARGET_LENGTH // trained):,}).")


@dataclass(frozen=True)
class RopeExtensionConfig:
    """A context-extension method and its parameters. Immutable, so it can never hold a value
    that skipped validation: derive a changed copy with `dataclasses.replace(cfg, factor=8.0)`,
    which validates again.

    Args:
        method: one of `hf_posext.METHODS` (`dynamic` is accepted for `dynamic_ntk`).
        factor: scale s = target length / trained length, >= 1. For `dynamic_yarn` the scale is
            taken from the current length; `factor` then only records the intended target.
        original_max_position_embeddings: the trained context L. None means "read it from the
            model" (the patcher fills it in).
        beta_fast: YaRN's upper ramp bound in rotations over L (default 32, the paper's Llama
            value; the YaRN authors' Mistral runs used 128).
        beta_slow: YaRN's lower ramp bound in rotations over L (default 1; Mistral runs: 2).
        mscale_coefficient: YaRN temperature mscale = c·ln(s) + 1 (0.1; Mistral runs: 0.07).
        attention_factor: `yarn` only; a fixed cos/sin scale replacing the mscale formula.
        finetuned: `dynamic_yarn` only; the YaRN reference code's fine-tuned dynamic mode for a
            model fine-tuned with YaRN at `factor`: static YaRN at `factor` up to factor·L, the
            dynamic rule beyond (`methods.dynamic_yarn_scale`). Default False: s = 1 up to L.
    """

    method: str
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale_coefficient: float | None = None
    attention_factor: float | None = None
    finetuned: bool | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the only writes happen here, after each check
        set_(self, "method", canonical_method(self.method))
        set_(self, "factor", _check_number("factor", self.factor, minimum=1.0, maximum=MAX_FACTOR))
        if self.original_max_position_embeddings is not None:
            L = plain_number(self.original_max_position_embeddings)
            if isinstance(L, bool) or not isinstance(L, (int, float)) or not math.isfinite(L) \
                    or L <= 0 or int(L) != L:
                raise ValueError(f"original_max_position_embeddings must be a positive integer "
                                 f"(the trained context length), got {L!r}")
            set_(self, "original_max_position_embeddings", int(L))
            check_target(self.factor, int(L))
        used = tuple(UNITS[self.method].knobs)
        for knob in KNOBS:
            value = getattr(self, knob)
            if knob not in used:
                if value is not None:
                    raise ValueError(f"{self.method!r} does not use {knob!r} (it uses: "
                                     f"{', '.join(('factor',) + used)}). Remove it, or pick a "
                                     f"method that takes it, e.g. "
                                     f"{next(n for n, u in UNITS.items() if knob in u.knobs)!r}.")
                continue
            if value is None:
                value = UNITS[self.method].knobs[knob]
            if isinstance(UNITS[self.method].knobs[knob], bool):  # a switch, e.g. finetuned
                if not isinstance(value, bool):
                    raise TypeError(f"{knob} must be True or False, got {value!r}")
            elif value is not None:
                value = _check_number(knob, value, minimum=0.0, strict=True)
            set_(self, knob, value)
        if "beta_fast" in used and self.beta_fast <= self.beta_slow:
            raise ValueError(f"beta_fast must be greater than beta_slow (rotations over the trained "
                             f"length: fast > slow), got beta_fast={self.beta_fast}, "
                             f"beta_slow={self.beta_slow}. The paper's Llama values are 32 and 1.")

    # -- properties ----------------------------------------------------------------------------
    @property
    def rope_type(self) -> str:
        return rope_type_of(self.method)

    @property
    def is_dynamic(self) -> bool:
        return is_dynamic(self.method)

    @property
    def knobs(self) -> dict[str, Any]:
        """The method-specific knobs with their resolved values."""
        return {k: getattr(self, k) for k in UNITS[self.method].knobs if getattr(self, k) is not None}

    # -- our own layout ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not f.name.startswith("_") and getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RopeExtensionConfig":
        names = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"Unknown RopeExtensionConfig keys {sorted(unknown)}; "
                             f"expected some of {sorted(names)}.")
        return cls(**data)

    # -- transformers' layout ------------------------------------------------------------------
    def to_rope_dict(self, rope_theta: float) -> dict[str, Any]:
        """The *logical* rope dict: the method under its own rope type (`ntk`, `ntk_by_parts`,
        `dynamic_yarn` are types hf_posext registers with transformers), which `from_rope_dict`
        reads back and hf_posext reasons with (`portable.logical_rope`). It is not always what
        config.json holds: that is `portable.saved_rope`, the most portable exact form (plain RoPE
        for `ntk`, transformers' `yarn` for `ntk_by_parts`). Keys follow transformers' names;
        5.x flat layout with rope_theta (`compat` writes the 4.x one)."""
        unit = UNITS[self.method]
        if self.original_max_position_embeddings is None and unit.needs_trained_length:
            raise ValueError(f"{self.method!r} needs original_max_position_embeddings (the trained "
                             "context length); pass it or let hf_posext.patch read it from the model.")
        return {"rope_type": unit.rope_type, "rope_theta": float(rope_theta), "factor": self.factor,
                **unit.rope_keys(self)}

    @classmethod
    def from_rope_dict(cls, rope: dict[str, Any], max_position_embeddings: int | None = None
                       ) -> "RopeExtensionConfig":
        """Read a transformers rope dict back into a config (inverse of `to_rope_dict`)."""
        rope = dict(rope)
        rope_type = rope.pop("rope_type", rope.pop("type", "default"))
        method = method_of_rope_type(rope_type)
        if method is None:
            raise ValueError(f"rope_type {rope_type!r} is not an hf_posext method; known types: "
                             f"{sorted(u.rope_type for u in UNITS.values())}.")
        for key in ("rope_theta", "partial_rotary_factor"):
            rope.pop(key, None)
        unsupported = set(rope) - {"factor", "original_max_position_embeddings", *KNOBS}
        if unsupported:
            raise ValueError(f"rope config keys {sorted(unsupported)} of type {rope_type!r} have no "
                             "hf_posext equivalent; use transformers' own type directly.")
        # Like transformers' validators for its own types: `factor` is required, and a missing
        # or mistyped one is an error naming the key (never a silent plain RoPE).
        if "factor" not in rope:
            raise ValueError(f"The rope config of rope_type {rope_type!r} is missing the required "
                             "key 'factor' (the scale s >= 1, e.g. \"factor\": 4.0).")
        factor = _check_number(f"rope config key 'factor' (rope_type {rope_type!r})",
                               rope.pop("factor"), minimum=1.0, maximum=MAX_FACTOR)
        L = rope.pop("original_max_position_embeddings", None)
        if L is None and max_position_embeddings is not None:
            L = UNITS[method].trained_length_from(max_position_embeddings, factor)
        return cls(method=method, factor=factor, original_max_position_embeddings=L, **rope)


# The knobs a method may use: every field but the three all methods share (each unit's `knobs`
# says which ones it uses, with their defaults). A unit naming another knob is a bug: fail on import.
KNOBS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RopeExtensionConfig)
                               if f.name not in ("method", "factor", "original_max_position_embeddings"))
_stray = {n: set(u.knobs) - set(KNOBS) for n, u in UNITS.items() if set(u.knobs) - set(KNOBS)}
if _stray:
    raise RuntimeError(f"rope units use knobs RopeExtensionConfig has no field for: {_stray}")

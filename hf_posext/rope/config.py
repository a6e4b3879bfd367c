"""`RopeExtensionConfig`: one validated, serialisable description of a context-extension method.

In the style of a PEFT config: a dataclass, checked on construction, with `to_dict` / `from_dict`
(our own layout) and `to_rope_dict` / `from_rope_dict` (transformers' rope layout). Knobs a
method does not use are refused rather than ignored, so nothing is silently dropped.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import refuse_renamed
from .knobs import (FACTOR, MAX_FACTOR, MAX_TARGET_LENGTH, NATIVE_TRAINED_KEY, RENAMED_TRAINED,
                    TRAINED_LENGTH, collect, knob_fields)
from .knobs import number as _check_number
from .units import PASSTHROUGH_UNITS, ROPE_METHODS, UNITS

__all__ = ["MAX_FACTOR", "MAX_TARGET_LENGTH", "RopeExtensionConfig", "KNOBS", "PASSTHROUGH",
           "PASSTHROUGH_TYPES", "canonical_method", "check_target", "_check_number"]

# ROPE_METHODS (from the units) + the attention-level names: hf_posext.catalog.METHODS.
ALIASES = {"dynamic": "dynamic_ntk", "pi": "linear", "ntk_aware": "ntk"}
# The knobs of hf_posext's own methods, each declared once in its unit: a field of the config each.
ROPE_KNOBS = collect((u.knobs for u in UNITS.values()), "rope units")
KNOBS: tuple[str, ...] = tuple(ROPE_KNOBS)
# transformers' own rope types that hf_posext passes through untouched (their units): type ->
# (required keys, optional keys: factor and the unit's other knobs, among them the trained length).
PASSTHROUGH: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    n: (tuple(k.name for k in u.knobs if k.required),
        ("factor", *(k.name for k in u.knobs if not k.required)))
    for n, u in PASSTHROUGH_UNITS.items()}
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


def check_target(factor: float, trained: int) -> None:
    """The target s·L within MAX_TARGET_LENGTH (a countable, int32 position), s <= MAX_FACTOR."""
    if factor > MAX_FACTOR or factor * trained > MAX_TARGET_LENGTH:
        raise ValueError(f"factor={factor:g} x trained length {trained} = {factor * trained:.4g} "
                         f"tokens, past {MAX_TARGET_LENGTH:,} positions (int32); ask for a smaller "
                         f"factor (<= {min(MAX_FACTOR, MAX_TARGET_LENGTH // trained):,}).")


# transformers' name for L is refused as a keyword naming ours (a rope config has no target length:
# `factor` gives it)
@knob_fields(ROPE_KNOBS.values(), renamed=RENAMED_TRAINED)
class RopeExtensionConfig:
    """A context-extension method and its parameters. Immutable, so it can never hold a value
    that skipped validation: derive a changed copy with `dataclasses.replace(cfg, factor=8.0)`,
    which validates again.

    Args:
        method: one of `hf_posext.METHODS` (`dynamic` is accepted for `dynamic_ntk`).
        factor: scale s = target length / trained length, >= 1. For `dynamic_yarn` the scale is
            taken from the current length; `factor` then only records the intended target.
        trained_length: the trained context L. None means "read it from the model" (the
            patcher fills it in). transformers' rope dicts hold it as
            `original_max_position_embeddings` (`to_rope_dict` / `from_rope_dict` map the two);
            that name is refused here, naming this one.

    Every knob of the units (rope/units.py) is a field too, None = the method's default:
    KNOB_HELP below lists them (beta_fast, beta_slow, mscale_coefficient, attention_factor,
    finetuned). A knob the method does not use is refused.
    """

    method: str
    factor: float = 1.0
    trained_length: int | None = None
    if TYPE_CHECKING:  # the knob fields are added from the units (knob_fields)
        __dataclass_fields__: ClassVar[dict[str, Any]]

        def __init__(self, method: str, factor: float = 1.0,
                     trained_length: int | None = None, **knobs: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the only writes happen here, after each check
        set_(self, "method", canonical_method(self.method))
        set_(self, "factor", FACTOR.check(self.factor, None))
        if self.trained_length is not None:
            L = TRAINED_LENGTH.check(self.trained_length, None)
            set_(self, "trained_length", L)
            check_target(self.factor, L)
        unit = UNITS[self.method]
        used = tuple(k.name for k in unit.knobs)
        for knob in ROPE_KNOBS.values():
            value = getattr(self, knob.name)
            if knob.name not in used:
                if value is not None:
                    raise ValueError(f"{self.method!r} does not use {knob.name!r} (it uses: "
                                     f"{', '.join(('factor',) + used)}). Remove it, or pick a "
                                     f"method that takes it, e.g. "
                                     f"{next(n for n, u in UNITS.items() if any(k.name == knob.name for k in u.knobs))!r}.")
                continue
            if value is None:
                value = knob.default_at(self.trained_length)
            if value is not None:
                value = knob.validate(value, self.trained_length)
            set_(self, knob.name, value)
        if unit.check is not None:
            unit.check(self)

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
        return {k.name: getattr(self, k.name) for k in UNITS[self.method].knobs
                if getattr(self, k.name) is not None}

    # -- our own layout ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not f.name.startswith("_") and getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RopeExtensionConfig":
        refuse_renamed(f"{cls.__name__}.from_dict", data, RENAMED_TRAINED)
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
        if self.trained_length is None and unit.needs_trained_length:
            raise ValueError(f"{self.method!r} needs trained_length (the trained context length); "
                             "pass it or let hf_posext.patch read it from the model.")
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
        unsupported = set(rope) - {"factor", NATIVE_TRAINED_KEY, *KNOBS}
        if unsupported:
            raise ValueError(f"rope config keys {sorted(unsupported)} of type {rope_type!r} have no "
                             "hf_posext equivalent; use transformers' own type directly.")
        # Like transformers' validators for its own types: `factor` is required, and a missing
        # or mistyped one is an error naming the key (never a silent plain RoPE).
        if "factor" not in rope:
            raise ValueError(f"The rope config of rope_type {rope_type!r} is missing the required "
                             "key 'factor' (the scale s >= 1, e.g. \"factor\": 4.0).")
        try:
            factor = FACTOR.check(rope.pop("factor"), None)
        except (TypeError, ValueError) as err:   # name the key it came from
            raise type(err)(f"rope config key 'factor' (rope_type {rope_type!r}): {err}") from None
        L = rope.pop(NATIVE_TRAINED_KEY, None)
        if L is None and max_position_embeddings is not None:
            L = UNITS[method].trained_length_from(max_position_embeddings, factor)
        return cls(method=method, factor=factor, trained_length=L, **rope)


# The help of each knob (the CLI's `--knobs` help, docs/methods.md's knob table).
KNOB_HELP: dict[str, str] = {k.name: k.help for k in ROPE_KNOBS.values()}

"""`AttentionExtensionConfig`: one validated, immutable description of an attention-level method.

Which knobs a method takes, their defaults (the authors' code, docs/attention_methods.md), each
knob's check, how an "auto" knob is fitted and whether log-n scaling is on by default: its unit,
units.py. Here: the fields they give (`knob_fields`), applied in order, then the "auto" rule and
the unit's own check.

The "auto" rule, one for every knob: a knob whose spec has a fitting function (`Knob.auto`, e.g.
leaky ReRoPE's `leak`, Self-Extend's `group_size`) also takes "auto"; it then needs the target
length T = s·L, and `fitted(name)` gives the value its unit's function fits for (this config, L,
T). `patch(model, method, s)` sets T; the saved entry keeps "auto" and `target_length`, so a
reload derives the same value.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from ..rope.knobs import RENAMED, TARGET_LENGTH, TRAINED_LENGTH, collect, knob_fields
from .units import ATTENTION_METHODS, LOGN_SCALING, UNITS

# The methods, their knobs (each a spec with its default, check, help and "auto" fit), own
# checks: one unit each (units.py).
KNOBS: dict[str, tuple[str, ...]] = {n: u.knob_names() for n, u in UNITS.items()}
ATTENTION_KNOBS = collect((u.knobs for u in UNITS.values()), "attention units")
# Every knob of an attention method: the units' knobs and log-n (every method's; its default is
# the unit's). The target T is not one: only "auto" knobs read it.
ALL_KNOBS: tuple[str, ...] = (*ATTENTION_KNOBS, LOGN_SCALING.name)
KNOB_HELP: dict[str, str] = {k.name: k.help for k in (*ATTENTION_KNOBS.values(), LOGN_SCALING)}


@knob_fields(ATTENTION_KNOBS.values(), before=("logn", "target_length"), renamed=RENAMED)
class AttentionExtensionConfig:
    """An attention-level method and its knobs (None = the authors' default for L).

    Args:
        method: one of ATTENTION_METHODS.
        trained_length: the trained context L (log-n's base, and the scale of the defaults).
        logn: scale each query by max(1, log n / log L) (n = its position + 1).
        target_length: T = s·L; only read by the "auto" knobs (`patch` fills it from the factor).

    Every knob of the units (units.py; KNOB_HELP) is a field too: window, leak, group_size,
    chunk_size, local_window, shifted_offset, local_value.
    """

    method: str
    trained_length: int
    logn: bool | None = None
    target_length: int | None = None
    if TYPE_CHECKING:  # the knob fields are added from the units (knob_fields)
        __dataclass_fields__: ClassVar[dict[str, Any]]

        def __init__(self, method: str, trained_length: int, *, logn: bool | None = None,
                     target_length: int | None = None, **knobs: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        if not isinstance(self.method, str) or self.method.lower() not in KNOBS:
            raise ValueError(f"Unknown attention method {self.method!r}; use one of "
                             f"{', '.join(ATTENTION_METHODS)}.")
        set_("method", self.method.lower())
        L = TRAINED_LENGTH.check(self.trained_length, None)
        set_("trained_length", L)
        unit = UNITS[self.method]
        used = KNOBS[self.method]
        given = {knob: getattr(self, knob) for knob in used}
        for knob in ATTENTION_KNOBS.values():
            if knob.name not in used and getattr(self, knob.name) is not None:
                raise ValueError(f"{self.method!r} does not use {knob.name!r} (it uses: "
                                 f"{', '.join(used + (LOGN_SCALING.name,))}). Remove it.")
        logn = unit.logn if self.logn is None else LOGN_SCALING.check(self.logn, L)
        if self.method == "logn" and not logn:
            raise ValueError("method 'logn' is the log-n scaling itself; logn=False leaves nothing. "
                             "Use no method (unpatch) instead.")
        set_("logn", logn)
        if self.target_length is not None:
            set_("target_length", TARGET_LENGTH.check(self.target_length, L))
        for knob in unit.knobs:
            value = given[knob.name]
            set_(knob.name, knob.validate(knob.default_at(L) if value is None else value, L))
        auto = [k for k in used if getattr(self, k) == "auto"]
        if auto and self.target_length is None:
            raise ValueError(f"{auto[0]}='auto' fits the knob to the target length: pass factor= (or "
                             f"target_length=) to patch, or target_length= here.")
        if unit.check is not None:
            unit.check(self, given)

    def fitted(self, name: str) -> Any:
        """Knob `name` as the kernel uses it: "auto" fitted to the target length by its unit's
        function (`Knob.auto`, given this config, L and T); any other value as it is."""
        value = getattr(self, name)
        if value != "auto":   # (validation keeps "auto" only where the knob has a fit and T is set)
            return value
        return ATTENTION_KNOBS[name].auto(self, self.trained_length, self.target_length)

    @property
    def knobs(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in KNOBS[self.method] + (LOGN_SCALING.name,)}
        if "auto" in out.values():
            out["target_length"] = self.target_length
        return out

    @property
    def changes_positions(self) -> bool:
        """False for `logn` alone: it keeps whatever rope the model has."""
        return self.method != "logn"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AttentionExtensionConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"Unknown attention-method keys {sorted(unknown)}; expected some of "
                             f"{sorted(names)}.")
        return cls(**data)

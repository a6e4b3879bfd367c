"""`AttentionExtensionConfig`: one validated, immutable description of an attention-level method.

Which knobs a method takes, their defaults (the authors' code, docs/attention_methods.md), each
knob's check and whether log-n scaling is on by default: its unit, units.py. Here: the fields
they give (`knob_fields`), applied in order, then the "auto" rule and the unit's own check.

`leak="auto"` (leaky ReRoPE) and `group_size="auto"` (Self-Extend) fit the knob to the target
length T = s·L so that the farthest relative position a T-token input produces stays trained
(<= L − 1). Leaky: w + (T − 1 − w)/k <= L − 1, so k = (T − 1 − w)/(L − 1 − w), at least 1 (up to L
nothing is compressed). Self-Extend: the smallest integer G >= 1 with ⌊(T − 1)/G⌋ + W − W/G <= L − 1
(LongLM's README advises a margin, W + (T − W)/G below L/2 … 2L/3; give G yourself for that).
`patch(model, method, s)` sets T; the saved block keeps "auto" and `target_length`, so a reload
derives the same value.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from ..rope.knobs import MAX_FACTOR, MAX_TARGET_LENGTH, collect, knob_fields, tokens
from .units import ATTENTION_METHODS, UNITS

# The methods, their knobs (each a spec with its default, check and help), own checks: one unit
# each (units.py). MAX_FACTOR also keeps the auto group search below at most 2^20 / L steps.
KNOBS: dict[str, tuple[str, ...]] = {n: u.knob_names() for n, u in UNITS.items()}
ATTENTION_KNOBS = collect((u.knobs for u in UNITS.values()), "attention units")
# Every knob of an attention method: the units' knobs and log-n (every method's; its default is
# the unit's). The target T is not one: only "auto" knobs read it.
ALL_KNOBS: tuple[str, ...] = (*ATTENTION_KNOBS, "logn")
KNOB_HELP: dict[str, str] = {**{k.name: k.help for k in ATTENTION_KNOBS.values()},
                             "logn": "scale each query by max(1, log n / log L) (n = its position + 1)"}


@knob_fields(ATTENTION_KNOBS.values(), before=("logn", "target_length"))
class AttentionExtensionConfig:
    """An attention-level method and its knobs (None = the authors' default for L).

    Args:
        method: one of ATTENTION_METHODS.
        trained_length: the trained context L (log-n's base, and the scale of the defaults).
        <knob>: one field per knob of the units (units.py; KNOB_HELP): window, leak,
            group_size, chunk_size, local_window, shifted_offset, local_value.
        logn: scale each query by max(1, log n / log L) (n = its position + 1).
        target_length: T = s·L; only read by the "auto" knobs (`patch` fills it from the factor).
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
        L = tokens("trained_length", self.trained_length)
        set_("trained_length", L)
        unit = UNITS[self.method]
        used = KNOBS[self.method]
        given = {knob: getattr(self, knob) for knob in used}
        for knob in ATTENTION_KNOBS.values():
            if knob.name not in used and getattr(self, knob.name) is not None:
                raise ValueError(f"{self.method!r} does not use {knob.name!r} (it uses: "
                                 f"{', '.join(used + ('logn',))}). Remove it.")
        logn = unit.logn if self.logn is None else self.logn
        if not isinstance(logn, bool):
            raise TypeError(f"logn must be True or False, got {logn!r}")
        if self.method == "logn" and not logn:
            raise ValueError("method 'logn' is the log-n scaling itself; logn=False leaves nothing. "
                             "Use no method (unpatch) instead.")
        set_("logn", logn)
        if self.target_length is not None:
            set_("target_length", tokens("target_length", self.target_length))
            if self.target_length > min(MAX_TARGET_LENGTH, MAX_FACTOR * L):
                raise ValueError(f"target_length={self.target_length} (factor x trained length) is past "
                                 f"{min(MAX_TARGET_LENGTH, MAX_FACTOR * L)} tokens (2^31 int32 positions, "
                                 f"factor {MAX_FACTOR}); ask for a smaller factor.")
        for knob in unit.knobs:
            value = given[knob.name]
            set_(knob.name, knob.validate(knob.default_at(L) if value is None else value, L))
        auto = [k for k in used if getattr(self, k) == "auto"]
        if auto and self.target_length is None:
            raise ValueError(f"{auto[0]}='auto' fits the knob to the target length: pass factor= (or "
                             f"max_position_embeddings=) to patch, or target_length= here.")
        if unit.check is not None:
            unit.check(self, given)

    @property
    def leak_value(self) -> float | None:
        """k as the kernel uses it: `auto` -> (T − 1 − w)/(L − 1 − w), at least 1."""
        if self.leak != "auto":
            return self.leak
        L, w, T = self.trained_length, self.window, self.target_length
        return max(1.0, (T - 1 - w) / (L - 1 - w)) if w < L - 1 else 1.0

    @property
    def group_value(self) -> int | None:
        """G as the kernel uses it: `auto` -> the smallest G >= 1 with
        ⌊(T − 1)/G⌋ + W − W/G <= L − 1 (the farthest grouped position stays trained)."""
        if self.group_size != "auto":
            return self.group_size
        L, W, T = self.trained_length, self.window, self.target_length
        # ⌊x⌋ > x − 1, so any G meeting the bound has G > (T − 1 − W)/(L − W): start there (the
        # loop then runs about T/L² <= MAX_FACTOR/L steps, not T/L).
        G = max(1, (T - 1 - W) // (L - W)) if L > W else 1
        while (T - 1) // G + W - W / G > L - 1:
            G += 1
        return G

    @property
    def knobs(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in KNOBS[self.method] + ("logn",)}
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

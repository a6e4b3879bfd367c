"""`AttentionExtensionConfig`: one validated, immutable description of an attention-level method.

Which knobs a method takes, their defaults (the authors' code, docs/attention_methods.md) and
whether log-n scaling is on by default: its unit, units.py. Here: the checks of each knob.

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
import math
from dataclasses import dataclass
from typing import Any

from ..errors import plain_number
from ..rope.config import MAX_FACTOR, MAX_TARGET_LENGTH   # the same bounds as rope methods
from .units import ATTENTION_METHODS, UNITS

# The methods, their knobs, defaults and own checks: one unit each (units.py). MAX_FACTOR also
# keeps the auto group search below at most 2^20 / L steps.
KNOBS: dict[str, tuple[str, ...]] = {n: u.knobs() for n, u in UNITS.items()}


def _positive_int(name: str, value: Any) -> int:
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer (a number of tokens), got {value!r}")
    return int(value)


@dataclass(frozen=True)
class AttentionExtensionConfig:
    """An attention-level method and its knobs (None = the authors' default for L).

    Args:
        method: one of ATTENTION_METHODS.
        trained_length: the trained context L (log-n's base, and the scale of the defaults).
        window: rerope / leaky_rerope: relative positions below it are exact; self_extend: the
            neighbour window W. Must be <= L (positions past L were never trained).
        leak: leaky_rerope's k > 1: beyond the window, relative positions grow with slope 1/k.
        group_size: self_extend's G >= 1: distant positions are floor(p / G).
        chunk_size: dual_chunk's chunk s <= L.
        local_window: dual_chunk's local window l < s.
        shifted_offset: string's S <= L (distances from S on are shifted).
        local_value: string's W <= S (where they restart: d − S + W; W = S is plain RoPE).
        logn: scale each query by max(1, log n / log L) (n = its position + 1).
        target_length: T = s·L; only read by the "auto" knobs (`patch` fills it from the factor).
    """

    method: str
    trained_length: int
    window: int | None = None
    leak: float | None = None
    group_size: int | None = None
    chunk_size: int | None = None
    local_window: int | None = None
    shifted_offset: int | None = None
    local_value: int | None = None
    logn: bool | None = None
    target_length: int | None = None

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        if not isinstance(self.method, str) or self.method.lower() not in KNOBS:
            raise ValueError(f"Unknown attention method {self.method!r}; use one of "
                             f"{', '.join(ATTENTION_METHODS)}.")
        set_("method", self.method.lower())
        L = _positive_int("trained_length", self.trained_length)
        set_("trained_length", L)
        used = KNOBS[self.method]
        given = {knob: getattr(self, knob) for knob in used}
        for knob in ALL_KNOBS:
            if knob == "logn":
                continue
            value = getattr(self, knob)
            if knob not in used:
                if value is not None:
                    raise ValueError(f"{self.method!r} does not use {knob!r} (it uses: "
                                     f"{', '.join(used + ('logn',))}). Remove it.")
                continue
            set_(knob, UNITS[self.method].defaults(L)[knob] if value is None else value)
        logn = UNITS[self.method].logn if self.logn is None else self.logn
        if not isinstance(logn, bool):
            raise TypeError(f"logn must be True or False, got {logn!r}")
        if self.method == "logn" and not logn:
            raise ValueError("method 'logn' is the log-n scaling itself; logn=False leaves nothing. "
                             "Use no method (unpatch) instead.")
        set_("logn", logn)
        self._check_knobs(set_)
        if UNITS[self.method].check is not None:
            UNITS[self.method].check(self, given)

    def _check_knobs(self, set_) -> None:
        L = self.trained_length
        if self.window is not None:
            set_("window", _positive_int("window", self.window))
            if self.window > L:
                raise ValueError(f"window={self.window} exceeds the trained length {L}: relative "
                                 f"positions up to the window must have been trained. Use <= {L}.")
        if self.target_length is not None:
            set_("target_length", _positive_int("target_length", self.target_length))
            if self.target_length > min(MAX_TARGET_LENGTH, MAX_FACTOR * L):
                raise ValueError(f"target_length={self.target_length} (factor x trained length) is past "
                                 f"{min(MAX_TARGET_LENGTH, MAX_FACTOR * L)} tokens (2^31 int32 positions, "
                                 f"factor {MAX_FACTOR}); ask for a smaller factor.")
        auto = [k for k in ("leak", "group_size") if getattr(self, k) == "auto"]
        if auto and self.target_length is None:
            raise ValueError(f"{auto[0]}='auto' fits the knob to the target length: pass factor= (or "
                             f"max_position_embeddings=) to patch, or target_length= here.")
        if auto and self.target_length > L and self.window >= L - 1:
            raise ValueError(f"{auto[0]}='auto' cannot fit {self.target_length} tokens with window="
                             f"{self.window}: the window alone fills the trained length {L}. Use a "
                             f"window below {L - 1}.")
        if self.leak is not None and self.leak != "auto":
            set_("leak", plain_number(self.leak))
            if isinstance(self.leak, bool) or not isinstance(self.leak, (int, float)) \
                    or not math.isfinite(self.leak) or self.leak <= 1:
                raise ValueError(f"leak (leaky ReRoPE's k) must be a number > 1 (k = 1 is plain "
                                 f"RoPE; the authors use 16), got {self.leak!r}")
            set_("leak", float(self.leak))
        if self.group_size is not None and self.group_size != "auto":
            set_("group_size", _positive_int("group_size", self.group_size))
        if self.chunk_size is not None:
            set_("chunk_size", _positive_int("chunk_size", self.chunk_size))
            lw = self.local_window
            set_("local_window", 0 if lw == 0 and not isinstance(lw, bool) else _positive_int("local_window", lw))
            if self.chunk_size > L:
                raise ValueError(f"chunk_size={self.chunk_size} exceeds the trained length {L}; "
                                 f"the authors use 3L/4 = {3 * L // 4}.")
            if self.local_window >= self.chunk_size:
                raise ValueError(f"local_window={self.local_window} must be smaller than "
                                 f"chunk_size={self.chunk_size}; the authors use L/16 = {L // 16}.")

        if self.shifted_offset is not None:
            S = _positive_int("shifted_offset", self.shifted_offset)
            W = self.local_value
            W = 0 if W == 0 and not isinstance(W, bool) else _positive_int("local_value", W)
            set_("shifted_offset", S)
            set_("local_value", W)
            if S > L:
                raise ValueError(f"shifted_offset={S} exceeds the trained length {L}; the authors use "
                                 f"0.33·L = {int(0.33 * L)}.")
            if W > S:
                raise ValueError(f"local_value={W} must be at most shifted_offset={S} (shifted "
                                 f"distances restart at it); the authors use 128.")

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


# Every knob of an attention method: the fields but the method, L and the target T (which only
# "auto" knobs read). A unit naming a knob without a field is a bug: fail on import.
ALL_KNOBS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AttentionExtensionConfig)
                                   if f.name not in ("method", "trained_length", "target_length"))
_stray = {n: set(k) - set(ALL_KNOBS) for n, k in KNOBS.items() if set(k) - set(ALL_KNOBS)}
if _stray:
    raise RuntimeError(f"attention units use knobs AttentionExtensionConfig has no field for: {_stray}")

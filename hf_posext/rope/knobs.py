"""A method's knob, declared once in its unit (rope/units.py, attention/units.py).

A `Knob` is the single definition of what a knob is: its name, its type, its default (a constant,
or a function of the trained length L), its check (the value in, the normalised value out, or an
error naming the problem and the fix) and its help text. Everything else is derived from the
specs: the config classes' fields (`knob_fields`), their validation, the "auto" knobs, the CLI's
`--knobs` help, `evaluation.shared.grid.knob_names()` and the docs' knob tables (tests/test_units.py holds
them equal).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

from ..errors import plain_number, refuse_renamed

# The longest target s·L any method is planned for (int32 positions; no model has a longer
# cache) and the largest scale (beyond it L·s overflows or rounds to an absurd length: 1e308
# would reach `round(inf)`). attention/units.py fits its "auto" knobs under the same bounds.
MAX_TARGET_LENGTH = 2 ** 31   # positions 0 .. 2^31 - 1
MAX_FACTOR = 2 ** 20

REQUIRED = object()   # a knob with no default: the method needs it (transformers' llama3 / longrope)


@dataclass(frozen=True)
class Knob:
    """One knob. `check(value, L)` returns the normalised value or raises (L: the trained
    length, None where it is not known yet). `auto(config, L, T)`: the knob also takes "auto",
    and this function fits it to the target length T (the validated config gives the other
    knobs); None: it does not."""

    name: str
    kind: type                                  # float, int, bool, list
    default: Any                                # a constant, a function of L, or REQUIRED
    check: Callable[[Any, int | None], Any]
    help: str
    auto: Callable[[Any, int, int], Any] | None = None

    def default_at(self, L: int | None) -> Any:
        """The default at trained length L; a default that is a function of L is None while L
        is unknown (a rope config without L: the patcher fills L in and validates again)."""
        if callable(self.default):
            return None if L is None else self.default(L)
        return None if self.default is REQUIRED else self.default

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def validate(self, value: Any, L: int | None) -> Any:
        if self.auto is not None and value == "auto":
            return value
        return self.check(value, L)


def number(name: str, value: Any, *, minimum: float | None = None, strict: bool = False,
           maximum: float | None = None) -> float:
    """A finite float (numpy scalars accepted: errors.plain_number) within the bounds."""
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


def tokens(name: str, value: Any, minimum: int = 1) -> int:
    """A whole number of tokens >= minimum (1, or 0 where none is allowed)."""
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or int(value) != value or value < minimum:
        what = "a positive integer" if minimum >= 1 else "an integer >= 0"
        raise ValueError(f"{name} must be {what} (a number of tokens), got {value!r}")
    return int(value)


def _trained(value: Any, L: int | None) -> int:
    """L: an integer >= 1 (numpy integers too; not 4096.0: transformers' llama3 / longrope
    validators want an int) that is a countable position (int32)."""
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{TRAINED_LENGTH_NAME} must be a positive integer (a number of tokens), got {value!r}")
    if value > MAX_TARGET_LENGTH:
        raise ValueError(f"{TRAINED_LENGTH_NAME}={value} is past {MAX_TARGET_LENGTH:,} positions (int32): "
                         "no model is trained that long; pass the length the model was trained at.")
    return value


def _target(value: Any, L: int | None) -> int:
    """T = s·L: a whole number of tokens, at least L (extension never shortens the context) and
    within MAX_TARGET_LENGTH and MAX_FACTOR·L."""
    value = tokens(TARGET_LENGTH_NAME, value)
    if L is not None and value < L:
        raise ValueError(f"{TARGET_LENGTH_NAME}={value} is shorter than the trained length {L}; "
                         f"context extension needs a target >= {L}.")
    limit = MAX_TARGET_LENGTH if L is None else min(MAX_TARGET_LENGTH, MAX_FACTOR * L)
    if value > limit:
        raise ValueError(f"{TARGET_LENGTH_NAME}={value} (factor x trained length) is past {limit:,} "
                         f"tokens (2^31 int32 positions, factor {MAX_FACTOR:,}); ask for a smaller "
                         "factor.")
    return value


# The two lengths every method reads, declared once like the knobs: the trained
# context L and the target T = s·L. hf_posext's inputs (API, --knobs, recipe), rows and docs say
# trained_length and target_length, one name each. transformers' files keep their own keys, which
# vLLM and llama.cpp read too: a rope dict names L `original_max_position_embeddings` (NATIVE_TRAINED_KEY:
# written by `to_rope_dict`, read by `from_rope_dict`), a config names T `max_position_embeddings`.
# The native keys as inputs are refused naming ours (RENAMED: `errors.refuse_renamed`), never aliased.
TRAINED_LENGTH_NAME, TARGET_LENGTH_NAME = "trained_length", "target_length"
NATIVE_TRAINED_KEY, NATIVE_TARGET_KEY = "original_max_position_embeddings", "max_position_embeddings"
# (a knob or a rope config takes no target length: only the trained one is renamed there)
RENAMED_TRAINED = {NATIVE_TRAINED_KEY: TRAINED_LENGTH_NAME}
RENAMED = {**RENAMED_TRAINED, NATIVE_TARGET_KEY: TARGET_LENGTH_NAME}
TRAINED_LENGTH = Knob(TRAINED_LENGTH_NAME, int, lambda L: L, _trained,
                      "the trained context L (read from the model by default)")
TARGET_LENGTH = Knob(TARGET_LENGTH_NAME, int, None, _target,
                     "the target context length T = s·L (instead of factor: s = T / L)")


def _scale(value: Any, L: int | None) -> float:
    """s = target length / trained length: a finite number in [1, MAX_FACTOR]."""
    return number("factor", value, minimum=1.0, maximum=MAX_FACTOR)


# The scale every method takes, declared once like the units' knobs: RopeExtensionConfig, patch,
# the grids, the CLI's --factor and lm-eval's factor= all check it here.
FACTOR = Knob("factor", float, 1.0, _scale, "the scale s = target length / trained length (>= 1)")
AUTO = "auto"   # a grid's factor that is s = max(1, length / trained length) at each length


def factor_spec(value: Any) -> float | str:
    """A grid's factor as given in Python, on the command line or in lm-eval's model_args: "auto",
    or a scale FACTOR accepts (text such as "2" is read as a number)."""
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return AUTO
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"factor {value!r} is neither a number nor auto") from None
    return FACTOR.check(value, None)


def switch(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def positive(name: str, help: str, default: Any) -> Knob:
    """A float knob > 0."""
    return Knob(name, float, default, lambda v, L: number(name, v, minimum=0.0, strict=True), help)


def flag(name: str, help: str, default: bool = False) -> Knob:
    return Knob(name, bool, default, lambda v, L: switch(name, v), help)


def collect(groups: Iterable[Iterable[Knob]], owner: str) -> dict[str, Knob]:
    """Every knob of a wing's units, in order of first appearance. A name is one knob (a unit
    may give it its own default): two different specs under one name are a bug, refused on import."""
    out: dict[str, Knob] = {}
    for group in groups:
        for knob in group:
            first = out.setdefault(knob.name, knob)
            if dataclasses.replace(first, default=None) != dataclasses.replace(knob, default=None):
                raise RuntimeError(f"{owner}: two different knobs are named {knob.name!r}; declare "
                                   "it once and share it between the units.")
    return out


T = TypeVar("T")


def knob_fields(knobs: Iterable[Knob], before: tuple[str, ...] = (),
                renamed: dict[str, str] | None = None) -> Callable[[type[T]], type[T]]:
    """Class decorator: a frozen dataclass with one field per knob (default None = the method's
    default), inserted before the class's own fields named in `before` (the others come first).
    A keyword of `renamed` (transformers' name -> the field's) is refused naming the field, before
    the dataclass's __init__ would call it unexpected (`errors.refuse_renamed`)."""
    def wrap(cls: type[T]) -> type[T]:
        own = dict(cls.__dict__.get("__annotations__", {}))
        head = {k: v for k, v in own.items() if k not in before}
        tail = {k: own[k] for k in before}
        extra = {k.name: f"{k.kind.__name__} | None" for k in knobs if k.name not in own}
        cls.__annotations__ = {**head, **extra, **tail}
        for name in extra:
            setattr(cls, name, None)
        if renamed:
            def __new__(kind, *args: Any, **kwargs: Any):
                refuse_renamed(kind.__name__, kwargs, renamed)
                return object.__new__(kind)
            cls.__new__ = __new__  # type: ignore[method-assign,assignment]
        return dataclasses.dataclass(frozen=True)(cls)  # type: ignore[return-value]
    return wrap

"""The grid shared by perplexity and passkey: which (method, factor) cells run at each length,
with which knobs, and how a model is put into a cell's state.

Method names come from one source (`hf_posext.config.METHODS` / `canonical_method`), knob names
from another (the fields of `RopeExtensionConfig`), so a method or knob added there is accepted
here without a hand-kept list.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from ..config import METHODS, RopeExtensionConfig, canonical_method
from ..patcher import is_patched, patch, unpatch

NONE_ALIASES = ("none", "default", "original")
# Fields of RopeExtensionConfig that are not knobs: the method itself and its scale.
_NOT_KNOBS = {"method", "factor"}


def knob_names() -> tuple[str, ...]:
    """Every knob a method may take: the public fields of `RopeExtensionConfig`."""
    return tuple(f.name for f in dataclasses.fields(RopeExtensionConfig)
                 if f.init and not f.name.startswith("_") and f.name not in _NOT_KNOBS)


def canonical(name: str) -> str:
    """`none` (and its aliases) or a canonical method name; ValueError for unknown names."""
    return "none" if name.lower() in NONE_ALIASES else canonical_method(name)


def normalize_methods(methods: Iterable[str]) -> list[str]:
    """`none` first (always a row), then each method once, canonical names; `all` = METHODS."""
    out = ["none"]
    for m in methods:
        for name in (METHODS if m.lower() == "all" else [canonical(m)]):
            if name not in out:
                out.append(name)
    return out


def check_knobs(methods: Sequence[str], knobs: Mapping[str, Mapping[str, float]]) -> None:
    """`knobs` maps a method name (or "*" for every extended method of the grid) to its knobs.
    Each (method, knobs) pair is validated by `RopeExtensionConfig` itself, before any model
    loads; a knob for a method not in the grid, or one it does not use, is an error."""
    grid = [m for m in normalize_methods(methods) if m != "none"]
    known = knob_names()
    for target, values in knobs.items():
        for name in values:
            if name not in known:
                raise ValueError(f"unknown knob {name!r}; knobs are {', '.join(known)}.")
        if target != "*" and canonical(target) not in grid:
            raise ValueError(f"knobs for {target!r}, which is not among the methods run "
                             f"({', '.join(grid) or 'none'}).")
    for method in grid:
        try:
            RopeExtensionConfig(method, 2.0, **knobs_for(method, knobs))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{method}: {err}") from None


def knobs_for(method: str, knobs: Mapping[str, Mapping[str, float]]) -> dict:
    """The knobs `method` runs with: those given for every method, then its own."""
    if method == "none":
        return {}
    own = [dict(v) for k, v in knobs.items() if k != "*" and canonical(k) == method]
    return {**knobs.get("*", {}), **(own[0] if own else {})}


def resolve_factor(spec, length: int, trained: int) -> float:
    """`auto` -> s = max(1, length / trained); a number stays itself."""
    if spec == "auto":
        return max(1.0, length / trained)
    return float(spec)


def method_factors(methods, factors, length: int, trained: int) -> list[tuple[str, str, float]]:
    """(method, factor as given, resolved scale s) to run at `length`: `none` once at s = 1,
    every other method once per distinct s (two specs resolving to the same s run once)."""
    out = []
    for method in normalize_methods(methods):
        specs = ["1"] if method == "none" else [str(f) for f in factors]
        seen = set()
        for spec in specs:
            s = 1.0 if method == "none" else resolve_factor(spec if spec == "auto" else float(spec),
                                                            length, trained)
            if s not in seen:
                seen.add(s)
                out.append((method, spec, s))
    return out


@dataclass
class Cell:
    """One (method, factor, length) point of a grid, plus what its protocol needs."""
    method: str
    factor_spec: str       # "auto" or the number as given
    factor: float
    length: int
    protocol: str
    knobs: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)   # protocol settings: window, stride, depth, ...

    @property
    def label(self) -> str:
        return f"{self.protocol} {self.method} s={self.factor:g} L={self.length}"


def apply_method(model, method: str, factor: float, knobs: Mapping | None = None) -> None:
    """Put the model in a cell's state: unpatched for `none`, else patched (replacing)."""
    if method == "none":
        if is_patched(model):
            unpatch(model)
    else:
        patch(model, method, factor, **dict(knobs or {}))

"""The two typed inputs of a perplexity evaluation (as a PEFT config: validated dataclasses).

- `PerplexityGrid`: *what* is measured — methods, lengths, factors, protocols, knobs, the
  sliding-window baseline. Its `cells(trained)` are the grid's cells.
- `RunInfo`: *whose* run it is — model name and fingerprint, dataset and its hash, dtype,
  device, constant columns; recorded in every row and in its resume key.

`evaluate_perplexity(model, docs, grid, run=run)` takes them (and `evaluate_passkey` /
`evaluate_retrieval` a `RetrievalGrid` and a `RunInfo`): one calling convention, a grid field
passed as a keyword is a TypeError naming the object to build (`settings_only`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar, cast

from .grid import Cell, knobs_for, method_factors

PROTOCOLS = ("truncate", "sliding")
DEFAULT_STRIDE = 256  # the papers' sliding-window stride
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class PerplexityGrid:
    """Cells of a perplexity grid.

    `methods`: names from hf_posext.METHODS; `none` (unpatched) is always added. None: run the
        model exactly as given (e.g. just fine-tuned), rows labelled `label`.
    lengths: context lengths in tokens. factors: numbers >= 1 and/or "auto" (s = max(1,
        length / trained length)). protocols: "truncate" and/or "sliding".
    stride, eval_tokens: the sliding protocol's stride and the tokens it covers (default
        max(lengths)). chunk_size: positions per LM-head chunk.
    knobs: {"*" or method: {knob: value}} (see `grid.check_knobs`).
    skip: (method, length, s) cells left out (`inputs.check_cells`: a method that cannot keep that
        length inside the trained length, under `--methods all`).
    baseline: with `methods`, add the unpatched sliding-window baseline at truncate lengths
        above `baseline_window` (default the trained length), stride `baseline_stride`.
    """

    methods: Sequence[str] | None
    lengths: Sequence[int]
    factors: Sequence = ("auto",)
    protocols: Sequence[str] = ("truncate",)
    stride: int = DEFAULT_STRIDE
    eval_tokens: int | None = None
    chunk_size: int = 1024
    knobs: dict | None = None
    baseline: bool = True
    baseline_window: int | None = None
    baseline_stride: int | None = None
    label: str | None = None
    skip: Sequence[tuple[str, int, float]] = ()

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("lengths is empty: give at least one context length.")
        for p in self.protocols:
            if p not in PROTOCOLS:
                raise ValueError(f"Unknown protocol {p!r}; use one of {', '.join(PROTOCOLS)}.")
        if not self.protocols:
            raise ValueError("protocols is empty; use truncate and/or sliding.")

    @property
    def tokens(self) -> int:
        """Tokens the sliding protocol covers (default: the longest length)."""
        return self.eval_tokens or max(self.lengths)

    def tokens_needed(self) -> int:
        """Tokens every document must have."""
        return max(max(self.lengths) if "truncate" in self.protocols else 0,
                   self.tokens if "sliding" in self.protocols else 0)

    def cells(self, trained: int) -> list[Cell]:
        """Cells in run order: by protocol, then length (short first), then method (`none`
        first). With a baseline, the truncate protocol gains at each length above the baseline
        window a `baseline` cell: the unpatched model over the same tokens with a sliding window
        of that size and `baseline_stride` (default a quarter window: 2,048 for 8k),
        docs/evaluation.md, "The sliding-window baseline"."""
        if self.methods is None:
            grid = dataclasses.replace(self, methods=["none"], factors=[1.0], knobs=None, baseline=False)
            return [dataclasses.replace(c, method=self.label or "model", as_is=True)
                    for c in grid.cells(trained)]
        window = (self.baseline_window or trained) if self.baseline else None
        cells = []
        for protocol in self.protocols:
            extra = {"chunk_size": self.chunk_size}
            if protocol == "sliding":
                extra.update(stride=self.stride, eval_tokens=self.tokens)
            for length in sorted(set(self.lengths)):
                cells += [Cell(m, spec, s, length, protocol, knobs_for(m, self.knobs or {}),
                               {"window": length, **extra})
                          for m, spec, s in method_factors(self.methods, self.factors, length, trained)
                          if (m, length, s) not in set(self.skip)]
                if protocol == "truncate" and window and length > window:
                    cells.append(Cell("none", "1", 1.0, length, "baseline", {},
                                      {"window": window, "chunk_size": self.chunk_size,
                                       "stride": self.baseline_stride or max(1, window // 4),
                                       "eval_tokens": length}))
        return cells


@dataclass(frozen=True)
class RunInfo:
    """What identifies a run, beyond the model's own content (`identity.run_identity`).

    fingerprint: the model's content hash (default: hashed from its weights). data_hash: of
    the token ids (default: hashed here). dtype: if given, must match the model's (a check).
    extra_columns: constant columns of every row (e.g. the recipe's step)."""

    model_name: str = "model"
    dataset: str = ""
    data_hash: str | None = None
    dtype: str | None = None
    device: str = "cpu"
    fingerprint: str | None = None
    extra_columns: dict = field(default_factory=dict)


def settings_only(grid_type: type) -> Callable[[F], F]:
    """`fn` takes its settings as typed objects only (a `grid_type` and a `RunInfo`): a call
    passing their fields as keywords (the removed shorthand, `methods=..., lengths=...`) fails
    with a TypeError naming the objects to build, before any work."""
    grid_fields = {f.name for f in dataclasses.fields(grid_type)}
    run_fields = {f.name for f in dataclasses.fields(RunInfo)}

    def wrap(fn: F) -> F:
        params = inspect.signature(fn).parameters
        leading = ", ".join(list(params)[:list(params).index("grid")])

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            stray = [k for k in kwargs if k not in params and k in grid_fields | run_fields]
            if stray:
                parts = [f"{', '.join(ks)} {'belongs' if len(ks) == 1 else 'belong'} in {t}(...)" for t, ks in
                         ((grid_type.__name__, [k for k in stray if k in grid_fields]),
                          ("RunInfo", [k for k in stray if k not in grid_fields])) if ks]
                raise TypeError(f"{fn.__name__}() has no keyword {', '.join(stray)}: "
                                f"{'; '.join(parts)}, called as {fn.__name__}({leading}, "
                                f"{grid_type.__name__}(...), run=RunInfo(...)).")
            return fn(*args, **kwargs)
        return cast(F, checked)
    return wrap

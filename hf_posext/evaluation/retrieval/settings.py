"""`RetrievalGrid`: what a retrieval evaluation measures (validated, as `PerplexityGrid`).

    from hf_posext.evaluation import RetrievalGrid, RunInfo, evaluate_retrieval
    grid = RetrievalGrid(["yarn"], [8192, 16384], tasks=["single_needle", "multi_key"])
    rows = evaluate_retrieval(model, tokenizer, grid, run=RunInfo(model_name="smollm2"))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ...errors import check_seed
from ..shared.grid import Cell, knobs_for, method_factors
from ..shared.record import BASELINE
from .blocks import seeds_text
from .haystack import NOISE_NAME
from .tasks import get_task

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_TRIALS = 20
DEFAULT_MARGIN = 0.10


@dataclass(frozen=True)
class RetrievalGrid:
    """Cells of a retrieval grid: every (task, length, method, factor, depth) runs `trials`
    seeded trials (seeds seed .. seed + trials - 1, or the explicit `seeds`).

    methods, lengths, factors, knobs: as `PerplexityGrid` (`none` always runs).
    depths: where the queried needle sits, fractions of the haystack in [0, 1].
    haystack: "noise" (RULER's repeated sentences) or a document source (`--dataset`).
    reuse_prefix: prefill the prompt up to the depth once per cell (False: one full prefill per
        trial, the benchmark's comparison). margin: the effective length's tolerance
        (`stats.effective_length`).
    skip: (method, length, s) cells left out (`inputs.check_cells`, as `PerplexityGrid.skip`).
    layout_seeds: the seeds whose prompts fix each cell's layout (`prompt.py`), a superset of the
        trial seeds: a sequential look's block is laid out as the whole series (rows and keys
        gain `layout_seeds`, so they never resume rows laid out otherwise). None: the trials'.
    baseline: add the sliding-window baseline at each length past the trained one: method
        `baseline`, the unpatched model asked the same prompts cut to its trained window (the
        task's head kept, the haystack cut from the left: `CellPrompts.window`); its rows carry
        `window`. What an extension has to beat: it finds a needle only inside the window.
    """

    methods: Sequence[str]
    lengths: Sequence[int]
    depths: Sequence[float] = DEPTHS
    tasks: Sequence[str] = ("single_needle",)
    trials: int = DEFAULT_TRIALS
    seed: int = 0
    seeds: Sequence[int] | None = None
    factors: Sequence = ("auto",)
    knobs: dict | None = None
    haystack: str = NOISE_NAME
    reuse_prefix: bool = True
    margin: float = DEFAULT_MARGIN
    skip: Sequence[tuple[str, int, float]] = ()
    layout_seeds: Sequence[int] | None = None
    baseline: bool = False

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("lengths is empty: give at least one context length.")
        if not self.depths:
            raise ValueError("depths is empty: give at least one depth in [0, 1].")
        for d in self.depths:
            if not 0.0 <= float(d) <= 1.0:
                raise ValueError(f"depth {d} is outside [0, 1]; a depth is a fraction of the "
                                 "haystack (0 = start, 1 = end).")
        if not self.tasks:
            raise ValueError("tasks is empty: give at least one task.")
        for t in self.tasks:
            get_task(t)
        check_seed("seed", self.seed)
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ValueError(f"trials must be an integer >= 1, got {self.trials!r}.")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds {list(self.seeds)} repeat a seed; each seed must count once.")
        if self.seeds is not None and not self.seeds:
            raise ValueError("seeds is empty.")
        if self.layout_seeds is not None and not set(self.trial_seeds()) <= set(self.layout_seeds):
            raise ValueError(f"layout_seeds must include every trial seed; missing "
                             f"{sorted(set(self.trial_seeds()) - set(self.layout_seeds))}.")
        if not (0.0 <= self.margin < 1.0 and math.isfinite(self.margin)):
            raise ValueError(f"margin must be in [0, 1), got {self.margin}.")

    def trial_seeds(self) -> list[int]:
        return list(self.seeds) if self.seeds is not None else list(range(self.seed, self.seed + self.trials))

    def cells(self, trained: int) -> list[Cell]:
        """Cells in run order: by length (short first), task, method (the baseline first, its
        prompts being the shortest; then `none`), depth."""
        seeds = self.trial_seeds()
        layout = {} if self.layout_seeds is None else {"layout_seeds": seeds_text(list(self.layout_seeds))}

        def methods(length: int) -> list[tuple[str, str, float]]:
            runs = [(m, spec, s) for m, spec, s in method_factors(self.methods, self.factors, length, trained)
                    if (m, length, s) not in set(self.skip)]
            return ([(BASELINE, "1", 1.0)] if self.baseline and length > trained else []) + runs

        return [Cell(method, spec, s, length, "retrieval", knobs_for(method, self.knobs or {}),
                     {"task": task, "haystack": self.haystack, "depth": float(d),
                      "trials": len(seeds), "seeds_list": seeds_text(seeds), **layout,
                      **({"window": trained} if method == BASELINE else {})})
                for length in sorted(set(self.lengths)) for task in self.tasks
                for method, spec, s in methods(length)
                for d in sorted(set(map(float, self.depths)))]

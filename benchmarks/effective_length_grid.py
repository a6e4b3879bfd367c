"""Each method's effective length in each haystack (results/effective_length_4x.md), read from the
same counts as the effective-length table (effective_length_table.py's `Count`), RULER's relative
way, as `hf-posext retrieval` reads it (hf_posext.evaluation.retrieval.stats.effective_length):

    bar              = the unpatched model's accuracy within L (8k) on the task, five depths, less 0.1
    effective length = the longest length of the grid L, 2L (, 4L for a factor-4 setting) at which
                       the method's accuracy over five depths is >= bar, every shorter one too

for niah_single and multi_key, each where its reference ran in the haystack.

A grid length with no five-depth cell (not run, or stopped part-way) leaves the reading open from
there: a 32k cell that clears the bar says nothing about 16k (a rope scale changes the positions
inside L as well). Only float32 cells count, the dtype every reference ran in. The fixed target of
the 4x work stands beside it (niah_single 0.9 with a lower Wilson bound of 0.7 at 4L; multi_key 0.8,
for the fine-tuned recipe)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from effective_length_table import METHODS, Count

GRID_DEPTHS = frozenset({0.0, 0.25, 0.5, 0.75, 1.0})   # a cell counts when it holds all five
DTYPE = "float32"
# task -> the fixed target at 4L: accuracy, and the lower Wilson bound it needs (niah_single only)
TARGETS = {"niah_single": (0.9, 0.7), "multi_key": (0.8, None)}


@dataclass(frozen=True)
class Setting:
    """A row of the reading: a method, training-free or its fine-tuned recipe, at one rope factor."""
    method: str
    tuned: bool
    factor: int

    def name(self) -> str:
        return (f"{METHODS[self.method]}{' s = ' + str(self.factor) if self.method == 'yarn' and not self.tuned else ''}, "
                + (f"the {self.factor}x recipe (fine-tuned)" if self.tuned else "training-free"))


def setting_of(c: Count) -> Setting:
    """A count's setting: a training-free method's rope factor; a checkpoint's (its rows ask it with
    no method, factor 1) is the factor the caller stored, else the one its cells' length implies."""
    factor = int(c.factor) if c.factor > 1 else c.length // c.trained
    return Setting(c.method, c.tuned, factor)


def pooled(group: Sequence[Count]) -> tuple[int, int]:
    """(correct, trials) summed over counts."""
    return sum(c.k for c in group), sum(c.n for c in group)


def depths_of(group: Sequence[Count]) -> set[float]:
    return set().union(set(), *(c.depths for c in group))


def whole(group: Sequence[Count]) -> bool:
    return depths_of(group) >= GRID_DEPTHS


def cell_text(group: Sequence[Count]) -> str:
    from hf_posext.evaluation.retrieval.stats import rate_text
    if not group:
        return "not run"
    depths = depths_of(group)
    return rate_text(*pooled(group)) + ("" if whole(group) else f" ({len(depths)} of {len(GRID_DEPTHS)} depths)")


def reading(cells: dict[int, list[Count]], grid: Sequence[int], reference: Sequence[Count], trained: int,
            margin: float) -> str:
    """The effective length over the grid, in words: open from the first grid length without a
    whole (five-depth) cell, though a whole cell past it that misses the bar still caps it."""
    from hf_posext.evaluation.retrieval.stats import clears, effective_length
    done = []                    # the grid's lengths up to the first one without a whole cell
    for length in grid:
        if not whole(cells.get(length, [])):
            break
        done.append(length)
    rows = [{"length": n, "correct": c.k, "trials": c.n} for n in done for c in cells[n]]
    ref = [{"length": c.length, "correct": c.k, "trials": c.n} for c in reference]
    best, accuracy = effective_length(rows, ref, trained, margin)
    cap = next((n for n in grid if n not in done and whole(cells.get(n, []))
                and not clears(*pooled(cells[n]), accuracy, margin)), None)
    missing = next((n for n in grid if n not in done), None)
    open_text = f"open: no five-depth cell at {missing // 1024}k" if missing else ""
    cap_text = f"below {cap // 1024}k ({cap // 1024}k misses the bar)" if cap else ""
    if not done:
        return "; ".join(t for t in (cap_text, open_text) if t)
    if best is None:
        return f"below {done[0] // 1024}k ({done[0] // 1024}k misses the bar)"
    text = f"{best // 1024}k ({best // trained}x)"
    if best != done[-1]:
        return f"{text}; {done[done.index(best) + 1] // 1024}k misses the bar"
    return "; ".join(t for t in (f"at least {text}" if missing else text, open_text, cap_text) if t)


def grid_lines(counts: Sequence[Count], haystacks: Sequence[str], margin: float) -> list[str]:
    """The section: one row per (haystack, task, setting) with a cell of the grid beyond L, where the
    haystack has the task's reference."""
    from hf_posext.evaluation.retrieval.stats import target_verdict
    # the shipped recipe and training-free methods (an arm tried beside the recipe carries a note),
    # on the five-depth grid or part of it (code's 2x rows ran other depths: not this grid)
    mine = [c for c in counts if c.task in TARGETS and c.dtype == DTYPE and c.haystack in haystacks
            and not c.note and c.depths <= GRID_DEPTHS]
    lines = ["## Effective length by haystack", "",
             "Each task pooled over five depths (float32; a recipe's seeds pooled) at L, 2L and 4L; the bar is the "
             f"unpatched model's accuracy within L in that haystack less {margin:g}, as `hf-posext retrieval` reads a method's "
             "effective length (RULER's relative reading: a fixed target says nothing of a model below it in its own window); "
             "the effective length is the longest length whose cell, and every shorter one, clears the bar. A length not run "
             "leaves it open. The fixed targets at 4L beside it: niah_single 0.9 with a lower Wilson bound of 0.7, multi_key "
             "0.8 (the fine-tuned recipe's). Made by `python benchmarks/effective_length_4x.py report` from the same rows as "
             "the tables above (benchmarks/effective_length_grid.py).", "",
             "| haystack | task | setting | bar (within L) | 8k | 16k | 32k | effective length | fixed target at 4L |",
             "|---|---|---|---|---|---|---|---|---|"]
    for haystack in haystacks:
        for task, (accuracy, low) in TARGETS.items():
            here = [c for c in mine if c.haystack == haystack and c.task == task]
            reference = [c for c in here if c.method == "none" and not c.tuned and c.length <= c.trained and whole([c])]
            if not reference:
                continue
            trained = reference[0].trained
            k, n = pooled(reference)
            bar = f"{k / n - margin:.2f} ({k}/{n} - {margin:g})"
            # the references past L (the unpatched model, its sliding window) are read in the table above:
            # what a method's cells are read against, not a setting with an effective length of its own
            settings = dict.fromkeys(setting_of(c) for c in here
                                     if c.method not in ("none", "baseline") and c.length > c.trained)
            for s in sorted(settings, key=lambda s: (s.factor, s.tuned, list(METHODS).index(s.method))):
                grid = [trained * 2 ** i for i in range(s.factor.bit_length()) if 2 ** i <= s.factor]
                cells: dict[int, list[Count]] = {}
                for c in here:
                    if setting_of(c) == s:
                        cells.setdefault(c.length, []).append(c)
                shown = [cell_text(cells.get(n, [])) if n in grid else "" for n in (trained, 2 * trained, 4 * trained)]
                top = cells.get(grid[-1], [])
                aimed = s.factor == 4 and whole(top) and (task == "niah_single" or s.tuned)
                fixed = target_verdict(*pooled(top), accuracy, low) if aimed else ""
                lines.append(f"| {haystack} | {task} | {s.name()} | {bar} | " + " | ".join(shown)
                             + f" | {reading(cells, grid, reference, trained, margin)} | {fixed} |")
    return lines + ["", ""] if len(lines) > 6 else []   # no reference or no setting: no table at all

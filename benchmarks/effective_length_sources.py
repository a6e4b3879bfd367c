"""The effective-length table's sources (benchmarks/effective_length_table.py writes it): the rows
other scripts stored, each read by what the script that wrote it stores, into the table's `Count`
and `Ratio` records; `build` adds the 4x script's own counts (effective_length_4x.py's `report`
reads its folders and passes them in, so this module does not import it back: no import circle).

    retrieval-2x/          YaRN s = 2 and the unpatched model at 8k and 16k (retrieval_report.py's commands)
    side-by-side/          retrieval at 16k (bfloat16) and Hamlet perplexity at 16k and 32k (side_by_side.py)
    finetune-retrieval*/   the shipped 2x retrieval recipe's seeds, pooled (finetune_retrieval.py)
    retrieval-code-mix/    YaRN s = 2 and the 2x recipe's arms in held-out code (code_mix.py's runs.json)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from effective_length_table import (CODE_LABEL, METHODS, ROOT, TASKS, Count, Ratio, counts, merged, own_window, rel,
                                    section, text_of)

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
# The 2x recipe's setting before its default moved (1k-token windows, a quarter synthetic, whole
# examples, 200 steps) as the recipe's flags that restate it: benchmarks/code_mix.py trains its arms
# with them, and its seeds are listed apart from the recipe's row under this name.
PREVIOUS_2X_FLAGS = ("--training.seq_len", "1024", "--training.max_steps", "200", "--training.save_every", "50",
                     "--data.synthetic.share", "0.25", "--data.synthetic.window", "null")
PREVIOUS_2X_NAME = "1k-token windows, a quarter synthetic, 200 steps (the default before)"


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
    the unpatched model's sliding 8k window, read by side_by_side_report's own readers; the
    searched `longrope` configs' likewise, from their own folders."""
    import side_by_side as sbs
    from side_by_side_report import Search, Setup, eval_cells, read_eval
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
    # a searched config's checkpoint is asked with no method (its rows say `none`): its own folders
    for objective in sbs.OBJECTIVES:
        found += counts(merged(out / f"retrieval-{sbs.SIZE}-search-{objective}" / "retrieval.json"), labels,
                        "side-by-side", (step + "retrieval",), method=f"searched-{objective}")
    ratios = []
    for target, name in ((sbs.TARGET, "eval"), (sbs.TARGET4, "eval32")):
        res = sbs.Results(results)
        setup = Setup(tune=sbs.TUNE, held_out=sbs.HELD_OUT, target=target, knobs=res.knobs(target), tasks="",
                      depths="", dpe_file=res.dpe_file(target).name, commands="",
                      searches=tuple(Search(o, res.search_dir(o, target), 0) for o in sbs.OBJECTIVES))
        ev = read_eval(out, setup)
        for line in setup.lines():
            row = ev.rows.get(line.label)
            method = "searched-" + line.eval_dir.rpartition("-search-")[2] if line.searched else line.method
            if method not in METHODS or row is None:
                continue
            _, past, whole = eval_cells(ev, line.label)
            if not whole[0].isdigit():   # no baseline yet, or refused: the cell stays "not run"
                continue
            ratios.append(Ratio(method, False, target, int(row["trained_length"]),
                                f"{whole}x ({text_of(row, labels)}, {setup.size}, {row['dtype']}; "
                                f"past L {past}x)", float(row["seconds"]), (step + name,)))
    return found, ratios


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


def build(results: Path, labels: dict[str, str], four_x: Sequence[Count],
          four_x_ppl: Sequence[Ratio]) -> tuple[list[str], list[Count]]:
    """The section, and every count it read: effective_length_4x.py's (passed in) and this module's, under `results`."""
    sbs_counts, sbs_ratios = side_by_side(results, labels)
    tuned_counts, tuned_ratios = finetuned_2x(results, labels)
    found = [*retrieval_2x(results, labels), *sbs_counts, *tuned_counts, *code_mix_runs(results, labels), *four_x]
    return section(found, [*sbs_ratios, *tuned_ratios, *four_x_ppl]), found

"""Effective length at 4x: RULER's single needle (`niah_single`, RULER's wording)
at 32k on the embedded SmolLM2-135M (trained at 8,192), training-free: YaRN s = 4, DPE with its
committed 32k detection (results/dpe/dpe-32k-bf16.json), Self-Extend and the searched `longrope`
configs (needle and perplexity objectives) as the side-by-side runs them; fine-tuned: the 4x retrieval recipe's checkpoint (recipes/cpu-smollm2-retrieval-4x.yaml,
asked with `--methods none`: its saved config carries YaRN s = 4); in three haystacks no method or recipe was tuned on: RULER's noise, a held-out play (Hamlet: neither the searches nor the
recipe's training saw it) and source code (torch's `_refs/__init__.py`, fixed by the torch pin).
Five depths: YaRN, DPE and Self-Extend (its fitted knobs, and LongLM's) in sequential looks of 4 needles a depth (Self-Extend 2) up to 20,
each cell decided against a fixed bar of 0.7 (the target's lower Wilson bound) within a wall-time budget;
the searched configs, the fine-tuned arms and the references past L (the unpatched model, and the
sliding-window baseline: each prompt cut to the trained 8k) on a fixed grid of 2 needles a depth; and, in each haystack, the
unpatched model within L (8k) as the reference a method's accuracy is read against.

    python benchmarks/effective_length_4x.py run noise       # then hamlet, code (each resumable)
    python benchmarks/effective_length_4x.py run noise --method dpe
    python benchmarks/effective_length_4x.py run noise --method self_extend   # looks of two needles a depth
    python benchmarks/effective_length_4x.py run noise --method self_extend-longlm   # with LongLM's knobs
    python benchmarks/effective_length_4x.py run noise --method searched-needle   # two needles a depth
    python benchmarks/effective_length_4x.py run noise --method baseline   # the unpatched model and the sliding 8k window
    python benchmarks/effective_length_4x.py run noise --method finetuned   # after training the 4x recipe
    python benchmarks/effective_length_4x.py run noise --method finetuned --length 16k   # and 8k: the grid below 4L
    python benchmarks/effective_length_4x.py run noise --method finetuned --task multi_key --seed 1
    python benchmarks/effective_length_4x.py run noise --method finetuned-distractors --task multi_key
    python benchmarks/effective_length_4x.py perplexity      # the fine-tuned checkpoint past L, Hamlet
    python benchmarks/effective_length_4x.py perplexity --method finetuned-documents   # the control, below
    python benchmarks/effective_length_4x.py perplexity --method self_extend-longlm   # against the unpatched window
    python benchmarks/effective_length_4x.py reference code  # the unpatched model at 8k, in code (or hamlet, noise)
    python benchmarks/effective_length_4x.py reference noise --task multi_key   # what multi_key's cells read against
    python benchmarks/effective_length_4x.py report          # -> results/effective_length_4x.md
    python benchmarks/effective_length_4x.py table           # its effective-length table only, printed

The fine-tuned arms (effective_length_4x_arms.py: the recipe and the settings it was chosen among)
each train with the recipe's command plus the arm's flags into the arm's own folder; `run` or `perplexity` with
`--method ARM` (and `--seed N`) prints that command when the checkpoint is missing, e.g.
    accelerate launch --cpu --num_processes 1 recipes/finetune.py --config recipes/cpu-smollm2-retrieval-4x.yaml \
        --data.synthetic.window null --output_dir runs/cpu-smollm2-retrieval-4x-4k-examples

Each step is one `hf-posext retrieval` command (printed); a rerun resumes the stored looks. `--budget 3h`
gives a sequential run more time than the haystack's default (a 32k DPE cell of four trials: ~1 h on 2 busy cores).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from effective_length_4x_arms import FINETUNED, arm_name, arm_of, finetuned, train_command
from effective_length_4x_runs import (BASELINE, BUDGET, BUDGET_16K, DEPTHS, FAR, HERE, KNOBS, LABELS, LENGTHS, OUT, PAGE, SEARCHED,
                                      VARIANTS, asks_checkpoint, cli, dataset, folder_seed, perplexity_argv, perplexity_folder, reference_argv,
                                      reference_folder, run_argv, run_folder, searched, searched_config,
                                      row_of_folder, seeds_trained, sequential, shown, steps)
from effective_length_grid import TARGETS
from effective_length_table import METHODS


def question_rows(folder: Path) -> dict[tuple, list[dict]]:
    """(method, task, length) -> its cells, each cell's looks pooled (merge_blocks), depth order; in a
    training-free method's run within L, not the unpatched model's cells asked beside it (the same
    needles as the haystack's reference: counted once, there). Past L the unpatched model is asked
    in the references' run (`--method baseline`) only."""
    from hf_posext.evaluation import read_rows
    from hf_posext.evaluation.retrieval.blocks import merge_blocks
    out: dict[tuple, list[dict]] = {}
    if not (folder / "retrieval.json").exists():
        return out
    beside = "-reference" not in folder.name and not asks_checkpoint(folder)
    for r in sorted(merge_blocks(read_rows(folder / "retrieval.json")), key=lambda r: float(r["depth"])):
        if not (beside and r["method"] == "none" and int(r["length"]) <= 8192):
            out.setdefault((r["method"], r["task"], int(r["length"])), []).append(r)
    return out


def latest_decision(folder: Path, method: str, task: str, length: int) -> tuple[str, str]:
    """The question's decision after its last stored look, with its bounds."""
    from hf_posext.evaluation import read_rows
    rows = [r for r in read_rows(folder / "retrieval.json")
            if r["method"] == method and r["task"] == task and int(r["length"]) == length]
    last = max(rows, key=lambda r: int(r.get("look") or 0))
    if last.get("look") is None:   # a fixed grid (the fine-tuned arm): nothing sequential to call
        return "fixed grid", ""
    if last.get("decision") is None:
        return "—", ""
    return str(last["decision"]), f"[{last['decision_low']:.2f}, {last['decision_high']:.2f}] vs {last['bar']}"


def line(label: str, method: str, task: str, length: int, cells: list[dict], folder: Path) -> str:
    """One table row; a row of a fine-tuned folder is named by its recipe and seed (its method is none)."""
    from hf_posext.evaluation.retrieval.settings import DEFAULT_MARGIN
    from hf_posext.evaluation.retrieval.stats import target_verdict, wilson
    k, n = sum(int(r["correct"]) for r in cells), sum(int(r["trials"]) for r in cells)
    low, high = wilson(k, n)
    depths = " · ".join(f"{float(r['depth']):g}: {r['correct']}/{r['trials']}" for r in cells)
    decision, bounds = latest_decision(folder, method, task, length)
    if method == "none" and length <= 8192 and not asks_checkpoint(folder):   # the reference: its accuracy less the margin is the bar
        decision, bounds = "reference:", f"bar {k / n - DEFAULT_MARGIN:.2f}"
    met = target_verdict(k, n, *TARGETS[task])
    if method in ("none", BASELINE) and length > 8192 and not asks_checkpoint(folder):
        met = "(a reference past L)"   # what a method's cells are read against, not a method aiming at the target
    wanted = len(DEPTHS.split(","))
    if length > 8192 and len(cells) < wanted:   # a run stopped inside its first look: no verdict yet
        met = f"open: {len(cells)} of {wanted} depths ran"
    minutes = sum(float(r["seconds"]) for r in cells) / 60
    seed, arm = folder_seed(folder), arm_of(folder)
    config = row_of_folder(folder)
    name = (arm_name(arm, seed) if arm else METHODS[config] if config else
            "unpatched" if method == "none" else f"{method} s = {float(cells[0]['factor']):g}" if method == "yarn"
            else METHODS[method] if method == BASELINE else method)
    return (f"| {label} | {name} | {task} | {length // 1024}k | {k}/{n} = {k / n:.2f} [{low:.2f}, {high:.2f}] | "
            f"{depths} | {decision} {bounds} | {met if length == 32768 else '(within L)' if length <= 8192 else '(below 4L: read in the grid)'} | {minutes:.0f} min |")


def perplexity_pairs(out: Path = OUT, arm: str = "finetuned") -> list[tuple[int, dict, dict]]:
    """(seed, truncate row, baseline row) at 32k of each of the arm's checkpoints whose perplexity
    step has stored both: the whole prompt and its own sliding 8k window over the same tokens."""
    from hf_posext.evaluation import read_rows
    pairs = []
    for seed in seeds_trained(arm, out):
        path = out / perplexity_folder(seed, arm).name / "perplexity.json"
        rows = {r["protocol"]: r for r in (read_rows(path) if path.exists() else []) if int(r["length"]) == 32768}
        if {"truncate", "baseline"} <= set(rows):
            pairs.append((seed, rows["truncate"], rows["baseline"]))
    return pairs


def variant_ratio(variant: str, out: Path, labels: dict[str, str]):
    """A variant's perplexity cell (`perplexity --method VARIANT`): its whole 32k prompt against the
    unpatched model's sliding 8k window over the same tokens, and on positions past L, as
    exp(mean NLL difference), the side-by-side's reading; None before both rows are stored."""
    import math

    from effective_length_table import Ratio, text_of

    from hf_posext.evaluation import read_rows
    from hf_posext.training.arms_report import mean_nll
    path = out / perplexity_folder(0, variant).name / "perplexity.json"
    rows = {r["protocol"]: r for r in (read_rows(path) if path.exists() else []) if int(r["length"]) == 32768}
    if not {"truncate", "baseline"} <= set(rows):
        return None
    t, b = rows["truncate"], rows["baseline"]
    trained = int(t["trained_length"])
    whole, past = (math.exp(mean_nll(t, start) - mean_nll(b, start)) for start in (0, trained))
    return Ratio(variant, False, 32768, trained, f"{whole:.4f}x ({text_of(t, labels)}, 32k, {t['dtype']}; past L {past:.4f}x)",
                 float(t["seconds"]) + float(b["seconds"]), (shown(perplexity_argv(0, variant)),))


def perplexity_lines() -> tuple[list[str], list[str]]:
    """The fine-tuned checkpoints at 32k on held-out Hamlet: perplexity of the whole prompt, of its
    own sliding 8k window, and the mean NLL on positions past L (8,192) of the one less the other."""
    from hf_posext.training.arms_report import mean_nll
    lines, commands = [], []
    for arm in FINETUNED:
        for seed, truncate, baseline in perplexity_pairs(arm=arm):
            trained = int(truncate["trained_length"])
            past = mean_nll(truncate, trained) - mean_nll(baseline, trained)
            minutes = (float(truncate["seconds"]) + float(baseline["seconds"])) / 60
            lines.append(f"| {arm_name(arm, seed)} | {truncate['perplexity']:.3f} | "
                         f"{baseline['perplexity']:.3f} | {past:+.3f} | "
                         f"{'met' if past <= 0.05 else f'missed by {past - 0.05:.3f}'} | {minutes:.0f} min |")
            commands.append(shown(perplexity_argv(seed, arm)))
    return lines, commands


def table_lines(results: Path) -> list[str]:
    """The effective-length table (effective_length_table.py): this script's folders under
    results/effective-length-4x read here, with their commands; the 2x sources read there."""
    from effective_length_grid import grid_lines
    from effective_length_sources import build
    from effective_length_table import counts, own_window

    from hf_posext.evaluation.retrieval.settings import DEFAULT_MARGIN
    out, asked = results / OUT.name, len(DEPTHS.split(","))
    # the other sources' haystacks by name; this script's own by folder (the code haystack's rows
    # store the file's path on the machine that ran them, not a name)
    labels = {dataset(h): LABELS[h] for h in ("noise", "hamlet")}
    # the table's: the 32k cells (its 4x rows) and the unpatched references within L; the grid's only:
    # every other cell below 4L (a 4x setting's 8k and 16k are not the 2x setting's row)
    found, shorter = [], []
    for haystack, label in LABELS.items():
        # a method's own run within L asks the needles a reference run asked it beside the unpatched
        # model (code's first run: YaRN s = 4 at 8k, two depths): counted once, in its own run
        own_within = {m for m in KNOBS if question_rows(out / run_folder(haystack, m, length=LENGTHS[0]).name)}
        for _, folder, argv in steps(haystack, out):
            arm, seed, config = arm_of(folder), folder_seed(folder), row_of_folder(folder)
            rows = [{**r, **({"training_seed": seed} if arm else {})}
                    for cells in question_rows(out / folder.name).values() for r in cells
                    if not ("-reference" in folder.name and r["method"] in own_within)]
            found_here = counts(rows, {r["haystack"]: label for r in rows}, "effective-length-4x", (shown(argv),),
                                method="yarn" if arm else config, tuned=arm is not None, asked=asked,
                                note=FINETUNED[arm][2] if arm else "")
            # a checkpoint's rows ask it with no method (factor 1): its setting is the recipe's YaRN s = 4,
            # a searched config's factor 4 too
            found_here = [replace(c, factor=4.0) if arm or config else c for c in found_here]
            for c in found_here:
                (found if c.length == 32768 or (c.method == "none" and not c.tuned) else shorter).append(c)
    ratios = [own_window(pairs, labels, [shown(perplexity_argv(s, arm)) for s, _, _ in pairs], FINETUNED[arm][2])
              for arm in FINETUNED if (pairs := perplexity_pairs(out, arm))]
    ratios += [r for v in VARIANTS if (r := variant_ratio(v, out, labels))]
    lines, read = build(results, labels, found, ratios)
    return lines + grid_lines([*read, *shorter], list(LABELS.values()), DEFAULT_MARGIN)


def write_page() -> Path:
    """results/effective_length_4x.md from the stored rows of every step that ran."""
    from hf_posext.evaluation.shared.summary import write_page_keeping_reading
    head = ["| haystack | method | task | length | accuracy (Wilson 95 %) | by depth | sequential call | "
            "target | wall time |", "|---|---|---|---|---|---|---|---|---|"]
    lines, commands, missing = [], [], []
    for haystack, label in LABELS.items():
        for name, folder, argv in steps(haystack):
            questions = question_rows(folder)
            if not questions and name:
                missing.append(f"{label}: {name}")
            for (method, task, length), cells in sorted(questions.items(), key=lambda q: (q[0][2], q[0][1], q[0][0])):
                lines.append(line(label, method, task, length, cells, folder))
            if questions:
                commands.append(shown(argv))
    ppl_lines, ppl_commands = perplexity_lines()
    text = [
        "# Effective length at 4x: RULER's needles at 32k", "",
        "Made by `python benchmarks/effective_length_4x.py report` from the rows of the commands below "
        "(the embedded SmolLM2-135M, trained at 8,192 tokens; float32, 2 CPU cores; RULER's wording; none of "
        "the haystacks was used to tune a method or the recipe). Targets: niah_single >= 0.9 over five depths "
        "with a lower Wilson bound >= 0.7; multi_key >= 0.8 for the fine-tuned recipe. A cell's looks are pooled; "
        "the sequential call is the question's decision against the bar after its last look, with its "
        "Clopper-Pearson bounds at the level that holds over all looks (docs/retrieval_sequential.md). A call of "
        "`undecided` means the budget ran out first.", "", *head, *lines, ""]
    if missing:
        text += [f"Not run in this round: {', '.join(missing)}.", ""]
    if ppl_lines:
        text += ["Perplexity of the fine-tuned checkpoints at 32k on held-out Hamlet, each against itself "
                 "reading the same tokens in sliding 8k windows (target for the recipe: NLL past L within +0.05 nats; "
                 "the documents-only control, where it ran, is the 1k-window setting without its synthetic examples):", "",
                 "| checkpoint | perplexity, 32k prompt | perplexity, own sliding 8k | NLL past 8k minus own sliding "
                 "| target (<= +0.05) | wall time |", "|---|---|---|---|---|---|", *ppl_lines, ""]
    text += ["Commands (`$TORCH` is the installed torch package's folder):", "", "```bash",
             *commands, *ppl_commands, "```", "", *table_lines(HERE / "results")]
    return write_page_keeping_reading(PAGE, text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=("run", "perplexity", "reference", "report", "table"))
    p.add_argument("haystack", nargs="?", choices=tuple(LABELS))
    p.add_argument("--method", choices=tuple(KNOBS),
                   help=f"the method `run` measures (finetuned: the checkpoint at {finetuned()}; "
                   + "; ".join(f"{a}: the recipe trained with{FINETUNED[a][1]}, at {finetuned(0, a)}" for a in FINETUNED
                               if a != "finetuned")
                   + "; " + "; ".join(f"{m}: the {m.split('-')[1]}-searched longrope config of "
                                      f"{searched_config(m).relative_to(HERE.parent)}, saved with the embedded model at "
                                      f"{searched(m)} when missing" for m in SEARCHED)
                   + "; " + "; ".join(f"{v}: {VARIANTS[v]} with {KNOBS[v][1]}" for v in VARIANTS) + "); default yarn for `run`; `perplexity` takes a fine-tuned one (default finetuned) or a variant")
    p.add_argument("--task", choices=tuple(TARGETS), default="niah_single",
                   help="RULER's task `run` or `reference` asks (default niah_single)")
    p.add_argument("--seed", type=int, default=0,
                   help="the fine-tuned recipe's seed: `run --method finetuned` and `perplexity` ask its checkpoint "
                   f"({finetuned(1).replace('1', 'N')} past seed 0)")
    p.add_argument("--length", choices=LENGTHS, default=FAR,
                   help=f"the prompt length `run` asks (default {FAR}, 4L; {' and '.join(LENGTHS[:-1])} are the grid's "
                   "shorter lengths an effective length of 4L needs cleared too; rows go to a folder named by it)")
    p.add_argument("--budget", help="a sequential run's wall time, e.g. 3h (YaRN, DPE and Self-Extend past 8k; default at 32k: the haystack's, "
                   + ", ".join(f"{h} {b}" for h, b in BUDGET.items()) + f"; at 16k {BUDGET_16K})")
    p.add_argument("--results", type=Path, default=HERE / "results",
                   help="`table` reads the rows under this folder (default: this script's results/)")
    args = p.parse_args()
    if args.step in ("run", "reference") and args.haystack is None:
        p.error(f"{args.step} needs a haystack: {', '.join(LABELS)}")
    if args.step == "perplexity" and args.haystack is not None:
        p.error("perplexity reads held-out Hamlet only (the recipe's own held-out play); give no haystack")
    if args.step in ("report", "table") and args.haystack is not None:
        p.error(f"{args.step} reads every haystack's stored rows; give no haystack")
    # a flag the step does not read is refused, not ignored
    reads = {"run": {"method", "task", "seed", "budget", "length"}, "perplexity": {"method", "seed"}, "reference": {"task"}, "report": set(),
             "table": {"results"}}
    given = {k for k in ("method", "task", "seed", "budget", "length", "results") if getattr(args, k) != p.get_default(k)}
    if given - reads[args.step]:
        p.error(f"{args.step} does not read {', '.join('--' + k for k in sorted(given - reads[args.step]))}")
    if args.seed < 0 or (args.seed and args.step == "run" and args.method not in FINETUNED):
        p.error(f"--seed {args.seed}: a seed names a fine-tuned checkpoint (0, 1, ...); use it with "
                "`run --method finetuned` or `perplexity`")
    if args.step == "perplexity" and args.method not in (None, *FINETUNED, *VARIANTS):
        p.error(f"perplexity --method {args.method}: perplexity measures a fine-tuned checkpoint against its own "
                f"sliding window, or a knob variant against the unpatched model's; give one of {', '.join((*FINETUNED, *VARIANTS))}")
    if args.seed and args.method in VARIANTS:
        p.error(f"--seed {args.seed}: a seed names a fine-tuned checkpoint; {args.method} is training-free")
    args.method = args.method or ("finetuned" if args.step == "perplexity" else "yarn")
    arm = args.method if args.method in (*FINETUNED, *VARIANTS) else "finetuned"
    if (args.method in FINETUNED or (args.step == "perplexity" and arm in FINETUNED)) \
            and not (HERE.parent / finetuned(args.seed, arm)).is_dir():
        p.error(f"no checkpoint at {finetuned(args.seed, arm)}: train it first with `{train_command(args.seed, arm)}`")
    if args.step == "run" and args.method == BASELINE and args.length == LENGTHS[0]:
        p.error(f"run --method {BASELINE} --length {LENGTHS[0]}: the sliding baseline is the model's own window; "
                f"within it the unpatched model is the reference (`reference {args.haystack}`)")
    if args.step == "run" and args.budget and not sequential(args.method, args.length):
        p.error(f"--budget {args.budget}: `run --method {args.method}` at {args.length} asks a fixed grid of 2 needles "
                "a depth, which runs to the end (a rerun resumes it); drop --budget")
    if args.step == "run" and args.method in SEARCHED and not (searched_config(args.method) / "config.json").is_file():
        p.error(f"{searched_config(args.method).relative_to(HERE.parent)}/config.json is missing: restore it from git")
    if args.step == "run" and args.method in SEARCHED:
        import side_by_side as sbs
        sbs.rebuild(searched_config(args.method), HERE.parent / searched(args.method))   # skipped when it holds it
    if args.step == "run":
        cli(run_argv(args.haystack, args.method, args.budget, args.task, args.seed, args.length),
            run_folder(args.haystack, args.method, args.task, args.seed, args.length))
    elif args.step == "perplexity":
        cli(perplexity_argv(args.seed, arm), perplexity_folder(args.seed, arm))
    elif args.step == "reference":
        cli(reference_argv(args.haystack, args.task), reference_folder(args.haystack, args.task))
    elif args.step == "table":
        print("\n".join(table_lines(args.results)))
    else:
        print(f"wrote {write_page()}")


if __name__ == "__main__":
    main()

"""Sequential trials against the fixed design, both run live in one invocation.

`benchmarks/retrieval_sequential.py` replays committed trials and simulates a live run; this
script measures one: the same `hf-posext retrieval` arguments run twice, one after the other on
the same machine, first with `--sequential --trials T --max-trials M` (looks of T trials a
depth, stopping a question once decided), then as the fixed design (`--trials M`, every cell
run in full). Both runs load the model the same way and measure the unpatched model's reference
cells (lengths <= L) in full, as the sequential rule requires. The report puts, per (task,
method, length), the two designs' trials, wall time (the rows' `seconds`: each cell's own
compute, its share of the prefix prefill included) and call (the sequential decision, or its
point-estimate fallback, against the fixed design's pooled accuracy vs the bar, as
`stats.effective_length` compares it), the trials both ran whose answer text is the same (a
look's prompts are the fixed design's, `prompt.py` `layout_seeds`, so all should be), and each
whole run's wall time.

    python benchmarks/retrieval_live.py --out benchmarks/results/retrieval-live --trials 4 --max-trials 20 -- \\
        --tasks niah_single --methods yarn --factor 2 --lengths 4k,16k --depths 0.5,1 --dtype bfloat16

Everything after `--` goes to both runs unchanged, but `--confidence`, `--indifference` and
`--boundary` (the rule) to the sequential run only; `--trials`, `--max-trials`, `--sequential`,
`--budget`, `--out` and `--seed` there are refused (this script sets them). `--resume` continues
both runs (their rows keep their `seconds`).

`--against DIR` runs nothing: it reports a sequential run already stored in OUT/sequential (made
by `hf-posext retrieval --sequential ... --out OUT/sequential`, budgets and resumes as it was run)
against fixed-design rows stored in DIR (e.g. the committed grid, whose cells ran fewer trials):
the calls side by side, and the fixed design at --max-trials a depth, its wall time estimated
from each question's looks (the first as it ran, the rest at the cheapest look's pace).

    python benchmarks/retrieval_live.py --out benchmarks/results/retrieval-2x-sequential --against benchmarks/results/retrieval-2x
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hf_posext.evaluation.retrieval.blocks import seed_set
from hf_posext.evaluation.shared.record import read_rows
from hf_posext.evaluation.retrieval.sequential import UNDECIDED, call
from hf_posext.evaluation.retrieval.stats import effective_length, pooled

OWN = ("--trials", "--max-trials", "--sequential", "--budget", "--out", "--seed", "--resume")
RULE = ("--confidence", "--indifference", "--boundary")   # the sequential run's rule: not the fixed design's


def without_rule(common: list[str]) -> list[str]:
    """The arguments with the rule's flags (and their values) taken out, for the fixed design."""
    kept, skip = [], False
    for a in common:
        if skip:
            skip = False
        elif a.split("=")[0] in RULE:
            skip = "=" not in a
        else:
            kept.append(a)
    return kept


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="retrieval_live.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="results folder (sequential/, fixed/, report.md)")
    p.add_argument("--trials", type=int, default=4, help="sequential: trials a depth per look (default 4)")
    p.add_argument("--max-trials", type=int, default=20, help="the fixed design's trials a cell, and the "
                   "sequential run's most (default 20)")
    p.add_argument("--resume", action="store_true", help="continue both runs in --out")
    p.add_argument("--against", type=Path, help="run nothing: report the sequential run stored in "
                   "OUT/sequential (made by `hf-posext retrieval --sequential ... --out OUT/sequential`, with any "
                   "budget and resumes) against the fixed-design rows stored in this folder")
    p.add_argument("retrieval", nargs=argparse.REMAINDER, help="-- then `hf-posext retrieval` arguments")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.common = args.retrieval[1:] if args.retrieval[:1] == ["--"] else args.retrieval
    refused = sorted({a.split("=")[0] for a in args.common if a.split("=")[0] in OWN})
    if refused:
        p.error(f"{', '.join(refused)} after `--`: this script sets it; give --trials / --max-trials / "
                "--resume before `--`")
    spaced = dict(zip(args.common, args.common[1:]))   # --dtype X, or --dtype=X
    dtype = spaced.get("--dtype") or next((a.split("=", 1)[1] for a in args.common if a.startswith("--dtype=")), None)
    if dtype == "auto":   # each run would probe on its own, and a probe under load can choose otherwise
        p.error("--dtype auto after `--`: the two runs must compute alike; give float32 or bfloat16")
    if not 1 <= args.trials <= args.max_trials:
        p.error(f"--trials {args.trials} --max-trials {args.max_trials}: need 1 <= trials <= max-trials")
    if args.max_trials % args.trials:
        p.error(f"--max-trials {args.max_trials} is not a whole number of looks of --trials {args.trials}; "
                "the fixed design would not be the sequential run's full length")
    if args.against is not None:
        missing = [f for f in (args.out / "sequential" / "retrieval.json", args.against / "retrieval.json") if not f.exists()]
        if missing:
            p.error(f"--against reports stored runs, and {missing[0]} does not exist")
        rest = [a for a in args.common if not a.startswith("--margin=")]
        if "--margin" in rest:
            del rest[rest.index("--margin"):rest.index("--margin") + 2]
        if args.resume or rest:
            p.error("--against runs nothing: drop --resume and the arguments after `--` but --margin "
                    "(the margin the sequential run was given)")
        if (args.out / "fixed" / "retrieval.json").exists():
            p.error(f"{args.out} holds a live comparison (fixed/): its report.md is that run's; give the "
                    "sequential run a folder of its own")
        return args
    if not args.resume and any((args.out / d / "retrieval.json").exists() for d in ("sequential", "fixed")):
        p.error(f"{args.out} already holds runs: pass --resume to continue them, or another --out")
    return args


def runs(args) -> dict[str, list[str]]:
    """The two `hf-posext retrieval` command lines (checked by the CLI before any model loads)."""
    tail = ["--no-plot", "--no-progress"] + (["--resume"] if args.resume else [])
    return {"sequential": ["retrieval", *args.common, "--sequential", "--trials", str(args.trials),
                           "--max-trials", str(args.max_trials), "--out", str(args.out / "sequential"), *tail],
            "fixed": ["retrieval", *without_rule(args.common), "--trials", str(args.max_trials),
                      "--out", str(args.out / "fixed"), *tail]}


def question_rows(rows: list[dict]) -> dict[tuple, list[dict]]:
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["task"], r["method"], float(r["factor"]), int(r["length"])), []).append(r)
    return by


def fixed_call(part: list[dict], ref: list[dict], trained: int, margin: float) -> tuple[str, float | None]:
    """The fixed design's call on one question (one length): `stats.effective_length`'s comparison
    of its pooled accuracy with the reference's bar."""
    reached, reference = effective_length(part, ref, trained, margin)
    if reference is None or reference <= margin:
        return "no bar", None
    return ("above" if reached is not None else "below"), reference - margin


def sequential_call(part: list[dict]) -> tuple[str, str]:
    """(text, side): the last look's decision (every row of a look carries it); undecided falls
    back on the point estimate against the bar (`sequential.call`, as the CLI's effective length)."""
    last = max(part, key=lambda r: int(r.get("look") or 0))
    bar = None if last.get("bar") is None else float(last["bar"])
    side, fallback = call(last.get("decision") or UNDECIDED, *pooled(part), bar, complete=True)
    return (f"undecided ({side} by its point estimate)" if fallback else side), side


def same_text(part: list[dict], other: list[dict]) -> tuple[int, int]:
    """(trials whose answer text is the same in both runs, trials both ran), by (depth, seed): a
    row's `outputs` are its trials' texts in seed order."""
    def by_seed(rows):
        texts = {}
        for r in rows:
            seeds, outs = sorted(seed_set(str(r["seeds_list"]))), list(r["outputs"])
            if len(seeds) == len(outs):   # a text holding ` | ` itself: the row is not compared
                texts.update({(float(r["depth"]), s): o for s, o in zip(seeds, outs)})
        return texts
    a, b = by_seed(part), by_seed(other)
    shared = a.keys() & b.keys()
    return sum(a[k] == b[k] for k in shared), len(shared)


def questions(seq: dict, fix: dict, trained: int, margin: float):
    """Per question of the fixed rows (reference cells first): both designs' rows and calls."""
    for key in sorted(fix, key=lambda k: (k[0], k[1] != "none", k[1], k[3])):
        task, method, _factor, length = key
        ref = [r for (t, m, _f, _n), part in fix.items() if t == task and m == "none" for r in part]
        s_part, f_part = seq.get(key, []), fix[key]
        is_ref = method == "none" and length <= trained
        f_call, bar = ("reference", None) if is_ref else fixed_call(f_part, ref, trained, margin)
        s_call, s_side = ("reference", "") if is_ref else sequential_call(s_part) if s_part else ("not run", "")
        yield key, s_part, f_part, s_call, f_call, bar, "—" if is_ref else ("yes" if s_side == f_call else "no")


def cost(part: list[dict]) -> tuple[int, float]:
    """(trials, seconds) of a question's rows."""
    return pooled(part)[1], sum(float(r["seconds"]) for r in part)


def report(args, walls: dict[str, float], margin: float) -> str:
    rows = {d: read_rows(args.out / d / "retrieval.json") for d in ("sequential", "fixed")}
    seq, fix = question_rows(rows["sequential"]), question_rows(rows["fixed"])
    trained = int(rows["fixed"][0]["trained_length"])
    lines = ["| task | method | length | sequential: trials | wall s | call | fixed: trials | wall s | call (bar) "
             "| same call | same text |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    totals: dict[str, list[float]] = {"sequential": [0, 0.0], "fixed": [0, 0.0]}
    text = [0, 0]   # trials with the same answer text, trials both ran
    for (task, method, factor, length), s_part, f_part, s_call, f_call, bar, same in questions(seq, fix, trained, margin):
        cells = [cost(s_part), cost(f_part)]
        for name, (n, secs) in zip(totals, cells):
            totals[name][0] += n
            totals[name][1] += secs
        bar_text = f" ({bar:.2f})" if bar is not None else ""
        k, n = same_text(s_part, f_part)
        text[0] += k
        text[1] += n
        lines.append(f"| {task} | {method} s={factor:g} | {length} | {cells[0][0]} | {cells[0][1]:.1f} | {s_call} | "
                     f"{cells[1][0]} | {cells[1][1]:.1f} | {f_call}{bar_text} | {same} | {k}/{n} |")
    (sn, ss), (fn, fs), (tk, tn) = totals["sequential"], totals["fixed"], text
    lines.append(f"| all | | | **{sn:.0f}** ({sn / fn:.0%}) | **{ss:.1f}** ({ss / fs if fs else 0:.0%}) | | {fn:.0f} | {fs:.1f} "
                 f"| | | {tk}/{tn} |")
    run_text = "; ".join(f"{d} {walls[d]:.1f} s" for d in walls) or "resumed: see the rows' seconds"
    return "\n".join([
        "# Sequential trials against the fixed design, live", "",
        "Made by `python benchmarks/retrieval_live.py " + " ".join(args.argv) + "`: the same "
        "`hf-posext retrieval` arguments run sequentially, then as the fixed design, in one invocation. "
        f"Trials and wall time per question are the rows' (`seconds`: a cell's compute); this invocation's wall "
        f"time: {run_text}. Reference cells (unpatched, lengths <= {trained}) run in full in both.", "",
        *lines, ""])


def reference(by_question: dict, task: str, trained: int) -> tuple[int, int]:
    """(correct, trials) of a task's reference cells: the unpatched model at lengths <= L."""
    return pooled([r for (t, m, _f, n), part in by_question.items() if t == task and m == "none" and n <= trained
                   for r in part])


def fixed_estimate(part: list[dict], full: int) -> float:
    """The fixed design's wall time for a question of `full` trials, from its sequential looks: the
    first look as it ran (it prefilled the question's prefix, which the fixed design also does once),
    then every further trial at the cheapest look's pace (a look after the first prefills nothing).
    A question run in one look has only that look's pace: an overestimate by its prefill's share."""
    looks: dict[int, list[float]] = {}
    for r in part:
        look = looks.setdefault(int(r.get("look") or 1), [0, 0.0])
        look[0] += int(r["trials"])
        look[1] += float(r["seconds"])
    if not looks:
        return 0.0
    first_n, first_s = looks[min(looks)]
    pace = min(s / n for n, s in looks.values() if n)
    return first_s + (full - first_n) * pace


def against_report(args, margin: float) -> str:
    """A sequential run already stored in OUT/sequential (budgets and resumes as it was run) against
    stored fixed-design rows (`--against`, e.g. the committed grid): the calls side by side, and
    what the fixed design at --max-trials a depth would run, its time estimated from each
    question's looks (`fixed_estimate`; a look's trial costs a fixed one's: the live comparison in
    one run measured +1 %)."""
    seq_rows = read_rows(args.out / "sequential" / "retrieval.json")
    seq = question_rows(seq_rows)
    fix = {k: v for k, v in question_rows(read_rows(args.against / "retrieval.json")).items()
           if k in seq}
    if not fix:
        raise SystemExit(f"{args.against} holds none of the questions in {args.out / 'sequential'}")
    trained = int(seq_rows[0]["trained_length"])
    stored = {int(r["max_trials"]) for r in seq_rows if r.get("max_trials") is not None}
    if stored != {args.max_trials}:
        raise SystemExit(f"{args.out / 'sequential'} was run with --max-trials {sorted(stored)}, not "
                         f"{args.max_trials}: pass its own, the fixed design it is measured against")
    for task in {k[0] for k in seq}:   # the stored bar is its run's reference minus its --margin
        k, n = reference(seq, task, trained)
        for bar in {round(float(r["bar"]), 9) for r in seq_rows if r["task"] == task and r.get("bar") is not None}:
            if n and abs(k / n - margin - bar) > 1e-6:
                raise SystemExit(f"{task}: the stored bar {bar:.4f} is its reference {k}/{n} minus {k / n - bar:.4f}, "
                                 f"not the margin {margin}: pass `-- --margin {k / n - bar:.4f}`")
    lines = ["| task | method | length | sequential: trials | wall s | call | stored: trials | call (bar) | same call "
             f"| fixed design at {args.max_trials} a depth: trials | its wall s (est.) |", "|---" * 11 + "|"]
    total = [0, 0.0, 0, 0.0]
    for key, s_part, f_part, s_call, f_call, bar, same in questions(seq, fix, trained, margin):
        (n, secs), depths = cost(s_part), {float(r["depth"]) for r in s_part}
        full = len(depths) * args.max_trials
        est = fixed_estimate(s_part, full)
        total = [total[0] + n, total[1] + secs, total[2] + full, total[3] + est]
        bar_text = f" ({bar:.2f})" if bar is not None else ""
        lines.append(f"| {key[0]} | {key[1]} s={key[2]:g} | {key[3]} | {n} | {secs:.1f} | {s_call} | {cost(f_part)[0]} | "
                     f"{f_call}{bar_text} | {same} | {full} | {est:.0f} |")
    lines.append(f"| all | | | **{total[0]}** ({total[0] / total[2]:.0%}) | **{total[1]:.1f}** ({total[1] / total[3]:.0%}) "
                 f"| | | | | {total[2]} | {total[3]:.0f} |")
    for task in sorted({k[0] for k in seq}):   # each design's bar: its own reference cells
        refs = [(reference(rows, task, trained), name) for rows, name in ((seq, "the sequential run"), (fix, "the stored run"))]
        lines.append("\n" + task + ": " + "; ".join(f"{name}'s reference {k}/{n}, bar {k / n - margin:.2f}"
                                                   for (k, n), name in refs if n) + f" (margin {margin:g})")
    return "\n".join([
        "# A stored sequential run against stored fixed-design rows", "",
        "Made by `python benchmarks/retrieval_live.py " + " ".join(args.argv) + f"`: nothing run; the rows of "
        f"{args.out / 'sequential'} against those of {args.against}. Wall time per question is the rows' "
        "(`seconds`: a cell's compute); the fixed design's is estimated from the sequential run's own looks of "
        "each question: its first look as run (it prefilled the prefix, as the fixed design does once), the rest "
        "at its cheapest look's pace per trial (an overestimate for a question run in one look). "
        f"Reference cells (unpatched, lengths <= {trained}) run in full.", "",
        *lines, ""])


def main(argv=None) -> int:
    from hf_posext import cli
    args = parse(argv)
    if args.against is not None:
        margin = cli.build_parser().parse_args(["retrieval", *args.common]).margin
        (args.out / "report.md").write_text(against_report(args, margin))
        print(f"report: {args.out / 'report.md'}", flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    for name, argv_ in runs(args).items():
        print("hf-posext " + " ".join(argv_), flush=True)
        began = time.perf_counter()
        if cli.main(argv_):
            raise SystemExit(f"the {name} run failed (its rows so far are in {args.out / name})")
        walls[name] = time.perf_counter() - began
    margin = cli.build_parser().parse_args(runs(args)["fixed"]).margin
    (args.out / "report.md").write_text(report(args, walls, margin))
    print(f"report: {args.out / 'report.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())

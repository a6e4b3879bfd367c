"""Sequential trials against the fixed design, both run live in one invocation.

`benchmarks/retrieval_sequential.py` replays committed trials and simulates a live run; this
script measures one: the same `hf-posext retrieval` arguments run twice, one after the other on
the same machine, first with `--sequential --trials M --look T` (looks of T trials a depth, at
most M, stopping a question once decided), then as the fixed design (`--trials M`, every cell
run in full). Both runs load the model the same way and measure the unpatched model's reference
cells (lengths <= L) in full, as the sequential rule requires. The report puts, per (task,
method, length), the two designs' trials, wall time (the rows' `seconds`: each cell's own
compute, its share of the prefix prefill included) and call (the sequential decision, or its
point-estimate fallback, against the fixed design's pooled accuracy vs the bar, as
`stats.effective_length` compares it), the trials both ran whose answer text is the same (a
look's prompts are the fixed design's, `prompt.py` `layout_seeds`, so all should be), and each
whole run's wall time.

    python benchmarks/retrieval_live.py --out benchmarks/results/retrieval-live --trials 20 --look 4 -- \\
        --tasks niah_single --methods yarn --factor 2 --lengths 4k,16k --depths 0.5,1 --dtype bfloat16

Everything after `--` goes to both runs unchanged, but `--confidence`, `--indifference` and
`--boundary` (the rule) to the sequential run only; `--trials`, `--look`, `--sequential`,
`--budget`, `--out` and `--seed` there are refused (this script sets them). `--resume` continues
both runs (their rows keep their `seconds`). The comparison (commands, calls, report) is
hf_posext.evaluation.retrieval.designs; this script runs it.

`--against DIR` runs nothing: it reports a sequential run already stored in OUT/sequential (made
by `hf-posext retrieval --sequential ... --out OUT/sequential`, budgets and resumes as it was run)
against fixed-design rows stored in DIR (e.g. the committed grid, whose cells ran fewer trials):
the calls side by side, and the fixed design at --trials a depth, its wall time estimated
from each question's looks (the first as it ran, the rest at the cheapest look's pace).

    python benchmarks/retrieval_live.py --out benchmarks/results/retrieval-2x-sequential --against benchmarks/results/retrieval-2x
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hf_posext.commands.retrieval_plan import refuse_max_trials
from hf_posext.evaluation.retrieval.designs import against_report, check_designs, design_commands, live_report

COMMAND = "python benchmarks/retrieval_live.py"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="retrieval_live.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="results folder (sequential/, fixed/, report.md)")
    p.add_argument("--trials", type=int, default=20, help="the fixed design's trials a cell, and the "
                   "sequential run's most (default 20)")
    p.add_argument("--look", type=int, default=4, help="sequential: trials a depth per look (default 4)")
    refuse_max_trials(p)
    p.add_argument("--resume", action="store_true", help="continue both runs in --out")
    p.add_argument("--against", type=Path, help="run nothing: report the sequential run stored in "
                   "OUT/sequential (made by `hf-posext retrieval --sequential ... --out OUT/sequential`, with any "
                   "budget and resumes) against the fixed-design rows stored in this folder")
    p.add_argument("retrieval", nargs=argparse.REMAINDER, help="-- then `hf-posext retrieval` arguments")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.common = args.retrieval[1:] if args.retrieval[:1] == ["--"] else args.retrieval
    try:
        check_designs(args.common, args.look, args.trials)
    except ValueError as error:
        p.error(str(error))
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


def main(argv=None) -> int:
    from hf_posext import cli
    args = parse(argv)
    command = " ".join([COMMAND, *args.argv])
    if args.against is not None:
        margin = cli.build_parser().parse_args(["retrieval", *args.common]).margin
        try:
            text = against_report(args.out, args.against, args.trials, command, margin)
        except ValueError as error:   # the stored rows do not fit the margin or --trials given
            raise SystemExit(str(error)) from None
        (args.out / "report.md").write_text(text)
        print(f"report: {args.out / 'report.md'}", flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    runs = design_commands(args.common, args.look, args.trials, args.out, args.resume)
    for name, argv_ in runs.items():
        print("hf-posext " + " ".join(argv_), flush=True)
        began = time.perf_counter()
        if cli.main(argv_):
            raise SystemExit(f"the {name} run failed (its rows so far are in {args.out / name})")
        walls[name] = time.perf_counter() - began
    margin = cli.build_parser().parse_args(runs["fixed"]).margin
    (args.out / "report.md").write_text(live_report(args.out, command, walls, margin))
    print(f"report: {args.out / 'report.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())

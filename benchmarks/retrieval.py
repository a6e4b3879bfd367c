"""Cost of the retrieval suite: the grid's wall time with the shared prefix prefilled once per
cell (the default) against one full prefill per trial (`--no-prefix-reuse`), on the embedded
SmolLM2-135M. Not a timed test: run by hand, in the background.

The target grid (issue 29): lengths 8k and 16k, 5 depths, 20 trials per cell, single-needle,
methods none / yarn / dual_chunk (README: the best attention-level method at 2x), in <= 30 min on
2 CPU cores. The full-prefill side runs `--full-trials` trials per cell (default 2) and is
scaled to the grid's trials: each of its trials is one independent prefill, so its time is
linear in the trial count (the row's per-trial seconds are printed with it).

    python benchmarks/retrieval.py --lengths 2k --trials 2 --depths 0,1 --out /tmp/smoke   # smoke
    python benchmarks/retrieval.py                        # the target grid -> benchmarks/results/
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="8k,16k", help="lengths (default 8k,16k)")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="depths (default 5)")
    p.add_argument("--trials", type=int, default=20, help="trials per cell with prefix reuse (default 20)")
    p.add_argument("--full-trials", type=int, default=2,
                   help="trials per cell of the full-prefill comparison (default 2; 0 skips it)")
    p.add_argument("--methods", default="yarn,dual_chunk", help="methods besides none (default yarn,dual_chunk)")
    p.add_argument("--tasks", default="single_needle", help="tasks (default single_needle)")
    p.add_argument("--dtype", default="auto", help="dtype (default auto: bfloat16 with CPU bf16 matmul)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "retrieval",
                   help="results folder (default benchmarks/results/retrieval)")
    return p.parse_args(argv)


def run_grid(args, out: Path, trials: int, reuse: bool) -> float:
    from hf_posext import cli
    argv = ["retrieval", "--lengths", args.lengths, "--depths", args.depths, "--methods", args.methods,
            "--tasks", args.tasks, "--trials", str(trials), "--dtype", args.dtype, "--out", str(out),
            "--resume", "--no-progress"] + ([] if reuse else ["--no-prefix-reuse", "--no-plot"])
    started = time.perf_counter()
    code = cli.main(argv)
    if code:
        sys.exit(code)
    return time.perf_counter() - started


def cell_seconds(out: Path) -> float:
    rows = json.loads((out / "retrieval.json").read_text())["rows"]
    return sum(float(r["seconds"]) for r in rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), **{
        k: str(v) for k, v in vars(args).items()}}
    wall = run_grid(args, args.out / "reuse", args.trials, reuse=True)
    report["reuse_wall_s"], report["reuse_cells_s"] = round(wall, 1), round(cell_seconds(args.out / "reuse"), 1)
    if args.full_trials:
        wall = run_grid(args, args.out / "full", args.full_trials, reuse=False)
        full = cell_seconds(args.out / "full")
        report["full_wall_s"], report["full_cells_s"] = round(wall, 1), round(full, 1)
        report["full_cells_s_scaled_to_trials"] = round(full * args.trials / args.full_trials, 1)
        report["speedup_cells"] = round(report["full_cells_s_scaled_to_trials"] / report["reuse_cells_s"], 2)
    print(json.dumps(report, indent=1))
    with open(args.out / "benchmark.jsonl", "a") as f:
        f.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

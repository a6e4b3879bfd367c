"""Cost of the retrieval suite: each cell's trials with the shared prefix prefilled once (the
default) against one full prefill per trial (`--no-prefix-reuse`), on the embedded SmolLM2-135M.
Not a timed test: run by hand, in the background.

The two ways run cell by cell, back to back (on a shared machine the load drifts: two runs one
after the other would compare two loads, not two methods). The full-prefill side runs
`--full-trials` of the cell's trials (default 2; each is one independent prefill, so its time is
linear in the trial count and is scaled to `--trials`) and must give the same answers as the
cached side on those trials (a check on the real model of tests/test_retrieval_decode.py).

The target grid: lengths 8k and 16k, 5 depths, 20 trials per cell, single-needle,
methods none / yarn / dual_chunk (README: the best attention-level method at 2x), in <= 30 min on
2 CPU cores.

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
    p.add_argument("--model", default="embedded:smollm2-135m", help="model (default the embedded one)")
    p.add_argument("--lengths", default="8k,16k", help="lengths (default 8k,16k)")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="depths (default 5)")
    p.add_argument("--trials", type=int, default=20, help="trials per cell with prefix reuse (default 20)")
    p.add_argument("--full-trials", type=int, default=2,
                   help="trials per cell of the full-prefill side (default 2)")
    p.add_argument("--methods", default="yarn,dual_chunk", help="methods besides none (default yarn,dual_chunk)")
    p.add_argument("--task", default="single_needle", help="task (default single_needle)")
    p.add_argument("--dtype", default="auto", help="dtype (default auto: `hf-posext retrieval --dtype auto`)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "retrieval",
                   help="results folder (default benchmarks/results/retrieval)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from hf_posext.commands.auto_dtype import auto_inputs, fast_dtype
    from hf_posext.data.embedded import load_model, load_tokenizer
    from hf_posext.evaluation.shared.grid import apply_method, method_factors
    from hf_posext.evaluation.shared.inputs import parse_floats01, parse_lengths, parse_methods
    from hf_posext.evaluation.retrieval import answer_cell, build_cell, get_task, noise_haystack
    from hf_posext.evaluation.retrieval.stats import score_trial
    from hf_posext.patcher import trained_length

    lengths, depths = parse_lengths(args.lengths), parse_floats01(args.depths, "--depths")
    methods, task = parse_methods(args.methods), get_task(args.task)
    dtype = fast_dtype("cpu", **auto_inputs(args.model)) if args.dtype == "auto" else args.dtype
    tokenizer = load_tokenizer(args.model)
    model = load_model(name=args.model, dtype=getattr(torch, dtype)).eval()
    hay, trained = noise_haystack(tokenizer), trained_length(model)
    args.out.mkdir(parents=True, exist_ok=True)
    cells, seen = [], set()
    for n in lengths:
        for method, _, s in method_factors(methods, ["auto"], n, trained):
            if (s == 1.0 and "none" in seen and method in ("yarn", "linear", "ntk")):
                continue   # a static rope method at s = 1 is the unpatched model (the grid copies it)
            seen.add(method)
            for d in depths:
                cp = build_cell(tokenizer, task, hay, n, d, range(args.trials))
                apply_method(model, method, s)
                started = time.perf_counter()
                cached = answer_cell(model, tokenizer, cp, reuse_prefix=True)
                reuse_s = time.perf_counter() - started
                part = build_cell(tokenizer, task, hay, n, d, range(args.full_trials))
                started = time.perf_counter()
                full = answer_cell(model, tokenizer, part, reuse_prefix=False)
                full_s = time.perf_counter() - started
                apply_method(model, "none", 1.0)
                row = {"method": method, "factor": s, "length": n, "depth": d, "trials": args.trials,
                       "reuse_s": round(reuse_s, 1), "full_s_per_trial": round(full_s / args.full_trials, 1),
                       "prefix_tokens": len(cp.prefix), "correct": sum(
                           score_trial(a, t.answers, task.multi_answer) == 1.0 for t, a in zip(cp.trials, cached)),
                       "same_answers": cached[:args.full_trials] == full, "dtype": dtype}
                cells.append(row)
                print(json.dumps(row), flush=True)
    reuse = sum(c["reuse_s"] for c in cells)
    full = sum(c["full_s_per_trial"] * c["trials"] for c in cells)
    report = {"finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "args": {k: str(v) for k, v in vars(args).items()}, "cells": len(cells),
              "grid_s_with_prefix_reuse": round(reuse, 1), "grid_s_one_prefill_per_trial": round(full, 1),
              "speedup": round(full / reuse, 2) if reuse else None,
              "all_answers_equal": all(c["same_answers"] for c in cells), "rows": cells}
    with open(args.out / "benchmark.jsonl", "a") as f:
        f.write(json.dumps(report) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

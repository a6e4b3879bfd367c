"""What one forward serving several lengths saves (the target: a length grid
{2k, 4k, 8k, 16k} for a static method at a fixed s costs <= 1.1x one 16k forward per method).

    python benchmarks/archive/shared_forward.py [--lengths 2048,4096,8192,16384] [--method yarn]

On the embedded SmolLM2-135M and the first play long enough, float32: times (1) one truncate
forward of the longest length, (2) the grid `evaluate_perplexity(model, docs, PerplexityGrid([method],
lengths, factors=[2]))` with its shared forwards, and (3) the same grid with one forward per length (the
sharing switched off by planning nothing), and checks that (2) and (3) agree to 1e-4. The grid
has two groups (`none` and the method), so its cost per method is its time / 2. Appends the
figures to benchmarks/results/shared_forward.md.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from hf_posext.data import embedded
from hf_posext.evaluation import PerplexityGrid
from hf_posext.evaluation.perplexity import run as P

OUT = Path(__file__).resolve().parents[1] / "results" / "shared_forward.md"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="2048,4096,8192,16384")
    p.add_argument("--method", default="yarn")
    args = p.parse_args()
    lengths = sorted(int(x) for x in args.lengths.split(","))
    tok = embedded.load_tokenizer()
    docs = []
    for path in embedded.play_paths():
        ids = np.asarray(tok(path.read_text())["input_ids"], dtype=np.int32)
        if len(ids) >= lengths[-1]:
            docs, play = [ids], path.stem
            break
    model = embedded.load_model(dtype=torch.float32).eval()

    start = time.perf_counter()
    P.truncate_positions(model, docs, lengths[-1])
    one = time.perf_counter() - start

    def grid(shared: bool) -> tuple[list[dict], float]:
        real = P.SharedForwards.plan
        if not shared:
            P.SharedForwards.plan = lambda self, cells: None  # type: ignore[method-assign]  # nothing planned: one forward per cell
        try:
            start = time.perf_counter()
            rows = P.evaluate_perplexity(model, docs, PerplexityGrid([args.method], lengths, factors=[2.0],
                                                                    baseline=False),
                                         progress=False, reuse_identical=False)
            return rows, time.perf_counter() - start
        finally:
            P.SharedForwards.plan = real  # type: ignore[method-assign]  # the swap above, undone

    shared_rows, shared_s = grid(True)
    alone_rows, alone_s = grid(False)
    worst = max(abs(a["perplexity"] / b["perplexity"] - 1) for a, b in zip(shared_rows, alone_rows))
    per_method = shared_s / 2
    lines = [
        f"\n## {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, `python benchmarks/archive/shared_forward.py "
        f"--lengths {args.lengths} --method {args.method}`\n",
        f"{play}, 1 document, float32, lengths {', '.join(map(str, lengths))}, s = 2, groups `none` and `{args.method}`.\n",
        "| | seconds | per method | × one forward |",
        "|---|---|---|---|",
        f"| one forward of {lengths[-1]} | {one:.1f} | | 1.00 |",
        f"| grid, shared forwards | {shared_s:.1f} | {per_method:.1f} | {per_method / one:.2f} |",
        f"| grid, one forward per length | {alone_s:.1f} | {alone_s / 2:.1f} | {alone_s / 2 / one:.2f} |",
        "",
        f"Largest relative difference of a cell's perplexity, shared vs alone: {worst:.1e} "
        f"(target 1e-4). Target <= 1.1× one forward per method: "
        f"**{'met' if per_method / one <= 1.1 else 'missed'}** ({per_method / one:.2f}×).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not OUT.exists():
        OUT.write_text("# One forward serving several lengths\n\nWritten by `benchmarks/archive/shared_forward.py`.\n")
    with OUT.open("a") as f:
        f.write(text)


if __name__ == "__main__":
    main()

"""GPU smoke timing (`make gpu-smoke`, after the `gpu` tests): one decoder forward of the embedded
SmolLM2-135M on CUDA per length, unpatched SDPA against attention methods running on PyTorch's
memory-efficient kernel (backend `efficient`). Prints a markdown table: median wall time of
`--reps` forwards after one warm-up, and peak CUDA memory. Never run on this project's CPU-only
machine; exits with a message without CUDA.

    python benchmarks/gpu_smoke.py [--lengths 8192 16384 32768] [--dtype bfloat16] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import hf_posext
from hf_posext.data import embedded
from hf_posext.evaluation.lm_head import decoder_and_head

# method -> knobs (the demo's, README; `auto` fitted to each length)
METHODS: dict[str, dict | None] = {"none": None,
           "string": {},
           "leaky_rerope": {"window": 6144, "leak": "auto", "logn": False},
           "self_extend": {"window": 6144, "group_size": "auto"}}


def forward_stats(model, ids, reps: int) -> tuple[float, float]:
    decoder, _ = decoder_and_head(model)
    times = []
    for rep in range(reps + 1):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        with torch.inference_mode():
            decoder(input_ids=ids, use_cache=False)
        torch.cuda.synchronize()
        if rep:                                   # the first forward is the warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="*", default=[8192, 16384, 32768])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device; nothing measured.", file=sys.stderr)
        return 0
    dtype = getattr(torch, args.dtype)
    tok = embedded.load_tokenizer()
    text = max(embedded.play_paths(), key=lambda path: path.stat().st_size).read_text()  # Hamlet
    ids = torch.tensor(tok(text, verbose=False)["input_ids"])
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, torch {torch.__version__}, median of {args.reps}")
    print("| method | tokens | forward s | peak CUDA MiB |\n|---|---|---|---|")
    for n in args.lengths:
        batch = ids[:n][None].cuda()
        for method, knobs in METHODS.items():
            model = embedded.load_model().to(device="cuda", dtype=dtype).eval()
            if knobs is not None:
                # STRING declares no target (refused past its reach L + S − W): timed at n as is
                s = None if method == "string" else max(1.0, n / hf_posext.trained_length(model))
                hf_posext.patch(model, method, s, **knobs)
            else:
                model.config._attn_implementation = "sdpa"
            seconds, mib = forward_stats(model, batch, args.reps)
            print(f"| {method} | {n:,} | {seconds:.3f} | {mib:,.0f} |", flush=True)
            del model
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

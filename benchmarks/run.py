"""Benchmarks on the embedded SmolLM2-135M (not timed tests; run by hand, ~8 min on 2 CPU cores).

1. One perplexity cell at 8k and 16k tokens: hf_posext's chunked path (decoder to hidden states,
   LM head + cross-entropy in 1,024-position float32 chunks) against the plain
   `model(input_ids, labels=input_ids)` loss, in the same run, each cell in a fresh process
   (model loaded, warmed up): peak RSS increase over the pre-cell baseline (sampled every 5 ms)
   and wall time, as ratios. Target at 16k: memory at most
   a third of the plain path's, wall time no worse.
2. Forward overhead of a model patched by `hf_posext.patch(model, "yarn", s)` against a model
   built by transformers from a config that declares the same `yarn` rope parameters natively:
   interleaved repetitions, median wall time, and the logits compared.

    .venv/bin/python benchmarks/run.py            # writes benchmarks/results/*.json and .md
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import hf_posext
from hf_posext.data import embedded
from hf_posext.evaluation.perplexity.loss import PeakMemory, causal_targets, chunked_nll

HERE = Path(__file__).resolve().parent


def document_tokens(n: int, model: str = embedded.DEFAULT_MODEL) -> torch.Tensor:
    """The first n tokens of the first play long enough (the demo's document)."""
    tok = embedded.load_tokenizer(model)
    for path in embedded.play_paths():
        ids = tok(path.read_text(), verbose=False)["input_ids"]
        if len(ids) >= n:
            return torch.tensor(ids[:n])
    raise SystemExit(f"no play has {n} tokens")


def chunked_cell(model, ids):
    nll, n = chunked_nll(model, ids, causal_targets(ids))
    return nll / n


@torch.inference_mode()
def plain_cell(model, ids):
    return model(ids[None], labels=ids[None]).loss.item()


def measure(fn, model, ids) -> dict:
    with PeakMemory("cpu") as peak:
        start = time.perf_counter()
        loss = fn(model, ids)
        seconds = time.perf_counter() - start
    return {"loss": loss, "seconds": round(seconds, 2), "peak_rss_mb": round(peak.peak_mb),
            "peak_increase_mb": round(peak.increase_mb)}


CELLS = {"chunked": chunked_cell, "plain": plain_cell}


def one_cell(name: str, tokens: int, dtype: str, model_name: str) -> dict:
    """Run in a fresh process: load, warm up, then measure one cell. A fresh process matters:
    memory the allocator kept from an earlier cell would hide this cell's own peak."""
    model = embedded.load_model(name=model_name, dtype=getattr(torch, dtype)).eval()
    ids = document_tokens(tokens, model_name)
    CELLS[name](model, ids[:256])       # warm-up: first-call allocations and kernels
    return measure(CELLS[name], model, ids)


def bench_memory(lengths: list[int], dtype: str, model_name: str) -> list[dict]:
    import subprocess

    rows = []
    for i, n in enumerate(lengths):
        results = {}
        # Alternate the order across lengths, so neither path always runs first.
        for name in (("chunked", "plain") if i % 2 == 0 else ("plain", "chunked")):
            proc = subprocess.run([sys.executable, __file__, "--cell", name, "--tokens", str(n),
                                   "--dtype", dtype, "--model", model_name], capture_output=True, text=True, check=True)
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"  {n:>6} tokens  {name:8s} {results[name]}", flush=True)
        c, p = results["chunked"], results["plain"]
        rows.append({"tokens": n, "chunked": c, "plain": p,
                     # nan when the plain path's cell is below the sampler's resolution (tiny models)
                     "memory_ratio": round(c["peak_increase_mb"] / p["peak_increase_mb"], 3) if p["peak_increase_mb"] else math.nan,
                     "time_ratio": round(c["seconds"] / p["seconds"], 3) if p["seconds"] else math.nan,
                     "loss_abs_diff": abs(c["loss"] - p["loss"])})
    return rows


def native_yarn_twin(model, factor: float):
    """The same weights in a model transformers builds from a config declaring `yarn` itself."""
    config = copy.deepcopy(model.config)
    trained = config.max_position_embeddings
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": config.rope_parameters["rope_theta"],
                              "factor": factor, "original_max_position_embeddings": trained,
                              "beta_fast": 32.0, "beta_slow": 1.0}
    config.max_position_embeddings = int(trained * factor)
    twin = type(model)(config).eval()
    twin.load_state_dict(model.state_dict())
    return twin.to(model.dtype)


@torch.inference_mode()
def bench_overhead(model, tokens: int, reps: int, model_name: str, factor: float = 2.0) -> dict:
    ids = document_tokens(tokens, model_name)[None]                   # [1, T]
    native = native_yarn_twin(model, factor)
    hf_posext.patch(model, "yarn", factor)
    try:
        logits_p = model(ids).logits
        logits_n = native(ids).logits
        diff = float((logits_p - logits_n).abs().max())
        del logits_p, logits_n
        times = {"patched": [], "native": []}
        for r in range(reps):   # interleaved, so drift in machine load hits both alike
            for name, m in ((("patched", model), ("native", native)) if r % 2 == 0 else
                            (("native", native), ("patched", model))):
                start = time.perf_counter()
                m(ids)
                times[name].append(time.perf_counter() - start)
    finally:
        hf_posext.unpatch(model)
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()}
    return {"tokens": tokens, "factor": factor, "reps": reps,
            "median_seconds": {k: round(v, 3) for k, v in med.items()},
            "all_seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
            "relative_spread": {k: round(v, 3) for k, v in spread.items()},
            "patched_over_native": round(med["patched"] / med["native"], 3),
            "max_abs_logit_diff": diff}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8192,16384", help="tokens per memory/speed cell")
    parser.add_argument("--overhead-tokens", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--model", default=embedded.DEFAULT_MODEL,
                        help="model and tokenizer (default %(default)s; a folder: tests run a tiny one)")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--cell", choices=sorted(CELLS), help=argparse.SUPPRESS)   # child mode
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell:
        print(json.dumps(one_cell(args.cell, args.tokens, args.dtype, args.model)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    env = {"model": args.model, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": __import__("transformers").__version__, "threads": torch.get_num_threads(),
           "dtype": args.dtype, "cpu": platform.processor() or platform.machine()}
    report: dict = {"env": env}
    lines = [f"# hf_posext benchmarks ({args.dtype}, {env['threads']} threads, torch {env['torch']}, "
             f"transformers {env['transformers']})", ""]
    if not args.skip_memory:
        print("memory/speed: chunked vs plain loss", flush=True)
        rows = bench_memory([int(x) for x in args.lengths.split(",")], args.dtype, args.model)
        report["memory"] = rows
        lines += ["## One perplexity cell: chunked vs plain `model(ids, labels=ids)`", "",
                  "| tokens | chunked peak +MB | plain peak +MB | memory ratio | chunked s | plain s | "
                  "time ratio | loss diff |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['tokens']} | {r['chunked']['peak_increase_mb']} | "
                         f"{r['plain']['peak_increase_mb']} | {r['memory_ratio']:.3f} | "
                         f"{r['chunked']['seconds']} | {r['plain']['seconds']} | {r['time_ratio']:.3f} | "
                         f"{r['loss_abs_diff']:.1e} |")
        lines.append("")
    print("overhead: patched yarn vs native yarn", flush=True)
    model = embedded.load_model(name=args.model, dtype=getattr(torch, args.dtype)).eval()
    ov = bench_overhead(model, args.overhead_tokens, args.reps, args.model)
    report["overhead"] = ov
    lines += ["## Forward overhead: `hf_posext.patch(model, 'yarn', 2)` vs native `yarn` config", "",
              f"{ov['tokens']} tokens, {ov['reps']} interleaved repetitions each: median "
              f"{ov['median_seconds']['patched']} s patched vs {ov['median_seconds']['native']} s "
              f"native (ratio {ov['patched_over_native']}; run-to-run spread "
              f"{ov['relative_spread']['patched']:.1%} / {ov['relative_spread']['native']:.1%}); "
              f"max |Δlogit| = {ov['max_abs_logit_diff']:.1e}.", ""]
    (out / "benchmarks.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "benchmarks.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

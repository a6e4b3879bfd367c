"""The report of benchmarks/search.py: results/search.md, search_curve.png, search_compare.png.

Reads results/search.json (the held-out scores of `search.py heldout`), the search logs and the
sliding-8k baseline rows of benchmarks/results/eval/long-context-code; computes nothing expensive.

    python benchmarks/search.py report
"""

from __future__ import annotations

import json
import math

from search_setup import (BASELINE_CSV, COMPARE, COMPARE_BUDGET, LENGTHS, MAIN_ROWS, OUT, OUT4, OUT_MIX,
                          OUT_MIX4, RESULTS, ROOT, TARGET, TARGET4, TRAINED, TUNE4_ARGV, TUNE_ARGV, HERE)


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


def short_regression(held: dict, name: str, missing: str = "not scored") -> str:
    """Worst perplexity ratio to the unpatched model at the lengths <= L of row `name`."""
    plain, row = held.get("unpatched", {"nll": {}})["nll"], held.get(name, {"nll": {}})["nll"]
    ratios = [math.exp(row[str(n)] - plain[str(n)]) for n in LENGTHS
              if n <= TRAINED and str(n) in row and str(n) in plain]
    return f"{max(ratios):.4f}" if ratios else missing


def section_mix(held: dict) -> list[str]:
    """The searches tuned on two kinds of text (mix, mix4): held-out ratios and the short-context
    regression as saved and with LongRoPE's identity short set."""
    lines = ["", "## Tuned on two kinds of text (`python benchmarks/search.py mix`, `mix4`)", "",
             "King Lear and the Python language reference (`mix_texts()`), evolution, held out on the "
             "code text by plain transformers. Rows without a searched checkpoint are the references.", "",
             "| config | tuned on | target | ratio to sliding-8k | ≤8k vs unpatched (worst), as saved | with short_factor = 1 |",
             "|---|---|---|---|---|---|"]
    rows = [("yarn (s=2)", TARGET, None), ("searched (evolution)", TARGET, None),
            ("searched, two kinds (evolution)", TARGET, OUT_MIX),
            ("yarn (s=4)", TARGET4, None), ("searched 4x (evolution)", TARGET4, None),
            ("searched 4x, two kinds (evolution)", TARGET4, OUT_MIX4)]
    for name, target, _out in rows:
        row = held.get(name)
        if row is None or str(target) not in row["nll"]:
            continue
        ratio = math.exp(row["nll"][str(target)]) / baseline_row(target)["perplexity"]
        ident = short_regression(held, name + " [short_factor = 1]") if "searched" in name else "—"
        tuned = "—" if "searched" not in name else "King Lear, Python reference" if "two kinds" in name else "King Lear"
        lines.append(f"| {name} | {tuned} | {target // 1024}k | {ratio:.4f} | {short_regression(held, name)} | {ident} |")
    for out in (OUT_MIX, OUT_MIX4):
        log = [json.loads(x) for x in open(out / "search_log.jsonl")] if (out / "search_log.jsonl").is_file() else []
        seeds, cands = [r for r in log if r["kind"] == "seed"], [r for r in log if r["kind"] == "candidate"]
        if seeds and cands:
            seed, best = min(seeds, key=lambda r: r["nll"]), min(cands, key=lambda r: r["nll"])
            lines.append(f"\n{out.relative_to(ROOT)}: {len(cands)} candidates in "
                         f"{max(r.get('elapsed', 0) for r in log) / 60:.1f} min; best seed {seed['method']}; "
                         f"best candidate {math.exp(best['nll'] - seed['nll']):.4f}x its proxy perplexity, "
                         f"attention factor {best['attention_factor']:.4f}.")
    return lines


def section_split(held: dict) -> list[str]:
    """Where each config wins or loses against the sliding baseline at its target length: the
    first L - 1 predictions (within L: the baseline's first window is the unpatched model's own
    L-token forward) and the rest (past L: the baseline's later windows), as perplexity ratios."""
    import csv

    plain = held.get("unpatched", {"nll": {}})["nll"]
    if str(TRAINED) not in plain:
        return []
    lines = ["", "## Where the ratio comes from: within L and past L", "",
             f"Each config's {TRAINED - 1} first predictions against the unpatched model's {TRAINED}-token forward "
             "(the sliding baseline's first window), and the rest against the baseline's later windows "
             "(its total minus that first window, from the baseline row's summed NLL).", "",
             "| config | length | within L vs unpatched | past L vs sliding-8k | whole |", "|---|---|---|---|---|"]
    rows = {(r["protocol"], int(r["length"])): r for r in csv.DictReader(open(BASELINE_CSV)) if r["method"] == "none"}
    for name, row in held.items():
        for n, (first, rest) in sorted(row.get("halves", {}).items()):
            base = rows.get(("baseline", int(n)))
            if base is None:
                continue
            count = int(base["tokens"])
            base_rest = (float(base["nll"]) - plain[str(TRAINED)] * (TRAINED - 1)) / (count - TRAINED + 1)
            whole = math.exp(row["nll"][n] - float(base["nll"]) / count)
            lines.append(f"| {name} | {int(n) // 1024}k | {math.exp(first - plain[str(TRAINED)]):.4f} | "
                         f"{math.exp(rest - base_rest):.4f} | {whole:.4f} |")
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
    for name, row in held.items():
        if name not in MAIN_ROWS:
            continue   # 4x and two-kind rows: their own sections below
        ppl = [math.exp(row["nll"][str(n)]) if str(n) in row["nll"] else float("nan") for n in LENGTHS]
        ratio = "—" if math.isnan(ppl[-1]) else f"{ppl[-1] / base['perplexity']:.4f}"
        regression = "—" if name == "unpatched" else short_regression(held, name, missing="—")
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
    lines += section_mix(held)
    lines += section_split(held)
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

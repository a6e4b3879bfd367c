"""Retrieval cells on transformers + hf_posext and on vLLM, in one run: greedy answers compared
trial by trial, per-position prompt logprobs of one long document compared, lm-eval's RULER task
on both routes, each engine timed (benchmarks/results/vllm_parity.md).

    VLLM_CPU_KVCACHE_SPACE=4 python benchmarks/vllm_parity.py --vllm-python .venv-vllm/bin/python \\
        --methods yarn,linear --factor 2 --lengths 8192,16384 --tasks single_needle,niah_single \\
        --depths 0.5 --trials 3 --logprob-length 0 --lm-eval-limit 3 --lm-eval-length 16384

Both engines load the same float32 weights: the embedded SmolLM2-135M GGUF dequantized by
transformers and saved as a folder (`vllm_engine.hf_folder`). The retrieval cells run through
`evaluate_retrieval`, what `hf-posext retrieval` runs: with `engine=VllmEngine(folder)` (what
`--engine vllm` builds: the arguments `hf-posext serve --engine vllm --method M --factor S`
derives, prefix caching on, a cell's trials in one call) and without it (transformers,
`decode.answer_cell`: the shared prefix prefilled once). One grid per method, its `none` cells
left out (`skip`), so each method is one vLLM engine, started (and timed) before its cells. Times:
each row's `seconds` (the cell's trials). The first method's cells run a second time on an
engine without prefix caching (--no-prefix-cache-run skips it). --lm-eval-limit N runs
`hf-posext lm-eval --model hf-posext-vllm` and `--model hf-posext` on N samples of the RULER
task (--lm-eval-method, s = --factor), each timed as a whole command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from vllm_parity_report import report

import hf_posext
from hf_posext.data import embedded
from hf_posext.evaluation.retrieval import RetrievalGrid, evaluate_retrieval, get_task, load_haystack, vllm_engine
from hf_posext.evaluation.retrieval.decode import answer_cell
from hf_posext.evaluation.retrieval.stats import score_trial

OUT = Path(__file__).resolve().parent / "results" / "vllm_parity.json"


def logprobs(model, ids: list[int]) -> list[float]:
    """transformers' per-position logprob of each token given the ones before (position 1 on),
    the LM head in chunks (a 16k × vocab float32 matrix would take 3 GB)."""
    with torch.inference_mode():
        hidden = model.model(torch.tensor([ids])).last_hidden_state[0]
        out = []
        for start in range(0, len(ids) - 1, 1024):
            h = hidden[start:min(start + 1024, len(ids) - 1)]
            lp = torch.log_softmax(model.lm_head(h).double(), dim=-1)
            target = torch.tensor(ids[start + 1:start + 1 + len(h)])
            out += lp.gather(1, target[:, None])[:, 0].tolist()
    return out


def save(out: str, result: dict) -> None:
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    Path(out).with_suffix(".md").write_text(report([(result, out)], str(Path(out).with_suffix(".md"))))


def grid_for(method: str, args) -> RetrievalGrid:
    """The method's cells of the run (its `none` cells left out: one engine per method)."""
    lengths = [int(x) for x in args.lengths.split(",")]
    return RetrievalGrid([method], lengths, depths=[float(x) for x in args.depths.split(",")],
                         tasks=[t.strip() for t in args.tasks.split(",") if t.strip()],
                         trials=args.trials, factors=[args.factor],
                         skip=[("none", n, 1.0) for n in lengths])


def recorded(answer, texts: list[list[str]]):
    """`answer_cell` that also keeps each cell's full texts (the rows keep 60 characters)."""
    def wrapped(*a, **k):
        texts.append(answer(*a, **k))
        return texts[-1]
    return wrapped


class RecordingEngine(vllm_engine.VllmEngine):
    """The suite's vLLM engine, each cell's full answer texts kept."""
    texts: list[list[str]]

    def answer(self, *args, **kwargs) -> list[str]:
        self.texts.append(super().answer(*args, **kwargs))
        return self.texts[-1]


def compare(t_rows, v_rows, t_texts, v_texts, caching: bool) -> list[dict]:
    """One entry per cell: the answers that differ (full texts), correct counts, both times."""
    out = []
    for i, v in enumerate(v_rows):
        row = dict(task=v["task"], method=v["method"], factor=v["factor"], length=v["length"],
                   depth=v["depth"], prefix_caching=caching, trials=v["trials"],
                   prefix_tokens=v["prefix_tokens"], vllm_s=round(v["seconds"], 1),
                   answers_vllm=v_texts[i])
        if t_rows is not None:
            t, expected = t_rows[i], ["/".join(a) for a in v["answers"]]
            assert (t["task"], t["method"], t["length"], t["depth"]) == \
                (v["task"], v["method"], v["length"], v["depth"])
            multi = get_task(v["task"]).multi_answer
            row.update(transformers_s=round(t["seconds"], 1), correct_transformers=t["correct"],
                       correct_vllm=v["correct"], answers_transformers=t_texts[i],
                       differ=[dict(seed=seed, transformers=a, vllm=b, expected=e)
                               for seed, a, b, e in zip(range(v["trials"]), t_texts[i], v_texts[i],
                                                        expected) if a != b])
            assert sum(score_trial(a, e.split("/"), multi) == 1.0
                       for a, e in zip(t_texts[i], expected)) == t["correct"]
        out.append(row)
    return out


def lm_eval(route: str, args, method: str, work: Path) -> dict:
    """`hf-posext lm-eval --model ROUTE` on the RULER task: its score, responses and wall time."""
    limit, length = args.lm_eval_limit, args.lm_eval_length
    model_args = f"pretrained={embedded.DEFAULT_MODEL},method={method},factor={args.factor:g}," \
                 f"dtype=float32,max_length={length}" + (",enforce_eager=True" if route.endswith("vllm") else "")
    argv = ["lm-eval", "--model", route, "--model_args", model_args, "--tasks", args.lm_eval_task,
            "--metadata", json.dumps({"max_seq_lengths": [length]}), "--limit", str(limit),
            "--batch_size", "1"]
    out = work / route
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           **({vllm_engine.PYTHON_ENV: args.vllm_python} if args.vllm_python else {})}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hf_posext.cli", *argv, "--log_samples", "--output_path",
                    str(out)], env=env, check=True)
    seconds = time.perf_counter() - started
    results = json.loads(sorted(out.rglob("results_*.json"))[-1].read_text())["results"]
    samples = [json.loads(x) for x in sorted(out.rglob(f"samples_{args.lm_eval_task}_*.jsonl"))[-1]
               .read_text().splitlines()]
    return dict(task=args.lm_eval_task, length=length, samples=len(samples), model=route,
                score=results[args.lm_eval_task][f"{length},none"], seconds=round(seconds, 1),
                command="hf-posext " + shlex.join(argv),
                responses={str(s["doc_id"]): s["resps"][0][0] for s in samples},
                prompts={str(s["doc_id"]): s["prompt_hash"] for s in samples})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-python", default=None)
    p.add_argument("--methods", default="linear,yarn", help="the last one also runs the logprob "
                   "comparison")
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--lengths", default="8192")
    p.add_argument("--depths", default="0.5")
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--tasks", default="single_needle", help="retrieval tasks, comma-separated")
    p.add_argument("--logprob-length", type=int, default=16384,
                   help="tokens of Hamlet for the logprob comparison (0: none)")
    p.add_argument("--no-prefix-cache-run", action="store_true")
    p.add_argument("--lm-eval-task", default="niah_single_1")
    p.add_argument("--lm-eval-method", default="yarn")
    p.add_argument("--lm-eval-limit", type=int, default=0, help="samples of the lm-eval task (0: none)")
    p.add_argument("--lm-eval-length", type=int, default=16384)
    p.add_argument("--title", default="Run", help="the run's section title on the page")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--report", default=None, help="only write the page (--out's .md) of these "
                   "runs' JSON files (comma-separated)")
    args = p.parse_args()
    if args.report:
        kept = [k for k in args.report.split(",") if k]
        page = Path(args.out).with_suffix(".md")
        page.write_text(report([(json.loads(Path(k).read_text()), k) for k in kept], str(page)))
        return
    torch.set_num_threads(2)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    folder = vllm_engine.hf_folder(embedded.DEFAULT_MODEL)
    tok = embedded.load_tokenizer()
    haystack = load_haystack(tok, "noise", max(int(x) for x in args.lengths.split(",")))
    result: dict[str, Any] = {"title": args.title,
              "command": shlex.join(["python", "benchmarks/vllm_parity.py", *sys.argv[1:]]),
              "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
              "model": "SmolLM2-135M (embedded GGUF, dequantized, float32)", "cells": [], "logprobs": [],
              "engines": [], "lm_eval": [], "load": f"{os.getloadavg()[0]:.1f}"}
    model = hf_posext.from_pretrained(str(folder), dtype=torch.float32).eval()
    planning = vllm_engine.planning_model(folder)
    stop = vllm_engine.stop_ids(model)
    hamlet = next(q for q in embedded.play_paths() if q.stem == "hamlet")
    doc = [tok.bos_token_id] + tok(hamlet.read_text(), add_special_tokens=False)["input_ids"]
    doc = doc[:args.logprob_length]
    trained = embedded.TRAINED_CONTEXT
    for method in methods:
        grid = grid_for(method, args)
        # the prefix cache's effect: the first method's cells again on an engine without it
        variants = [True] if args.no_prefix_cache_run or method != methods[0] else [False, True]
        t_rows = t_texts = None
        for caching in variants:
            engine = RecordingEngine(folder, python=args.vllm_python, prefix_caching=caching,
                                     engine_args={"enforce_eager": True})
            engine.texts = []
            started = time.perf_counter()
            cells = grid.cells(trained)
            engine.plan(cells)   # what check() has vLLM's EngineArgs validate
            (kwargs,) = {json.dumps(k, sort_keys=True): k for k in (
                engine.engine_kwargs(c.method, c.factor, c.knobs, c.length) for c in cells)}.values()
            version = engine.check()
            engine.generate(kwargs, [[tok.bos_token_id]], [1], stop)   # engine start-up
            startup = time.perf_counter() - started
            result["engines"].append(dict(method=method, factor=args.factor, prefix_caching=caching,
                                          vllm=version, startup_s=round(startup, 1),
                                          kwargs={k: v for k, v in kwargs.items() if k != "model"}))
            print(f"vLLM {version} {method} s={args.factor:g} caching={caching}: up in {startup:.0f} s",
                  flush=True)
            v_rows = evaluate_retrieval(planning, tok, grid, haystack=haystack, engine=engine,
                                        reuse_identical=False, progress=False)
            if caching:   # transformers once per method, after vLLM (its engine still up)
                t_texts = []
                t_rows = evaluate_retrieval(model, tok, grid, haystack=haystack, reuse_identical=False,
                                            answer_fn=recorded(answer_cell, t_texts), progress=False)
            result["cells"] += compare(t_rows if caching else None, v_rows, t_texts or [], engine.texts, caching)
            print(json.dumps(result["cells"][-len(v_rows):])[:2000], flush=True)
            save(args.out, result)
            doc = doc[:kwargs["max_model_len"] - 1]   # vLLM: prompt + the 1 token it generates
            if caching and len(doc) > 1 and method == methods[-1]:
                result["logprobs"].append(compare_logprobs(model, engine, kwargs, doc, method, args.factor))
                save(args.out, result)
            engine.close()
    if args.lm_eval_limit:
        with tempfile.TemporaryDirectory() as work:
            runs = [lm_eval(route, args, args.lm_eval_method, Path(work)) for route in ("hf-posext-vllm", "hf-posext")]
        same = sum(runs[0]["responses"].get(k) == v for k, v in runs[1]["responses"].items())
        prompts = sum(runs[0]["prompts"].get(k) == v for k, v in runs[1]["prompts"].items())
        for r in runs:
            r["same_responses"], r["same_prompts"] = same, prompts
        result["lm_eval"] = runs
    result["load"] += f" / {os.getloadavg()[0]:.1f}"
    save(args.out, result)
    print(f"wrote {args.out}")


def compare_logprobs(model, engine, kwargs: dict, doc: list[int], method: str, factor: float) -> dict:
    """Per-position logprobs of `doc` on both engines (the model patched as the engine runs it)."""
    hf_posext.patch(model, method, factor)
    try:
        t0 = time.perf_counter()
        ref = logprobs(model, doc)
        t_s = time.perf_counter() - t0
    finally:
        hf_posext.unpatch(model)
    t0 = time.perf_counter()
    got = engine.logprobs(kwargs, doc)[1:]
    v_s = time.perf_counter() - t0
    gaps = [abs(a - b) for a, b in zip(ref, got)]
    L = embedded.TRAINED_CONTEXT
    below, above = gaps[:L - 1], gaps[L - 1:]
    return dict(method=method, factor=factor, tokens=len(doc), max_gap=max(gaps),
                max_gap_below_L=max(below), max_gap_from_L=max(above) if above else None,
                mean_gap=sum(gaps) / len(gaps), nll_transformers=-sum(ref) / len(ref),
                nll_vllm=-sum(got) / len(got), transformers_s=round(t_s, 1), vllm_s=round(v_s, 1),
                finite=all(map(math.isfinite, got)))


if __name__ == "__main__":
    main()

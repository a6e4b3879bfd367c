"""`hf-posext extend --eval`: a quick check of the checkpoint just written, its figures for the
model card and OUT/eval/ (results files, summary.md, summary.json).

- Perplexity at L and at the new length on one document (default Hamlet from the embedded plays,
  a text no method was tuned on), truncate protocol, beside the unpatched model and the base model
  reading the same tokens with a sliding window of its trained length: `ratio_to_sliding` < 1 means
  the longer context helps.
- RULER's single needle (`niah_single`) in RULER's noise haystack at L (the unpatched model: the
  bar) and at the new length, at `--eval-depths`, `--eval-trials` needles each.

The method runs as the rope config written to OUT: the loaded model, unpatched, is evaluated with
the same method, factor and knobs (each cell patches it), so its rows carry the usual identity.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..evaluation.shared.inputs import InputError, parse_floats01
from ..portability.card import Figure

EVAL_TEXT = "embedded:shakespeare/hamlet"


def add_eval_args(p) -> None:
    g = p.add_argument_group("--eval")
    g.add_argument("--eval", action="store_true",
                   help="measure the checkpoint (perplexity at L and the new length, RULER's single "
                        "needle) and put the figures in the card and OUT/eval/")
    g.add_argument("--eval-text", default=EVAL_TEXT,
                   help=f"the text perplexity is measured on (default {EVAL_TEXT}; any `eval --dataset`)")
    g.add_argument("--eval-depths", default="0.25,0.75", help="needle depths (default 0.25,0.75)")
    g.add_argument("--eval-trials", type=int, default=2, help="needles per depth and length (default 2)")


def check_eval_args(args) -> list[float]:
    if not args.eval:
        return []
    if args.eval_trials < 1:
        raise InputError(f"--eval-trials must be at least 1, got {args.eval_trials}.")
    return parse_floats01(args.eval_depths, "--eval-depths")


def run_eval(args, out: Path, model, tokenizer, docs, depths: list[float], method: str, factor: float,
             knobs: dict) -> list[Figure]:
    """Both evaluations into OUT/eval/, the summary beside them; the card's figures returned."""
    from ..evaluation import PerplexityGrid, ResultsStore, RetrievalGrid, evaluate_perplexity, evaluate_retrieval
    from ..evaluation.shared.settings import RunInfo
    from ..evaluation.shared.summary import perplexity_section, retrieval_section, write_summary
    from ..patcher import trained_length, unpatch

    unpatch(model)
    trained = trained_length(model)
    target = round(factor * trained)
    folder = out / "eval"
    run = RunInfo(model_name=args.model)
    print(f"eval: perplexity at {trained} and {target} on {args.eval_text}", file=sys.stderr, flush=True)
    with ResultsStore(folder, "perplexity") as store:
        ppl = evaluate_perplexity(model, docs, PerplexityGrid([method], [trained, target], [factor],
                                                              knobs={method: knobs} if knobs else None,
                                                              skip=(("none", target, 1.0),)),
                                  run=run, store=store, progress=False)
    print(f"eval: niah_single at {trained} and {target}, depths {args.eval_depths}, "
          f"{args.eval_trials} trial(s) each", file=sys.stderr, flush=True)
    grid = RetrievalGrid([method], [trained, target], depths=depths, tasks=["niah_single"],
                         trials=args.eval_trials, factors=[factor], knobs={method: knobs} if knobs else None,
                         skip=(("none", target, 1.0),))   # the unpatched model past L: known to fail
    with ResultsStore(folder, "retrieval") as store:
        hits = evaluate_retrieval(model, tokenizer, grid, run=run, store=store, progress=False)
    write_summary(folder, f"{args.model} extended by {method} (s = {factor:g})",
                  [perplexity_section(ppl), retrieval_section(hits, grid.margin)])
    return figures(ppl, hits, method, target, args.eval_text)


def figures(ppl: list[dict], hits: list[dict], method: str, target: int, text: str) -> list[Figure]:
    """The card's model-index: the method's perplexity and its ratio to the sliding window at the
    new length, and its single-needle accuracy there over the depths."""
    out = []
    for r in ppl:
        if r["method"] == method and r["length"] == target and r["protocol"] == "truncate":
            out.append(Figure("perplexity", round(float(r["perplexity"]), 4), text, f"perplexity at {target} tokens"))
            if r.get("ratio_to_sliding") is not None:
                out.append(Figure("perplexity_ratio", float(r["ratio_to_sliding"]), text,
                                  f"perplexity at {target} tokens / the base model's sliding window",
                                  "< 1: the longer context helps"))
    mine = [r for r in hits if r["method"] == method and r["length"] == target]
    if mine:
        from ..evaluation.retrieval.stats import wilson
        k, n = sum(int(r["correct"]) for r in mine), sum(int(r["trials"]) for r in mine)
        low, high = wilson(k, n)
        out.append(Figure("accuracy", round(k / n, 4), "RULER noise haystack",
                          f"niah_single at {target} tokens", f"{k}/{n}, Wilson 95 % [{low:.2f}, {high:.2f}]"))
    return out

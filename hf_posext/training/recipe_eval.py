"""Stage 4 of the recipe: perplexity of the unpatched base model, the training-free extended model
and the fine-tuned model on the held-out documents, through the cell evaluator the CLI uses
(`hf_posext.evaluation.evaluate_perplexity`: truncate protocol, chunked LM head, one row per cell,
written as each cell finishes).

A row's identity is the evaluation's (docs/evaluation.md, "Identity, resume and reuse"): the
model's content — the fine-tuned checkpoint's file hashes — not its path, so a rerun of the
recipe with other settings never reuses the rows of an earlier fine-tuned model.

The evaluation runs on the main process only (the other ranks wait); `hf-posext eval` under
torchrun is the way to share a grid's cells across ranks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from ..catalog import canonical_method
from ..evaluation import PerplexityGrid, ResultsStore, RunInfo, evaluate_perplexity, format_table
from ..evaluation.shared.results import plot_perplexity
from ..evaluation.shared.distributed import Ranks
from ..evaluation.shared.identity import checkpoint_fingerprint, loaded_fingerprint, source_fingerprint
from .model import load_recipe_model

SERIES = {"base": "unpatched base (plain RoPE)", "free": "{m} s={s:g}, training-free",
          "tuned": "{m} s={s:g}, fine-tuned ({steps} steps)"}


class MainProcessOnly(Ranks):
    """One rank, whatever the launcher started: the recipe evaluates on its main process."""

    def __init__(self):
        self.state, self.rank, self.size = None, 0, 1


def draw_results(labelled, out: Path, model_name: str, method: str, s: float, doc_names) -> tuple[Path, str]:
    """`out/perplexity.png` and `out/table.txt` from (series label, row) pairs; the title says what
    the plot shows."""
    shown = [{**r, "method": label, "factor_spec": ""} for label, r in labelled]
    what = f"perplexity of the first L tokens of held-out {', '.join(doc_names)}"
    series = f"unpatched vs {method} s={s:g} training-free vs fine-tuned"
    long = len(model_name) + len(what) > 60    # keep the plot's title inside the figure
    plot = plot_perplexity(shown, Path(out) / "perplexity.png",
                           f"{model_name}:{chr(10) if long else ' '}{what}\n{series}")
    table = format_table(shown, "perplexity", f"{model_name}: {what}; {series}")
    (Path(out) / "table.txt").write_text(table + "\n")
    return plot, table


def evaluate_recipe(cfg, final_dir: Path, eval_ids, doc_names, out: Path, steps: int,
                    log=print) -> dict:
    """Evaluate and write `out/results.{csv,json}`, `out/perplexity.png`, `out/table.txt`. The
    fine-tuned model is the one saved in `final_dir`, reloaded as a user would (plain
    `AutoModelForCausalLM.from_pretrained`, rope config inside)."""

    method, s = canonical_method(cfg.model.method), float(cfg.model.factor)
    grid = PerplexityGrid(methods=[method], lengths=sorted(cfg.eval.lengths), factors=[s],
                          knobs={method: dict(cfg.model.knobs)}, chunk_size=cfg.eval.chunk_size,
                          baseline=False)
    quiet: dict = dict(progress=False, ranks=MainProcessOnly())
    labelled = []
    with ResultsStore(out, "results", resume=True) as store:
        if cfg.eval.compare_base:   # one model: cells `none` (unpatched) and `method` at s (patched)
            base = load_recipe_model(cfg.model, extend=False).eval()
            rows = evaluate_perplexity(
                base, eval_ids, grid, store=store, run=RunInfo(
                    model_name=cfg.model.name, dataset=cfg.data.source,
                    fingerprint=loaded_fingerprint(base, source_fingerprint(cfg.model.name))), **quiet)
            del base
            labelled += [(SERIES["base"] if r["method"] == "none" else SERIES["free"].format(m=method, s=s), r)
                         for r in rows]
        # The fine-tuned model exactly as saved (its rope config is already the extended one).
        kwargs = {"attn_implementation": cfg.model.attn_implementation} if cfg.model.attn_implementation else {}
        tuned = AutoModelForCausalLM.from_pretrained(final_dir, dtype=getattr(torch, cfg.model.dtype), **kwargs)
        as_is = dataclasses.replace(grid, methods=None, label=f"{method} fine-tuned")
        rows = evaluate_perplexity(tuned.eval(), eval_ids, as_is, store=store, run=RunInfo(
            model_name=f"{cfg.model.name} fine-tuned", dataset=cfg.data.source,
            fingerprint=checkpoint_fingerprint(final_dir), extra_columns={"finetune_steps": steps}),
            **quiet)
        del tuned
        labelled += [(SERIES["tuned"].format(m=method, s=s, steps=steps), r) for r in rows]
        paths = {"csv": str(store.csv_path), "json": str(store.json_path)}
    plot, table = draw_results(labelled, out, cfg.model.name, method, s, doc_names)
    log(table)
    return {"rows": [r for _, r in labelled], **paths, "plot": str(plot), "table": table}

"""Stage 4 of the recipe: perplexity of the unpatched base model, the training-free extended model
and the fine-tuned model on the held-out documents, through the evaluation the CLI uses
(`hf_posext.evaluation.evaluate_perplexity`: truncate protocol, chunked LM head, one row per cell,
written as each cell finishes).

A row's identity includes the fine-tuned model's *content* (a hash of the saved weights), so a
rerun of the recipe with other settings never reuses the rows of an earlier fine-tuned model.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..config import canonical_method
from .model import load_model

SERIES = {"base": "unpatched base (plain RoPE)", "free": "{m} s={s:g}, training-free",
          "tuned": "{m} s={s:g}, fine-tuned ({steps} steps)"}


def weights_fingerprint(final_dir: Path) -> str:
    """sha256 of the saved weight files (safetensors shards), first 16 hex digits."""
    h = hashlib.sha256()
    files = sorted(Path(final_dir).glob("*.safetensors")) or sorted(Path(final_dir).glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"no weights in {final_dir}")
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()[:16]


def draw_results(labelled, out: Path, model_name: str, method: str, s: float, doc_names) -> tuple[Path, str]:
    """`out/perplexity.png` and `out/table.txt` from (series label, row) pairs; the title says what
    the plot shows."""
    from ..evaluation import format_table, plot_perplexity
    shown = [{**r, "method": label, "factor_spec": ""} for label, r in labelled]
    title = (f"{model_name}: perplexity of the first L tokens of held-out {', '.join(doc_names)}\n"
             f"unpatched vs {method} s={s:g} training-free vs fine-tuned")
    plot = plot_perplexity(shown, Path(out) / "perplexity.png", title)
    table = format_table(shown, "perplexity", title.replace("\n", "; "))
    (Path(out) / "table.txt").write_text(table + "\n")
    return plot, table


def evaluate_recipe(cfg, final_dir: Path, eval_ids, doc_names, out: Path, steps: int,
                    log=print) -> dict:
    """Evaluate and write `out/results.{csv,json}`, `out/perplexity.png`, `out/table.txt`. The
    fine-tuned model is the one saved in `final_dir`, reloaded as a user would (plain
    `AutoModelForCausalLM.from_pretrained`, rope config inside)."""
    import torch
    from transformers import AutoModelForCausalLM
    from ..evaluation import ResultsStore, evaluate_perplexity

    method, s = canonical_method(cfg.model.method), float(cfg.model.factor)
    store = ResultsStore(out, "results", resume=True)
    common = dict(lengths=sorted(cfg.eval.lengths), store=store, dataset=cfg.data.source,
                  dtype=cfg.model.dtype, chunk_size=cfg.eval.chunk_size, progress=False)
    labelled = []
    if cfg.eval.compare_base:   # one model: cells `none` (unpatched) and `method` at s (patched)
        base = load_model(cfg.model, extend=False).eval()
        rows = evaluate_perplexity(base, eval_ids, methods=["none", method], factors=[s],
                                   model_name=f"{cfg.model.name}", **common)
        del base
        labelled += [(SERIES["base"] if r["method"] == "none" else SERIES["free"].format(m=method, s=s), r)
                     for r in rows]
    # The fine-tuned model as saved (its rope config is already the extended one): cell `none`.
    # No reuse by rotary signature: its cos/sin equal the training-free model's, its weights do not.
    identity = f"{cfg.model.name} fine-tuned sha256:{weights_fingerprint(final_dir)}"
    kwargs = {"attn_implementation": cfg.model.attn_implementation} if cfg.model.attn_implementation else {}
    tuned = AutoModelForCausalLM.from_pretrained(final_dir, dtype=getattr(torch, cfg.model.dtype), **kwargs).eval()
    rows = evaluate_perplexity(tuned, eval_ids, methods=["none"], model_name=identity,
                               reuse_identical=False, **common)
    del tuned
    labelled += [(SERIES["tuned"].format(m=method, s=s, steps=steps), r) for r in rows]
    plot, table = draw_results(labelled, out, cfg.model.name, method, s, doc_names)
    log(table)
    return {"rows": [r for _, r in labelled], "csv": str(store.csv_path), "json": str(store.json_path),
            "plot": str(plot), "table": table}

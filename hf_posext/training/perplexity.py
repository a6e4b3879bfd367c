"""Minimal chunked perplexity for the recipe's after-training comparison (truncate protocol of the
PI/YaRN papers, REFERENCE §3): the first L tokens of a document, one forward, perplexity of tokens
2..L. The decoder runs to hidden states once; the LM head and cross-entropy are applied in chunks,
so [L x vocab] logits are never built (16k x 49k fp32 would be 3.2 GB).

This is deliberately small: the project's full evaluation API lives in `hf_posext.eval`."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import torch


@torch.inference_mode()
def truncate_perplexity(model, ids: torch.Tensor, chunk_size: int = 1024) -> float:
    """exp(mean NLL) of ids[1:] given their prefixes. `ids`: LongTensor [L]."""
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError(f"ids must be a 1-D tensor of at least 2 tokens, got shape {tuple(ids.shape)}")
    device = next(model.parameters()).device
    ids = ids.to(device)
    hidden = model.get_decoder()(input_ids=ids[None], use_cache=False).last_hidden_state[0]  # [L, H]
    head = model.get_output_embeddings()
    total, count = 0.0, 0
    for start in range(0, ids.numel() - 1, chunk_size):
        stop = min(start + chunk_size, ids.numel() - 1)
        logits = head(hidden[start:stop]).float()                                        # [c, V]
        total += float(torch.nn.functional.cross_entropy(logits, ids[start + 1: stop + 1], reduction="sum"))
        count += stop - start
    return math.exp(total / count)


def write_results(rows: list[dict], out: Path, title: str = "") -> dict:
    """results.csv, results.json and perplexity.png (perplexity vs length, one line per model)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name in dict.fromkeys(r["model"] for r in rows):
        pts = {}
        for r in rows:   # mean over documents, per length
            if r["model"] == name:
                pts.setdefault(r["length"], []).append(r["perplexity"])
        xs = sorted(pts)
        ax.plot(xs, [sum(pts[x]) / len(pts[x]) for x in xs], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "perplexity.png", dpi=120)
    plt.close(fig)
    return {"rows": rows, "csv": str(out / "results.csv"), "json": str(out / "results.json"),
            "plot": str(out / "perplexity.png")}

"""Where in the context the loss falls: per-position NLL summed into position buckets.

A whole-document perplexity mixes the first L tokens (the trained length), where an extension
method can change little, with the tokens past L, where everything happens. So every cell also
keeps its NLL summed per bucket of prediction positions (position p predicts token p + 1), over
all documents, and per document: the "ratio beyond L", the NLL-vs-position curve (the Gemini 1.5
report's loss-vs-position view) and the spread over documents all come from stored rows, and a
resumed run keeps them (docs/evaluation.md, "Per-position results").

Buckets are fixed-width, L / 16 tokens wide (512 for an 8k model), with L itself always an edge,
so "beyond L" is a sum of whole buckets.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

# Per-document per-position NLL: (nll [T] float64, scored [T] bool); `nll` is meaningless where
# `scored` is False. A NaN at a scored position is a result (a broken model) and is kept.
PositionNLL = tuple[np.ndarray, np.ndarray]


def bucket_edges(length: int, trained: int) -> list[int]:
    """Bucket edges over prediction positions 0 .. length - 1: every trained // 16 positions,
    plus the trained length (if inside) and `length` itself as the last edge."""
    if length < 1 or trained < 1:
        raise ValueError(f"length and trained length must be positive, got {length}, {trained}")
    width = max(1, trained // 16)
    edges = set(range(0, length, width)) | {length}
    if trained < length:
        edges.add(trained)
    return sorted(edges)


def prefix(position_nll: PositionNLL, length: int) -> PositionNLL:
    """What a forward of only the first `length` tokens scores, read from a longer forward of a
    prefix-stable model (causal attention: logits at p see tokens 0..p only): positions below
    length - 1 unchanged, position length - 1 unscored (it would predict a token the shorter
    input does not hold)."""
    nll, scored = position_nll
    scored = scored[:length].copy()
    scored[length - 1:] = False
    return nll[:length].copy(), scored


def summarize(per_doc: Sequence[PositionNLL], length: int, trained: int) -> dict:
    """A cell's result columns from its per-document per-position NLL over `length` positions:
    totals (`nll`, `tokens`, `perplexity`), per bucket (`bucket_edges`, `bucket_nll`,
    `bucket_tokens`, summed over documents) and per document (`doc_nll`, `doc_tokens`)."""
    edges = np.asarray(bucket_edges(length, trained))
    bucket_nll = np.zeros(len(edges) - 1)
    bucket_tokens = np.zeros(len(edges) - 1, dtype=np.int64)
    doc_nll, doc_tokens = [], []
    for nll, scored in per_doc:
        where = np.nonzero(scored[:length])[0]                       # [n] scored positions
        values = nll[where]                                         # [n]
        which = np.searchsorted(edges, where, side="right") - 1     # [n] bucket of each position
        np.add.at(bucket_nll, which, values)
        np.add.at(bucket_tokens, which, 1)
        doc_nll.append(float(values.sum()))
        doc_tokens.append(int(where.size))
    total, count = float(sum(doc_nll)), int(sum(doc_tokens))
    return {"perplexity": math.exp(total / count) if count else float("nan"), "nll": total,
            "tokens": count, "bucket_edges": [int(e) for e in edges],
            "bucket_nll": [float(v) for v in bucket_nll],
            "bucket_tokens": [int(v) for v in bucket_tokens],
            "doc_nll": doc_nll, "doc_tokens": doc_tokens}


def nll_from(row: Mapping, start: int) -> tuple[float, int] | None:
    """(NLL sum, tokens) over the buckets at positions >= start, from a stored row; None when
    the row has no buckets (written before they existed) or `start` is not an edge."""
    edges = row.get("bucket_edges")
    if not edges or start not in edges:
        return None
    i = edges.index(start)
    return float(sum(row["bucket_nll"][i:])), int(sum(row["bucket_tokens"][i:]))


def doc_perplexities(row: Mapping) -> list[float]:
    """Each document's perplexity in a row (empty when the row has no per-document sums)."""
    return [math.exp(n / t) for n, t in zip(row.get("doc_nll") or [], row.get("doc_tokens") or []) if t]


def curve(row: Mapping, smooth: int = 3) -> tuple[list[float], list[float]]:
    """(bucket midpoints, mean NLL per token) of a row, each point a token-weighted mean over
    `smooth` neighbouring buckets (a centred moving window: per-bucket means of one or two
    documents are noisy)."""
    edges, nll, tokens = row["bucket_edges"], row["bucket_nll"], row["bucket_tokens"]
    xs, ys, half = [], [], smooth // 2
    for i in range(len(nll)):
        if not tokens[i]:
            continue
        lo, hi = max(0, i - half), min(len(nll), i + half + 1)
        xs.append((edges[i] + edges[i + 1]) / 2)
        ys.append(sum(nll[lo:hi]) / sum(tokens[lo:hi]))
    return xs, ys

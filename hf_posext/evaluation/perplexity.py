"""Perplexity across context lengths: the truncate and sliding-window protocols, and the grid.

Protocols (REFERENCE.md §3):
- truncate (PI and YaRN papers): the first L tokens of each document that has at least the
  largest L tokens (the same documents at every L), one forward per document; L-1 tokens scored.
- sliding (Press et al.; Hugging Face "Perplexity of fixed-length models"): windows of W tokens
  whose ends advance by the stride S over the first T tokens of each document (T = the largest
  length unless given); each prediction is scored exactly once, by the window that first covers
  it, so every token gets between W-S and W tokens of context. With S = W the windows are
  independent blocks.

Aggregation is token-weighted: exp(sum of NLL / number of scored tokens) over all documents and
windows, never a mean of per-window perplexities.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Sequence

import numpy as np
import torch

from ..patcher import is_patched, trained_length, unpatch
from ..registry import rotary_modules
from .grid import Cell, apply_method, knobs_for, method_factors
from .loss import IGNORE_INDEX, PeakMemory, causal_targets, chunked_nll

PROTOCOLS = ("truncate", "sliding")
DEFAULT_STRIDE = 256  # the papers' sliding-window stride


# --- the two protocols -------------------------------------------------------------------------

def sliding_windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first_scored) of each window over n_tokens tokens.

    Every window is [end - window, end); window ends are window, window + stride, ..., n_tokens.
    Prediction positions first_scored .. end-1 are scored in that window (position p predicts
    token p + 1; the last token predicts nothing), so positions 0 .. n_tokens-2 are each scored
    exactly once."""
    if window <= 0 or stride <= 0:
        raise ValueError(f"window and stride must be positive, got window={window}, stride={stride}")
    if stride > window:
        raise ValueError(f"stride {stride} > window {window} would leave tokens unscored; use a "
                         "stride at most the window length.")
    if n_tokens < window:
        raise ValueError(f"a {window}-token window needs at least {window} tokens, got {n_tokens}")
    out, end, prev_end = [], window, 0
    while True:
        out.append((end - window, end, prev_end))
        if end == n_tokens:
            return out
        prev_end, end = end, min(end + stride, n_tokens)


def truncate_nll(model, docs: Sequence[np.ndarray], length: int, chunk_size: int = 1024,
                 progress: bool = False) -> tuple[float, int]:
    """Sum of NLL and scored tokens over the first `length` tokens of each document."""
    total, count = 0.0, 0
    for i, doc in enumerate(docs):
        if len(doc) < length:
            raise ValueError(f"document {i} has {len(doc)} tokens, fewer than length {length}")
        ids = torch.as_tensor(doc[:length], dtype=torch.long)  # [L]
        nll, n = chunked_nll(model, ids, causal_targets(ids), chunk_size, progress,
                             desc=f"doc {i + 1}/{len(docs)} L={length}")
        total, count = total + nll, count + n
    return total, count


def sliding_nll(model, docs: Sequence[np.ndarray], window: int, stride: int,
                eval_tokens: int | None = None, chunk_size: int = 1024,
                progress: bool = False) -> tuple[float, int]:
    """Sum of NLL and scored tokens over the first `eval_tokens` tokens (default: all) of each
    document, with `window`-token windows whose ends advance by `stride`."""
    total, count = 0.0, 0
    for i, doc in enumerate(docs):
        doc = torch.as_tensor(doc[:eval_tokens] if eval_tokens else doc, dtype=torch.long)  # [T]
        n = doc.numel()
        for start, end, first in sliding_windows(n, window, stride):
            ids = doc[start:end]                                     # [W]
            targets = torch.full_like(ids, IGNORE_INDEX)             # [W]
            # window position j is document position start + j; it predicts doc[start + j + 1]
            lo, hi = first - start, min(end, n - 1) - start
            targets[lo:hi] = doc[start + lo + 1:start + hi + 1]
            nll, k = chunked_nll(model, ids, targets, chunk_size, progress and window >= 4096,
                                 desc=f"doc {i + 1}/{len(docs)} window ..{end}")
            total, count = total + nll, count + k
    return total, count


# --- rope signature: skip cells whose positions are encoded exactly as an earlier cell's ------

@torch.inference_mode()
def rope_signature(model, seq_len: int) -> str:
    """A hash of the cos/sin every rotary module produces for positions 0..seq_len-1.

    A patch changes only the rotary modules, so two cells with equal signatures at the forward
    length compute bit-identical logits (e.g. a static method at factor 1 and the unpatched
    model). Dynamic modules are run at seq_len, exactly as the forward will run them."""
    h = hashlib.sha256()
    for _, _, module in rotary_modules(model):
        x = torch.zeros(1, dtype=torch.float32, device=module.inv_freq.device)
        pos = torch.arange(seq_len, device=module.inv_freq.device)[None]  # [1, n]
        cos, sin = module(x, pos)                                           # [1, n, d] each
        h.update(cos.float().cpu().numpy().tobytes())
        h.update(sin.float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


# --- the grid ----------------------------------------------------------------------------------

def plan_cells(methods, lengths, factors, protocols, trained: int, knobs=None) -> list[Cell]:
    """Cells in run order: by protocol, then length (short first), then method (`none` first)."""
    return [Cell(method, spec, s, length, protocol, knobs_for(method, knobs or {}))
            for protocol in protocols
            for length in sorted(set(lengths))
            for method, spec, s in method_factors(methods, factors, length, trained)]


def evaluate_perplexity(model, docs: Sequence[np.ndarray], *, methods: Sequence[str],
                        lengths: Sequence[int], factors: Sequence = ("auto",),
                        protocols: Sequence[str] = ("truncate",), stride: int = DEFAULT_STRIDE,
                        eval_tokens: int | None = None, store=None, model_name: str = "model",
                        dataset: str = "", data_hash: str | None = None, dtype: str = "",
                        device: str = "cpu", chunk_size: int = 1024, reuse_identical: bool = True,
                        progress: bool = True, knobs: dict | None = None) -> list[dict]:
    """Perplexity of every (method, factor, length, protocol) cell on one loaded model.

    Args:
        docs: token ids per document (each [n_i]); for truncate each must have >= max(lengths)
            tokens, for sliding >= eval_tokens (default max(lengths)).
        methods: names from hf_posext.METHODS; `none` (unpatched) is always added.
        factors: numbers >= 1 and/or "auto" (s = max(1, length / trained length)).
        store: a `ResultsStore`; each row is written to it as soon as its cell finishes, and
            cells it already holds are skipped (resume).
        reuse_identical: a cell whose rotary cos/sin at its forward length equal an earlier
            cell's (same data, length, protocol) copies that result instead of recomputing;
            the row says so in `same_as`.
    Returns the rows of this run (computed, reused and resumed), in cell order.
    """
    from tqdm.auto import tqdm

    for p in protocols:
        if p not in PROTOCOLS:
            raise ValueError(f"Unknown protocol {p!r}; use one of {', '.join(PROTOCOLS)}.")
    trained = trained_length(model)
    eval_tokens = eval_tokens or max(lengths)
    need = max(max(lengths) if "truncate" in protocols else 0, eval_tokens if "sliding" in protocols else 0)
    short = [i for i, d in enumerate(docs) if len(d) < need]
    if short:
        raise ValueError(f"documents {short} have fewer than the {need} tokens this grid needs")
    if data_hash is None:
        h = hashlib.sha256()
        for d in docs:
            h.update(np.asarray(d, dtype=np.int32).tobytes())
        data_hash = h.hexdigest()[:12]
    ctx = {"model": model_name, "stride": stride, "eval_tokens": eval_tokens, "data_hash": data_hash,
           "dtype": dtype}
    cells = plan_cells(methods, lengths, factors, protocols, trained, knobs)
    signatures: dict[tuple, dict] = {}   # (protocol, length, signature) -> the row that computed it
    for row in (store.rows if store is not None else []):
        if row.get("rope_signature") and row.get("data_hash") == data_hash:
            signatures.setdefault((row["protocol"], int(row["length"]), row["rope_signature"]), row)
    rows = []
    bar = tqdm(cells, desc="perplexity cells", unit="cell", disable=not progress)
    for cell in bar:
        stride_k = ctx["stride"] if cell.protocol == "sliding" else ""
        tokens_k = ctx["eval_tokens"] if cell.protocol == "sliding" else ""
        key = "|".join(map(str, (ctx["model"], cell.method, f"{cell.factor:.6g}", cell.length,
                                 cell.protocol, stride_k, tokens_k, ctx["data_hash"], ctx["dtype"],
                                 sorted(cell.knobs.items()) if cell.knobs else "")))
        bar.set_postfix_str(f"{cell.protocol} {cell.method} s={cell.factor:g} L={cell.length}")
        if store is not None and store.has(key):
            rows.append(store.get(key))
            continue
        try:
            apply_method(model, cell.method, cell.factor, cell.knobs)
            forward_len = cell.length
            signature = rope_signature(model, forward_len)
            source = signatures.get((cell.protocol, cell.length, signature)) if reuse_identical else None
            started = time.perf_counter()
            if source is not None:
                nll, count, peak = source["nll"], source["tokens"], None
            else:
                with PeakMemory(device) as peak:
                    if cell.protocol == "truncate":
                        nll, count = truncate_nll(model, docs, cell.length, chunk_size, progress)
                    else:
                        nll, count = sliding_nll(model, docs, cell.length, stride, eval_tokens,
                                                 chunk_size, progress)
            seconds = time.perf_counter() - started
        finally:
            if is_patched(model):
                unpatch(model)
        row = {
            "model": model_name, "method": cell.method, "factor": cell.factor,
            "factor_spec": cell.factor_spec, "length": cell.length, "protocol": cell.protocol,
            "stride": stride if cell.protocol == "sliding" else None,
            "eval_tokens": eval_tokens if cell.protocol == "sliding" else None,
            "perplexity": math.exp(nll / count), "nll": nll, "tokens": count, "docs": len(docs),
            "seconds": round(seconds, 3),
            "peak_rss_mb": round(peak.peak_mb, 1) if peak else None,
            "peak_increase_mb": round(peak.increase_mb, 1) if peak else None,
            "trained_length": trained, "dataset": dataset, "data_hash": data_hash, "dtype": dtype,
            "device": str(device), "rope_signature": signature,
            "same_as": (f"{source['method']} s={source['factor']:g}" if source is not None else ""),
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "key": key,
        }
        signatures.setdefault((cell.protocol, cell.length, signature), row)
        if store is not None:
            store.add(row)
        rows.append(row)
    return rows

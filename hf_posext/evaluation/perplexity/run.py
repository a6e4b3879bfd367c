"""Perplexity across context lengths: the truncate and sliding-window protocols, and the grid.

Protocols (docs/evaluation.md, "What is measured"):
- truncate (PI and YaRN papers): the first L tokens of each document that has at least the
  largest L tokens (the same documents at every L), one forward per document; L-1 tokens scored.
- sliding (Press et al.; Hugging Face "Perplexity of fixed-length models"): windows of W tokens
  whose ends advance by the stride S over the first T tokens of each document (T = the largest
  length unless given); each prediction is scored exactly once, by the window that first covers
  it, so every token gets between W-S and W tokens of context. With S = W the windows are
  disjoint, each scored on its own.

Aggregation is token-weighted: exp(sum of NLL / number of scored tokens) over all documents and
windows, never a mean of per-window perplexities.
"""

from __future__ import annotations

import hashlib
import math
from functools import partial
from typing import Callable, Sequence

import numpy as np
import torch

from ...patcher import trained_length
from ..shared.grid import Cell, run_grid
from ..shared.identity import model_dtype, rope_prefix_stable, run_identity
from ..shared.inputs import check_device
from .buckets import PositionNLL, nll_from, prefix, summarize
from .loss import IGNORE_INDEX, PeakMemory, causal_targets, token_nll
from ..shared.settings import PerplexityGrid, RunInfo, settings_only

# What a cell computes (copied to a cell that computes the same logits, see `grid.run_grid`).
RESULT_FIELDS = ("perplexity", "nll", "tokens", "bucket_edges", "bucket_nll", "bucket_tokens",
                 "doc_nll", "doc_tokens", "bytes", "bits_per_byte")


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


def truncate_positions(model, docs: Sequence[np.ndarray], length: int, chunk_size: int = 1024,
                       progress: bool = False) -> list[PositionNLL]:
    """Per-position NLL of the first `length` tokens of each document: positions 0..length-2
    scored (position p predicts token p + 1)."""
    out = []
    for i, doc in enumerate(docs):
        if len(doc) < length:
            raise ValueError(f"document {i} has {len(doc)} tokens, fewer than length {length}")
        ids = torch.as_tensor(doc[:length], dtype=torch.long)  # [L]
        targets = causal_targets(ids)                          # [L]
        nll = token_nll(model, ids, targets, chunk_size, progress,
                        desc=f"doc {i + 1}/{len(docs)} L={length}")
        out.append((nll.numpy(), (targets != IGNORE_INDEX).numpy()))
    return out


def truncate_nll(model, docs: Sequence[np.ndarray], length: int, chunk_size: int = 1024,
                 progress: bool = False) -> tuple[float, int]:
    """Sum of NLL and scored tokens over the first `length` tokens of each document."""
    return _total(truncate_positions(model, docs, length, chunk_size, progress))


def sliding_positions(model, docs: Sequence[np.ndarray], window: int, stride: int,
                      eval_tokens: int | None = None, chunk_size: int = 1024,
                      progress: bool = False,
                      first_window: Sequence[PositionNLL] | None = None) -> list[PositionNLL]:
    """Per-position NLL over the first `eval_tokens` tokens (default: all) of each document,
    each position scored once, by the first `window`-token window (ends `stride` apart) that
    covers it; positions are document positions, so buckets line up with a truncate cell's.
    `first_window`: per document, a per-position NLL that already holds the first window's
    positions 0..window-1 (the same model's forward of more than `window` tokens: with causal
    attention its first `window` positions are that window's forward), so it is not run again."""
    out = []
    for i, doc in enumerate(docs):
        doc = torch.as_tensor(doc[:eval_tokens] if eval_tokens else doc, dtype=torch.long)  # [T]
        n = doc.numel()
        nll_doc = np.full(n, np.nan)                                 # [T]
        scored_doc = np.zeros(n, dtype=bool)                         # [T]
        windows = sliding_windows(n, window, stride)
        if first_window is not None and n > window:
            head_nll, head_scored = first_window[i]
            if not head_scored[:window].all():
                raise ValueError("first_window must score positions 0..window-1 of every document")
            windows.pop(0)                                           # (0, window, 0)
            nll_doc[:window], scored_doc[:window] = head_nll[:window], True
        for start, end, first in windows:
            ids = doc[start:end]                                     # [W]
            targets = torch.full_like(ids, IGNORE_INDEX)             # [W]
            # window position j is document position start + j; it predicts doc[start + j + 1]
            lo, hi = first - start, min(end, n - 1) - start
            targets[lo:hi] = doc[start + lo + 1:start + hi + 1]
            nll = token_nll(model, ids, targets, chunk_size, progress and window >= 4096,
                            desc=f"doc {i + 1}/{len(docs)} window ..{end}")
            nll_doc[start + lo:start + hi] = nll[lo:hi].numpy()
            scored_doc[start + lo:start + hi] = True
        out.append((nll_doc, scored_doc))
    return out


def sliding_nll(model, docs: Sequence[np.ndarray], window: int, stride: int,
                eval_tokens: int | None = None, chunk_size: int = 1024,
                progress: bool = False) -> tuple[float, int]:
    """Sum of NLL and scored tokens over the first `eval_tokens` tokens (default: all) of each
    document, with `window`-token windows whose ends advance by `stride`."""
    return _total(sliding_positions(model, docs, window, stride, eval_tokens, chunk_size, progress))


def _total(per_doc: Sequence[PositionNLL]) -> tuple[float, int]:
    return float(sum(nll[scored].sum() for nll, scored in per_doc)), int(sum(s.sum() for _, s in per_doc))


# --- the grid ----------------------------------------------------------------------------------

def cell_positions(model, docs: Sequence[np.ndarray], cell: Cell,
                   progress: bool = False) -> list[PositionNLL]:
    """The one cell evaluator: per-document per-position NLL of the model, as it is, for a cell."""
    chunk = cell.extra.get("chunk_size", 1024)
    if cell.protocol == "truncate":
        return truncate_positions(model, docs, cell.length, chunk, progress)
    return sliding_positions(model, docs, cell.extra["window"], cell.extra["stride"],
                             cell.extra["eval_tokens"], chunk, progress)


def scored_span(cell: Cell) -> int:
    """How many document positions a cell's per-position NLL covers."""
    return cell.length if cell.protocol == "truncate" else cell.extra["eval_tokens"]


class SharedForwards:
    """One forward per document serves every truncate length of a (method, s, knobs) group.

    With causal attention, the loss of the first N tokens is the same in a forward of M > N
    tokens whenever the rotary cos/sin of positions < N do not depend on the sequence length
    (`identity.rope_prefix_stable`: true for static methods at a fixed s and for the attention
    methods, whose knobs are fixed by s; false for dynamic types and `longrope`). So a length
    grid at a fixed s costs one forward of its longest length per document, not one per length.
    Checked per cell against the model as patched; where it does not hold, the cell runs alone.
    The sliding baseline's first window is the same: the unpatched model over tokens
    0..window-1, so when this process also runs the unpatched model at a longer length, the
    baseline takes that window from its forward (one window fewer per document).
    """

    def __init__(self, model, docs: Sequence[np.ndarray], progress: bool = False):
        self.model, self.docs, self.progress = model, docs, progress
        self.longest: dict[tuple, int] = {}
        self.left: dict[tuple, int] = {}
        self.cache: dict[tuple, tuple[int, list[PositionNLL]]] = {}

    @staticmethod
    def group(cell: Cell) -> tuple:
        return (cell.method, cell.factor, tuple(sorted((k, str(v)) for k, v in cell.knobs.items())),
                cell.as_is, cell.extra.get("chunk_size"))

    def plan(self, cells: Sequence[Cell]) -> None:
        """The cells this process will compute (resumed and reused ones are not forwarded)."""
        for table in (self.longest, self.left, self.cache):
            table.clear()
        for c in cells:
            if c.protocol == "truncate":
                g = self.group(c)
                self.longest[g] = max(self.longest.get(g, 0), c.length)
                self.left[g] = self.left.get(g, 0) + 1
        for c in cells:   # a baseline is the unpatched group's: method none, s 1, no knobs
            if c.protocol == "baseline" and self.longest.get(self.group(c), 0) > c.extra["window"]:
                self.left[self.group(c)] += 1

    def _forward(self, g: tuple, longest: int, chunk: int) -> list[PositionNLL]:
        if g not in self.cache:
            self.cache[g] = (longest, truncate_positions(self.model, self.docs, longest, chunk,
                                                         self.progress))
        return self.cache[g][1]

    def _release(self, g: tuple) -> None:
        self.left[g] = self.left.get(g, 1) - 1
        if self.left[g] <= 0:
            self.cache.pop(g, None)

    def _baseline(self, cell: Cell) -> list[PositionNLL]:
        g, window, chunk = self.group(cell), cell.extra["window"], cell.extra.get("chunk_size", 1024)
        longest = self.cache[g][0] if g in self.cache else self.longest.get(g, 0)
        head = None
        if longest > window:
            if rope_prefix_stable(self.model, window + 1, longest):
                head = [prefix(p, window + 1) for p in self._forward(g, longest, chunk)]
            self._release(g)
        return sliding_positions(self.model, self.docs, window, cell.extra["stride"],
                                 cell.extra["eval_tokens"], chunk, self.progress, first_window=head)

    def positions(self, cell: Cell) -> tuple[list[PositionNLL], int]:
        """(per-document per-position NLL of the cell, the forward length it came from)."""
        if cell.protocol == "baseline":
            return self._baseline(cell), cell.extra["window"]
        if cell.protocol != "truncate":
            return cell_positions(self.model, self.docs, cell, self.progress), cell.extra["window"]
        g = self.group(cell)
        longest = self.cache[g][0] if g in self.cache else self.longest.get(g, cell.length)
        shared = g in self.cache or longest > cell.length or self.left.get(g, 0) > 1   # > 1: a baseline too
        if not shared or (cell.length < longest and
                          not rope_prefix_stable(self.model, cell.length, longest)):
            self._release(g)
            return cell_positions(self.model, self.docs, cell, self.progress), cell.length
        out = [prefix(p, cell.length) for p in self._forward(g, longest, cell.extra.get("chunk_size", 1024))]
        self._release(g)
        return out, longest


def annotate(rows: list[dict]) -> None:
    """The derived columns of a perplexity grid (docs/evaluation.md, "Reading the table"):
    - `ratio_to_sliding`: perplexity / the sliding baseline's over the same tokens (< 1: the
      longer context helps), on truncate rows whose length has a baseline row;
    - `ratio_to_sliding_beyond_L`: the same over the tokens past the trained length L only
      (from the position buckets), where an extension can make a difference;
    - `ratio_to_unpatched`: at lengths <= L, perplexity / the unpatched model's over the same
      tokens (> 1: the method costs short prompts: short-context regression)."""
    base = {(r["length"], r.get("data_hash")): r for r in rows if r["protocol"] == "baseline"}
    plain = {(r["length"], r.get("data_hash")): r for r in rows
             if r["protocol"] == "truncate" and r["method"] == "none"}
    for r in rows:
        where = (r["length"], r.get("data_hash"))
        b = base.get(where) if r["protocol"] == "truncate" else None
        r["ratio_to_sliding"] = round(r["perplexity"] / b["perplexity"], 4) if b else None
        r["ratio_to_sliding_beyond_L"] = _beyond_ratio(r, b) if b else None
        u = plain.get(where)
        short = r["protocol"] == "truncate" and r["method"] != "none" and \
            r["length"] <= int(r.get("trained_length") or 0)
        r["ratio_to_unpatched"] = round(r["perplexity"] / u["perplexity"], 4) if short and u else None


def _beyond_ratio(row: dict, base: dict) -> float | None:
    L = int(row.get("trained_length") or 0)
    a, b = nll_from(row, L), nll_from(base, L)
    if not a or not b or not a[1] or a[1] != b[1]:
        return None   # rows without buckets, or not the same tokens
    return round(math.exp(a[0] / a[1] - b[0] / b[1]), 4)


@settings_only(PerplexityGrid)
def evaluate_perplexity(model, docs: Sequence[np.ndarray], grid: PerplexityGrid, *,
                        run: RunInfo | None = None, store=None, ranks=None, progress: bool = True,
                        reuse_identical: bool = True,
                        text_bytes: Callable[[int], int] | None = None) -> list[dict]:
    """Perplexity of every (method, factor, length, protocol) cell of `grid` on one loaded model.

    Args:
        docs: token ids per document (each [n_i]); each needs `grid.tokens_needed()` tokens.
        grid: what to measure (`settings.PerplexityGrid`); run: whose run it is (`RunInfo`,
            default `RunInfo()`), e.g. `evaluate_perplexity(model, docs,
            PerplexityGrid(["yarn"], [4096, 16384]), run=RunInfo(model_name="smollm2"))`.
        store: a `store.RowStore`; each row is written as soon as its cell finishes, and cells
            whose key it holds are skipped (resume). The key covers the model's content
            (`run.fingerprint`, else a hash of its weights), dtype, device, attention, data and
            every cell setting (docs/evaluation.md, "Identity, resume and reuse").
        reuse_identical: a cell computing the same logits as an earlier one (same rotary
            cos/sin, attention and data) copies its result; the row says so in `same_as`.
        ranks: a `distributed.Ranks` (default: from the launcher's environment).
        text_bytes: n -> UTF-8 bytes of the scored text of the first n tokens of every document
            (tokens 1..n-1); with it, rows gain `bytes` and `bits_per_byte` (comparable across
            tokenizers).
    Each row also holds its NLL per position bucket and per document (`buckets.summarize`),
    and truncate cells of one (method, s, knobs) share one forward per document at their longest
    length wherever that is exact (`SharedForwards`; the row's `forward_length` says which).
    With a baseline, truncate rows gain `ratio_to_sliding` and the other ratios (`annotate`).
    Returns the rows of this run (computed, reused and resumed), in cell order.
    """
    if not isinstance(grid, PerplexityGrid):
        raise TypeError(f"grid must be a PerplexityGrid(methods=..., lengths=...), got {type(grid).__name__}.")
    run = run or RunInfo()
    check_device(run.device, "device=")
    if run.dtype not in (None, "", "auto") and model_dtype(model) != run.dtype:
        raise ValueError(f"dtype={run.dtype!r} but the model runs in {model_dtype(model)}.")
    trained = trained_length(model)
    short = [i for i, d in enumerate(docs) if len(d) < grid.tokens_needed()]
    if short:
        raise ValueError(f"documents {short} have fewer than the {grid.tokens_needed()} tokens "
                         "this grid needs")
    identity = run_identity(model, fingerprint=run.fingerprint, device=run.device,
                            data_hash=run.data_hash or _tokens_hash(docs))
    base_row = {"model": run.model_name, "dataset": run.dataset, "docs": len(docs),
                "trained_length": trained, **run.extra_columns}
    forwards = SharedForwards(model, docs, progress)
    return run_grid(model, grid.cells(trained), identity=identity, base_row=base_row,
                    compute=partial(_cell_result, forwards, trained, run.device, text_bytes),
                    result_fields=RESULT_FIELDS, forward_lengths=lambda c: [c.extra["window"]],
                    store=store, reuse=reuse_identical, ranks=ranks, progress=progress,
                    desc="perplexity cells", annotate=annotate, prepare=forwards.plan)


def _tokens_hash(docs: Sequence[np.ndarray]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(np.asarray(d, dtype=np.int32).tobytes())
    return h.hexdigest()[:12]


def _cell_result(forwards: SharedForwards, trained: int, device: str,
                 text_bytes: Callable[[int], int] | None, cell: Cell) -> dict:
    """One cell's result: its per-position NLL summarised, bits per byte, memory."""
    with PeakMemory(device) as peak:
        per_doc, forward = forwards.positions(cell)
    span = scored_span(cell)
    result = summarize(per_doc, span, trained)
    if text_bytes is not None:
        n_bytes = int(text_bytes(span))
        result.update(bytes=n_bytes, bits_per_byte=result["nll"] / math.log(2) / n_bytes
                      if n_bytes else None)
    return {**result, "forward_length": forward, "peak_rss_mb": round(peak.peak_mb, 1),
            "peak_increase_mb": round(peak.increase_mb, 1)}

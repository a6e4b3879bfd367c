"""Memory-bounded attention over a plan of parts, merged by log-sum-exp.

A method's plan (plans.py) splits the keys of each query chunk into parts; in each part every
query has one position and every key one position (positions.py), so the part is an ordinary
scaled-dot-product attention over a contiguous key range, with a mask only where the part's edge
cuts through the block. Each part runs through a fused kernel that also returns each row's
log-sum-exp (backends.py: PyTorch's CPU flash kernel on CPU, its memory-efficient kernel on
CUDA, or a plain float32 block anywhere); the parts are merged exactly as flash attention merges blocks:
out = Σ_p o_p·exp(lse_p − M) / Σ_p exp(lse_p − M). No [N × N] score matrix is ever built.

GQA without copying keys: the n_rep query heads of one key/value head are stacked along the
row axis ([B, H, C, D] -> [B, H_kv, n_rep·C, D]), so keys and values are used as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from .backends import resolve

QUERY_CHUNK = 512  # queries per step; masked blocks are at most n_rep·C × C


@dataclass
class Part:
    keys: str                                   # "orig" (as rotated by the model) or "far"
    k0: int                                     # key range [k0, k1)
    k1: int
    q_pos: Callable[[torch.Tensor], torch.Tensor] | None  # query positions; None: keep rotation
    rule: tuple | None  # None: every key; ("le", s): j <= i − s; ("band", w): i − w < j <= i


def _allowed(rule: tuple, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    kind, n = rule
    if kind == "le":
        return j <= i - n
    if kind == "band":
        return (j <= i) & (j > i - n)
    raise ValueError(f"unknown mask rule {rule!r}")


def rotate(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., n, D] (rotate_half layout, as transformers' Llama) by delta [n] positions,
    or by delta [n, d/2] / [H, n, d/2] positions per rotary component (DPE's groups, per head).
    Angles in float64: the extra rotation then adds no error of its own past a few thousand."""
    half = inv_freq.numel()
    rd = 2 * half
    delta = delta.to(torch.float64)
    ang = (delta[:, None] if delta.dim() == 1 else delta) * inv_freq.to(torch.float64)  # [.., n, d/2]
    ang = torch.cat([ang, ang], dim=-1)                                         # [.., n, d]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    xr = x[..., :rd]
    rot = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    out = xr * cos + rot * sin
    return out if rd == x.shape[-1] else torch.cat([out, x[..., rd:]], dim=-1)


def _shift(pos: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """The extra rotation pos − i, for positions [n] or per component [.., n, d/2]."""
    return pos - (i if pos.dim() == 1 else i[:, None])


def _merge(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> torch.Tensor:
    lse = torch.stack(lses)                                     # [P, B, Hkv, R]
    top = lse.max(dim=0).values
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    w = torch.exp(lse - top)                                    # rows a part does not see: 0
    total = w.sum(dim=0).clamp_min(torch.finfo(w.dtype).tiny)
    out = sum(o.float() * wp[..., None] for o, wp in zip(outs, w))
    return (out / total[..., None]).to(outs[0].dtype)


def _runs(allowed: torch.Tensor):
    """Split key columns into runs every query sees in full (no mask: the flash kernel is about
    twice as fast without one), runs it sees in part, and runs no query sees (dropped).
    Yields (start, end, allowed block or None)."""
    cols = allowed.reshape(-1, allowed.shape[-1])
    state = torch.where(cols.all(0), 2, torch.where(cols.any(0), 1, 0)).tolist()
    run = 0
    for c in range(1, len(state) + 1):
        if c == len(state) or state[c] != state[run]:
            if state[run]:
                yield run, c, None if state[run] == 2 else allowed[..., run:c]
            run = c


@lru_cache(maxsize=256)
def _layout(rule: tuple, rel: int, C: int, K: int, n_rep: int, dtype: torch.dtype):
    """The runs of a rule, which depends on i − j only: the same for every chunk and layer at
    the same offset, so built once. rel = first query position − first key position."""
    i = torch.arange(rel, rel + C)[:, None]
    j = torch.arange(K)[None, :]
    return [(s, e, None if blk is None else _mask(blk[None, None], n_rep, dtype))
            for s, e, blk in _runs(_allowed(rule, i, j))]


def _segments(part: Part, a: int, C: int, keep: torch.Tensor | None, n_rep: int, dtype):
    """(k0, k1, (additive mask, row validity) or None) covering the part's keys."""
    if part.rule is None and keep is None:
        return [(part.k0, part.k1, None)]
    if keep is None:
        return [(part.k0 + s, part.k0 + e, m)
                for s, e, m in _layout(part.rule, a - part.k0, C, part.k1 - part.k0, n_rep, dtype)]
    i = torch.arange(a, a + C, device=keep.device)[:, None]
    j = torch.arange(part.k0, part.k1, device=keep.device)[None, :]
    allowed = keep[..., part.k0:part.k1]                        # [B, 1, C, K]
    if part.rule is not None:
        allowed = allowed & _allowed(part.rule, i, j)
    return [(part.k0 + s, part.k0 + e, None if blk is None else _mask(blk, n_rep, dtype))
            for s, e, blk in _runs(allowed)]


def _mask(allowed: torch.Tensor, n_rep: int, dtype):
    """Additive mask [B|1, 1, n_rep·C, K] and row validity [B|1, 1, n_rep·C]."""
    valid = allowed.any(dim=-1).repeat(1, 1, n_rep)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
    return mask.repeat(1, 1, n_rep, 1), valid


def _rotated_queries(query, plan, inv_freq, offset: int) -> dict:
    """Each query rotation the plan uses (first and last chunk name them all), computed once."""
    Q, dev = query.shape[2], query.device
    queries = {None: query}
    for part in plan.parts(offset, offset + 1) + plan.parts(offset + Q - 1, offset + Q):
        if part.q_pos not in queries:
            i = torch.arange(offset, offset + Q, device=dev, dtype=torch.float64)
            queries[part.q_pos] = rotate(query, _shift(part.q_pos(i), i), inv_freq)
    return queries


def _chunk(queries, keys, value, blk, scaling, plan, a: int, b: int, offset: int, block):
    """Output [B, H, b − a, D] of queries a..b−1: each part's blocks, merged by log-sum-exp."""
    query = queries[None]
    B, H, _, D = query.shape
    n_kv = value.shape[1]
    n_rep = H // n_kv
    outs, lses, sliced = [], [], {}
    for part in plan.parts(a, b):
        if part.k1 <= part.k0:
            continue
        if part.q_pos not in sliced:
            q = queries[part.q_pos][:, :, a - offset:b - offset]
            sliced[part.q_pos] = q.reshape(B, n_kv, n_rep * (b - a), D)
        qp = sliced[part.q_pos]
        for k0, k1, masked in _segments(part, a, b - a, blk, n_rep, query.dtype):
            mask, valid = (None, None) if masked is None else masked
            if mask is not None and mask.device != query.device:
                mask, valid = mask.to(query.device), valid.to(query.device)
            o, lse = block(qp, keys[part.keys][:, :, k0:k1], value[:, :, k0:k1], mask, scaling)
            if valid is not None:  # rows with every key masked: weight 0, whatever the kernel gave
                lse = lse.masked_fill(~valid, float("-inf"))
                o = o.masked_fill(~valid[..., None], 0)
            outs.append(o)
            lses.append(lse.float())
    return _merge(outs, lses).reshape(B, H, b - a, D)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor | None,
           scaling: float, plan, inv_freq: torch.Tensor, offset: int,
           chunk: int = QUERY_CHUNK, backend: str | None = None) -> torch.Tensor:
    """Attention of query [B, H, Q, D] (positions offset..offset+Q-1) over key/value
    [B, H_kv, K, D] (positions 0..K-1) under `plan`. keep: bool [B, 1, Q, K] padding/causal mask
    from transformers (True = attend) or None. backend: backends.BACKENDS (None: the
    HF_POSEXT_ATTENTION_BACKEND variable, else auto). Returns [B, H, Q, D].

    No thread settings are touched here: torch.set_num_threads is process-wide, so toggling it
    around each block (as an earlier version did) races with other threads of a server."""
    block = resolve(backend, query.device)
    Q, K = query.shape[2], key.shape[2]
    if getattr(plan, "per_head", False) and key.shape[1] != query.shape[1]:
        # far keys rotated per query head (DPE's key dimensions): keys and values repeated as
        # transformers' repeat_kv does (kv head h serves query heads h·n_rep .. h·n_rep + n_rep − 1)
        n_rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1)
    keys = {"orig": key}
    if plan.key_pos is not None:
        j = torch.arange(K, device=query.device, dtype=torch.float64)
        keys["far"] = rotate(key, _shift(plan.key_pos(j), j), inv_freq)
    queries = _rotated_queries(query, plan, inv_freq, offset)
    out = torch.empty_like(query)
    a, end = offset, offset + Q
    while a < end:
        b = min(a + chunk, end)
        if plan.period:
            b = min(b, (a // plan.period + 1) * plan.period)
        blk = keep[:, :, a - offset:b - offset] if keep is not None else None
        out[:, :, a - offset:b - offset] = _chunk(queries, keys, value, blk, scaling, plan, a, b, offset, block)
        a = b
    return out

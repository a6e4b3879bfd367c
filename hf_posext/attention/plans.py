"""Each method's plan: for a query chunk [a, b), the parts of its keys (kernel.Part).

Window methods (ReRoPE, leaky ReRoPE, Self-Extend; STRING with w = shifted_offset, its far
keys left as the model rotated them), with window w and Δ = i − j:
  near      keys (i − w, i]        ordinary RoPE, masked to the band       C × (C + w) mask
  far_full  keys [0, a − w]        far positions, every query sees them     no mask
  far_edge  keys (a − w, b − 1 − w] far positions, j <= i − w              C × C mask
Dual Chunk Attention, query chunks never crossing a chunk of length c = chunk_size − local_window
(chunk m = [mc, (m+1)c)):
  intra      keys [mc, b)          ordinary RoPE (i mod c − j mod c = i − j), causal mask
  successive keys [(m−1)c, mc)     query min(i mod c + c, chunk_size), keys j mod c
  inter      keys [0, (m−1)c)      query min(2c − 1, chunk_size), keys j mod c
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from . import positions as P
from .kernel import Part


@dataclass
class WindowPlan:
    window: int
    far_query: Callable[[torch.Tensor], torch.Tensor]
    key_pos: Callable[[torch.Tensor], torch.Tensor] | None   # None: far keys keep their rotation
    period: int | None = None
    per_head: bool = False   # far positions [H, n, d/2]: keys rotated per query head (DPE)

    def parts(self, a: int, b: int) -> list[Part]:
        w = self.window
        split = max(0, a - w + 1)
        far = "orig" if self.key_pos is None else "far"
        return [
            Part("orig", split, b, None, ("band", w)),
            Part(far, 0, split, self.far_query, None),
            Part(far, split, max(split, b - w), self.far_query, ("le", w)),
        ]


@dataclass
class DualChunkPlan:
    chunk_size: int
    local_window: int

    def __post_init__(self):
        self.period = P.dual_chunk_len(self.chunk_size, self.local_window)
        self.key_pos = partial(P.dual_chunk_key, chunk_size=self.chunk_size, local_window=self.local_window)
        # one object per query map: the kernel rotates the queries once per map
        self._queries = {kind: partial(P.dual_chunk_query, kind=kind, chunk_size=self.chunk_size,
                                       local_window=self.local_window) for kind in ("successive", "inter")}

    def _query(self, kind):
        return self._queries[kind]

    def parts(self, a: int, b: int) -> list[Part]:
        c = self.period
        start = (a // c) * c
        return [
            Part("orig", start, b, None, ("le", 0)),
            Part("far", max(0, start - c), start, self._query("successive"), None),
            Part("far", 0, max(0, start - c), self._query("inter"), None),
        ]

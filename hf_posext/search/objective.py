"""The search objective: mean next-token NLL over proxy spans of the tuning documents, each span
at its true positions (LongRoPE's short-proxy cost cut, arXiv 2402.13753 §3.2)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..evaluation.loss import IGNORE_INDEX, decoder_and_head


def proxy_chunks(target: int, proxy: int, pieces: int = 4) -> list[tuple[int, int]]:
    """[start, end) of `pieces` spans of the first `target` tokens, `proxy` tokens in all, spread
    evenly from the start to the end: the short proxy (LongRoPE's cost cut) that still spans
    every distance up to the target, because each span keeps its true positions."""
    if proxy >= target:
        return [(0, target)]
    size = proxy // pieces
    starts = [round(k * (target - size) / (pieces - 1)) for k in range(pieces)]
    return [(a, a + size) for a in starts]


def span_nll(model, doc: np.ndarray, spans: Sequence[tuple[int, int]], chunk: int = 1024) -> torch.Tensor:
    """Mean next-token NLL over `spans` of one document, read as one sequence whose tokens keep
    their document positions (a span's last token predicts nothing: its successor is elsewhere).
    Differentiable; the LM head + cross-entropy checkpointed per chunk so [T × vocab] logits
    never exist at once (evaluation/loss.py)."""
    ids = torch.cat([torch.as_tensor(doc[a:b], dtype=torch.long) for a, b in spans])        # [T]
    pos = torch.cat([torch.arange(a, b) for a, b in spans])                                 # [T]
    targets = torch.cat([torch.cat([torch.as_tensor(doc[a + 1:b], dtype=torch.long),
                                    torch.tensor([IGNORE_INDEX])]) for a, b in spans])      # [T]
    decoder, head = decoder_and_head(model)
    hidden = decoder(input_ids=ids[None], position_ids=pos[None], use_cache=False).last_hidden_state[0]
    total = hidden.new_zeros((), dtype=torch.float32)

    def piece(h, t):
        return F.cross_entropy(F.linear(h.float(), head.weight.float()), t, reduction="sum")

    for i in range(0, targets.numel(), chunk):
        total = total + checkpoint(piece, hidden[i:i + chunk], targets[i:i + chunk], use_reentrant=False)
    return total / (targets != IGNORE_INDEX).sum()


def objective(model, docs: Sequence[np.ndarray], spans, grad: bool) -> torch.Tensor:
    """Mean NLL over `spans` of each tuning document."""
    with torch.set_grad_enabled(grad):
        return torch.stack([span_nll(model, d, spans) for d in docs]).mean()

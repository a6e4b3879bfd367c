"""The search objectives: plain perplexity, the mean next-token NLL over proxy spans of the tuning
documents, each span at its true positions (LongRoPE's short-proxy cost cut, arXiv 2402.13753
§3.2); the needle objective (needle.py) scores answer tokens only through `masked_nll`."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..evaluation.lm_head import IGNORE_INDEX, check_lm_head, chunked_nll_sum, decoder_and_head


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
    never exist at once (evaluation/perplexity/loss.py)."""
    ids = torch.cat([torch.as_tensor(doc[a:b], dtype=torch.long) for a, b in spans])        # [T]
    pos = torch.cat([torch.arange(a, b) for a, b in spans])                                 # [T]
    targets = torch.cat([torch.cat([torch.as_tensor(doc[a + 1:b], dtype=torch.long),
                                    torch.tensor([IGNORE_INDEX])]) for a, b in spans])      # [T]
    return masked_nll(model, ids, pos, targets, chunk)


def masked_nll(model, ids: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor,
               chunk: int = 1024) -> torch.Tensor:
    """Mean NLL of `targets` (the next token at each of the [T] positions; IGNORE_INDEX: no loss)
    for one sequence `ids` read at positions `pos`. Differentiable; the LM head + cross-entropy
    checkpointed per chunk so [T × vocab] logits never exist at once (evaluation/lm_head.py)."""
    decoder, head = decoder_and_head(model)[0], check_lm_head(model)
    # An explicit all-ones mask: without one (and without a cache) transformers 5.x reads a jump
    # in position_ids as the start of another packed sequence (masking_utils
    # `find_packed_sequence_indices`) and no span would attend to the ones before it.
    hidden = decoder(input_ids=ids[None], position_ids=pos[None], attention_mask=torch.ones_like(ids)[None],
                     use_cache=False).last_hidden_state[0]
    return chunked_nll_sum(head, hidden, targets, chunk) / (targets != IGNORE_INDEX).sum()


def objective(model, docs: Sequence[np.ndarray], spans, grad: bool) -> torch.Tensor:
    """Mean NLL over `spans` of each tuning document."""
    with torch.set_grad_enabled(grad):
        return torch.stack([span_nll(model, d, spans) for d in docs]).mean()

"""The needle-driven objective (LongRoPE2, Shang et al. 2025, arXiv 2502.20082, §3: "needle-driven
perplexity"): the loss on the **answer tokens only** of long documents whose answer depends on far
context, because plain perplexity rewards factors that only model local text. LongRoPE2 scores
10 PG19 documents × 10 needle depths; its search code is not in the public microsoft/LongRoPE
repository (the snapshot read here, commit c9e56aa, holds LongRoPE v1 only), so this follows the
paper's description.

Each needle document is a tuning document's first T tokens (T: the target length) with a fact
written at a depth d of the document and, at its end, a question about it and the answer, built
with the machinery of the recipe's synthetic examples (data/facts.py: `pieces`, `draw_fact`) in a
wording neither it nor the retrieval suite uses (a test checks). With a proxy length P < T (the
search's cost cut, objective.proxy_chunks) the model reads two pieces at their true positions:
P/2 tokens holding the fact, and the last P/2 ending with the question and answer, so the fact
stays T − f positions away from its answer while a forward costs P tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..evaluation.lm_head import IGNORE_INDEX
from ..data.facts import Format, draw_fact, pieces
from .objective import masked_nll

OBJECTIVES = ("perplexity", "needle")
# Its own wording: not the recipe's FORMATS, not passkey's / RULER's needles.
WORDING = Format("Keep in mind that the ticket number of {key} is {value}.",
                 "What was the ticket number of {key}? The ticket number of {key} is", " {value}.",
                 "digits")
DEPTHS = (0.0, 0.5, 1.0)   # of the range where a fact can go: 0 the farthest from the question


@dataclass(frozen=True)
class Needle:
    """One needle document as the model reads it: ids at their true positions, and the
    next-token targets, IGNORE_INDEX everywhere but on the answer tokens."""
    ids: torch.Tensor        # [n]
    positions: torch.Tensor  # [n]
    targets: torch.Tensor    # [n]
    depth: float


def build(doc: np.ndarray, tokenizer, target: int, proxy: int, depth: float,
          rng: random.Random) -> Needle:
    """The needle document of `doc` (>= target tokens) at `depth` in [0, 1], read as the whole
    target (proxy >= target) or as two proxy/2 pieces (the fact's, the last)."""
    stream = [int(t) for t in doc[:target]]
    key, value = draw_fact(rng, WORDING, tokenizer.decode(stream, skip_special_tokens=True))
    fact, question, answer = pieces(tokenizer, WORDING, key, value)
    proxy = min(proxy, target)
    half = proxy // 2
    tail = len(question) + len(answer)
    if proxy < target and (len(fact) > half // 2 or tail > half):
        raise ValueError(f"--proxy-length {proxy} is too short for the needle objective: a needle "
                         f"needs {len(fact)} + {tail} tokens; use at least {4 * max(len(fact), tail)}.")
    if proxy >= target and len(fact) + tail > target:
        raise ValueError(f"--target-length {target} is too short for a needle of {len(fact) + tail} tokens.")
    room = (target - proxy) if proxy < target else (target - tail - len(fact))
    at = round(depth * room)                                   # where the fact starts
    stream[at:at + len(fact)] = fact
    stream[target - tail:] = question + answer
    if proxy >= target:
        spans = [(0, target)]
    else:
        start = max(0, at - half // 2)                        # the fact inside the first piece
        spans = [(start, start + half), (target - half, target)]
    answer_at = target - len(answer)
    ids = torch.tensor([stream[p] for a, b in spans for p in range(a, b)])
    positions = torch.tensor([p for a, b in spans for p in range(a, b)])
    # the token at p predicts p + 1: a loss only where p + 1 is an answer token in the same piece
    targets = torch.tensor([stream[p + 1] if answer_at <= p + 1 < b else IGNORE_INDEX
                            for a, b in spans for p in range(a, b)])
    return Needle(ids, positions, targets, depth)


def needles(docs: Sequence[np.ndarray], tokenizer, target: int, proxy: int | None,
            depths: Sequence[float] = DEPTHS, seed: int = 0) -> list[Needle]:
    """One needle document per tuning document and depth; keys and values drawn by
    `random.Random(seed, document, depth)`, so the set is a pure function of its inputs."""
    return [build(doc, tokenizer, target, proxy or target, depth,
                  random.Random(f"{seed}-{i}-{j}"))
            for i, doc in enumerate(docs) for j, depth in enumerate(depths)]


def needle_objective(model, needle_docs: Sequence[Needle], grad: bool) -> torch.Tensor:
    """Mean over the needle documents of the mean NLL of their answer tokens."""
    with torch.set_grad_enabled(grad):
        return torch.stack([masked_nll(model, n.ids, n.positions, n.targets)
                            for n in needle_docs]).mean()

"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2): the retrieval
suite's `single_needle` task on the noise haystack (hf_posext/evaluation/retrieval/), under its
historical API and results name.

A five-digit key is hidden at a chosen depth of repetitive filler text; the model is asked for it
and decodes greedily. Accuracy is the share of seeds whose first number in the answer equals the
key. The prompt is assembled from separately tokenised pieces, so its length is controlled in
tokens: prefix + filler × k₁ + needle + filler × k₂ + question, as long as fits in `length`.
Keys come from `random.Random(seed)`, so a rerun gives the same prompts and the same numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from .retrieval.haystack import NOISE_NAME, noise_haystack
from .retrieval.prompt import min_tokens, place
from .retrieval.run import evaluate_retrieval
from .retrieval.settings import RetrievalGrid
from .retrieval.stats import first_number  # noqa: F401  (passkey's scoring rule, re-exported)
from .retrieval.tasks import NEEDLE, PREFIX, QUESTION, passkey_for_seed, passkey_trial
from .shared.settings import RunInfo, settings_only

__all__ = ["NEEDLE", "PREFIX", "QUESTION", "PasskeyPrompt", "build_prompt",
           "evaluate_passkey", "first_number", "passkey_for_seed"]


@dataclass
class PasskeyPrompt:
    input_ids: list[int]
    key: int
    needle_start: int  # token index where the needle begins


def build_prompt(tokenizer, length: int, depth: float, key: int) -> PasskeyPrompt:
    """A prompt of at most `length` tokens with the needle after round(depth·k) filler pieces
    (the single_needle cell's layout, `retrieval.prompt.place`)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1 (a fraction of the filler), got {depth}")
    trials, haystack = [passkey_trial(key)], noise_haystack(tokenizer)
    cell = place(tokenizer, trials, haystack, length, depth, "passkey",
                 lambda: min_tokens(tokenizer, trials, haystack))
    return PasskeyPrompt(cell.prompt(0), key, len(cell.prefix))


@settings_only(RetrievalGrid)
def evaluate_passkey(model, tokenizer, grid: RetrievalGrid, *, run: RunInfo | None = None,
                     store=None, ranks=None, progress: bool = True, reuse_identical: bool = True,
                     answer_fn: Callable | None = None) -> list[dict]:
    """Passkey accuracy for every (method, factor, length, depth) of `grid`, over its seeds:
    the rows of `evaluate_retrieval` for the single_needle task (Wilson interval included),
    plus `seeds` (how many).

    grid: a `RetrievalGrid` of the single_needle task on the noise haystack (its defaults), e.g.
        `RetrievalGrid(["yarn"], [4096, 8192], depths=[0, 0.5, 1], seeds=[0, 1, 2])`; the other
        tasks and haystacks: `evaluate_retrieval`. run: whose run it is (`RunInfo`: model
        name, fingerprint, dtype, device).
    answer_fn: as `evaluate_retrieval`'s (one contract): answer_fn(model, tokenizer,
    CellPrompts, reuse_prefix) -> the answer text of every trial of the cell; default greedy
    decoding with the shared prefix prefilled once per cell (`retrieval.decode`)."""
    if not isinstance(grid, RetrievalGrid):
        raise TypeError(f"grid must be a RetrievalGrid(methods=..., lengths=..., depths=..., "
                        f"seeds=...), got {type(grid).__name__}.")
    if tuple(grid.tasks) != ("single_needle",) or grid.haystack != NOISE_NAME:
        raise ValueError(f"evaluate_passkey runs the single_needle task on the {NOISE_NAME} "
                         f"haystack, got tasks={list(grid.tasks)}, haystack={grid.haystack!r}; "
                         "use evaluate_retrieval for the others.")
    run = run or RunInfo()
    run = dataclasses.replace(run, extra_columns={**run.extra_columns, "seeds": len(grid.trial_seeds())})
    return evaluate_retrieval(model, tokenizer, grid, run=run, store=store, ranks=ranks,
                              reuse_identical=reuse_identical, progress=progress, answer_fn=answer_fn,
                              seed_blocks=False)   # its tables show each seed list as its own series

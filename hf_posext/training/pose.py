"""PoSE: positional skip-wise training (Zhu et al. 2023, arXiv 2309.10400).

Fine-tuning a model for a target context `L_t` normally needs sequences of `L_t` tokens. PoSE keeps
the training window at `L_c < L_t` tokens and instead manipulates the position ids: the window is
cut into N chunks, and each chunk's position ids are shifted right by a skip bias, so over many
samples the model sees every relative distance in `[0, L_t)` at the memory cost of `L_c` tokens.

Paper §3.2: chunk i holds positions `{st_i, ..., st_i + l_i - 1}` with
`st_i = l_0 + ... + l_{i-1} + u_i`, skip biases `0 = u_0 <= u_1 <= ... <= u_{N-1} <= L_t - L_c`.
As in the authors' released code (the `lt = 0` revision), the first chunk always starts at
position 0, which keeps the start-of-sequence tokens where the model expects them, and the skips
are uniform, so the last position `L_c - 1 + u_{N-1}` reaches `L_t - 1` when the largest skip is
drawn. The text of the window is contiguous (the paper's default); only the positions skip.

A transformers >= 5 pitfall this module guards against: when `position_ids` are passed with
`attention_mask=None`, transformers reads every jump in the ids as the boundary of a *packed*
sequence and masks attention across it (`masking_utils.find_packed_sequence_indices`), so the
chunks would silently stop attending to each other and PoSE would teach nothing about long
distances. The collator therefore always passes an explicit all-ones attention mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def sample_pose_position_ids(window: int, target: int, num_chunks: int = 2,
                             generator: torch.Generator | None = None) -> torch.Tensor:
    """Position ids for one PoSE window of `window` tokens spanning a target length `target`.

    Returns a LongTensor of shape [window]: strictly increasing, starting at 0, last id <= target-1.
    """
    if not isinstance(window, int) or not isinstance(target, int) or window < 1:
        raise ValueError(f"window and target must be positive integers, got {window!r}, {target!r}")
    if target < window:
        raise ValueError(f"PoSE target length {target} is shorter than the training window {window}; "
                         "the target must be >= the window (set pose.window <= the target length).")
    if not isinstance(num_chunks, int) or not 1 <= num_chunks <= window:
        raise ValueError(f"num_chunks must be an integer in [1, window={window}], got {num_chunks!r}")
    # Chunk lengths l_0..l_{N-1}: N-1 distinct cut points in 1..window-1, uniformly (all l_i >= 1).
    cuts = (torch.randperm(window - 1, generator=generator)[: num_chunks - 1] + 1).sort().values
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([window])])           # [N+1]
    lengths = bounds[1:] - bounds[:-1]                                               # [N]
    # Skip biases: u_0 = 0, the rest sorted uniform draws from {0, ..., target - window}.
    skips = torch.randint(0, target - window + 1, (num_chunks - 1,), generator=generator).sort().values
    skips = torch.cat([torch.tensor([0]), skips])                                    # [N]
    # Token j of the window (in chunk i) gets position j + u_i: contiguous inside a chunk.
    return torch.arange(window) + torch.repeat_interleave(skips, lengths)            # [window]


def sample_spanning_position_ids(window: int, target: int, num_chunks: int, first_end: int,
                                 last_start: int, min_last: int,
                                 generator: torch.Generator | None = None) -> torch.Tensor:
    """PoSE position ids for a synthetic long-range example (training/synthetic.py): the same
    chunks-and-skips as `sample_pose_position_ids`, but the N-1 cuts fall in [first_end,
    last_start] (tokens before `first_end`, the fact, stay in the first chunk, which starts at 0;
    tokens from `last_start`, the question and answer, are the last chunk) and the last id is
    drawn uniformly in [max(min_last, window - 1), target - 1], so the fact and the question sit
    up to `target` positions apart. Middle skips: sorted uniform in [0, last skip]."""
    sample_pose_position_ids(window, target, num_chunks, torch.Generator())   # same argument checks
    if not 1 <= first_end <= last_start <= window - 1 or last_start - first_end + 1 < num_chunks - 1:
        raise ValueError(f"cannot cut {num_chunks} chunks with the fact before {first_end} and the "
                         f"question from {last_start} in a window of {window} tokens")
    if num_chunks == 1:
        return torch.arange(window)
    span = last_start - first_end + 1
    cuts = (torch.randperm(span, generator=generator)[: num_chunks - 1] + first_end).sort().values
    bounds = torch.cat([torch.tensor([0]), cuts, torch.tensor([window])])           # [N+1]
    lo = min(max(min_last, window - 1), target - 1)
    last_skip = int(torch.randint(lo, target, (1,), generator=generator)) - (window - 1)
    middle = torch.randint(0, last_skip + 1, (num_chunks - 2,), generator=generator).sort().values
    skips = torch.cat([torch.tensor([0]), middle, torch.tensor([last_skip])])        # [N]
    return torch.arange(window) + torch.repeat_interleave(skips, bounds[1:] - bounds[:-1])


@dataclass(frozen=True)
class Span:
    """Where a synthetic example's pieces sit in its window (token indices)."""
    fact_end: int
    question_start: int
    answer_start: int


def span_of(row) -> Span | None:
    """The Span of a dataset row (a synthetic example), None for a plain document window (or a
    dataset without the span columns)."""
    if "answer_start" not in row or int(row["answer_start"]) < 0:
        return None
    return Span(int(row["fact_end"]), int(row["question_start"]), int(row["answer_start"]))


def example_generator(seed: int, index: int) -> torch.Generator:
    """A generator that depends only on (seed, example index), so a resumed run draws the same
    position ids as an uninterrupted one without saving any RNG state."""
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


@dataclass
class PoseCollator:
    """Batches packed token windows for causal-LM training, with PoSE position ids when enabled.

    Each example is a LongTensor of `window` token ids (already packed with BOS/EOS by `data.py`).
    `__call__(examples, indices)` returns input_ids, labels, attention_mask and position_ids, all
    [batch, window]; `indices` are the examples' global indices, which seed their position ids.
    With `target=None` the position ids are simply 0..window-1 (plain fine-tuning).

    `spans` (one Span or None per example) marks synthetic long-range examples: their position
    ids keep the fact in the first chunk and the question in the last, the last id drawn in
    [min_span x target, target) (`sample_spanning_position_ids`); with `answer_only` their labels
    are -100 everywhere but the answer tokens.
    """
    window: int
    target: int | None = None
    num_chunks: int = 2
    seed: int = 0
    min_span: float = 0.5
    answer_only: bool = True

    def __post_init__(self) -> None:
        if self.target is not None:   # validate once, early, with the same messages
            sample_pose_position_ids(self.window, self.target, self.num_chunks, torch.Generator())

    def __call__(self, examples: list[torch.Tensor], indices: list[int],
                 spans: list[Span | None] | None = None) -> dict[str, torch.Tensor]:
        spans = list(spans) if spans is not None else [None] * len(examples)
        if not len(examples) == len(indices) == len(spans):
            raise ValueError(f"{len(examples)} examples but {len(indices)} indices and {len(spans)} spans")
        # A batch holds one length: the window, or (data.synthetic.window) a shorter synthetic
        # example's, whose span says where its pieces are.
        n = examples[0].shape[-1] if examples else self.window
        for ex, span in zip(examples, spans):
            if ex.shape != (n,) or not (n == self.window or (span is not None and n < self.window)):
                raise ValueError(f"every example of a batch must hold window={self.window} tokens (a "
                                 f"synthetic example may hold fewer, all of a batch alike), got shapes "
                                 f"{[tuple(e.shape) for e in examples]}")
        input_ids = torch.stack(examples).long()                                       # [B, n]
        if self.target is None:
            position_ids = torch.arange(n).expand(len(examples), -1).clone()           # [B, n]
        else:
            position_ids = torch.stack([self._positions(i, span, n) for i, span in zip(indices, spans)])
        labels = input_ids.clone()             # the model shifts labels by one internally
        for row, span in enumerate(spans):
            if span is not None and self.answer_only:
                labels[row, :span.answer_start] = -100   # loss on the answer tokens only
        return {"input_ids": input_ids,
                "labels": labels,
                "attention_mask": torch.ones_like(input_ids),  # see the module docstring
                "position_ids": position_ids}

    def _positions(self, index: int, span: Span | None, n: int) -> torch.Tensor:
        g = example_generator(self.seed, index)
        if span is None:
            return sample_pose_position_ids(n, self.target, self.num_chunks, g)
        min_last = math.ceil(self.min_span * self.target) - 1
        return sample_spanning_position_ids(n, self.target, self.num_chunks, span.fact_end,
                                            span.question_start, min_last, g)

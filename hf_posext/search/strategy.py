"""What a search algorithm is to the one search run (run.py): a `Strategy` proposes the next
point, the run scores it on the proxy objective and logs it, and the strategy updates from the
score. The run owns the budget, the log, resuming, progress and the final check; a strategy owns
only how it moves (gradient.py: Adam; evolution.py: LongRoPE's evolutionary search)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ContextManager, Protocol

import torch

from .log import SearchLog
from .space import Factors


@dataclass
class Point:
    """A point to score: its factors, attention factor, the `source` a result names it by
    ("step 3", "generation 2") and the leading fields of its log row (kind and counters)."""
    factors: list[float]
    attention_factor: float
    source: str
    fields: dict


def as_best(factors: list[float], attention_factor: float, nll: float, source: str) -> dict:
    """The best point so far, as the run keeps and checks it."""
    return {"factors": factors, "attention_factor": attention_factor, "nll": nll, "source": source}


class Strategy(Protocol):
    kind: str        # the `kind` of its log rows ("step", "candidate")
    counter: str     # the row field the progress bar shows ("step", "generation")
    desc: str        # the progress bar's name
    gradient: bool   # its objective needs a backward

    @property
    def lr(self) -> float:
        """What the log's settings row records as `lr` (SearchSettings)."""

    @property
    def algorithm(self) -> str:
        """What the log's settings row records as `algorithm` (SearchSettings)."""

    def logged(self, log: SearchLog) -> list[dict]:
        """Its scored points in the log (`as_best` form), in order: a resumed run's best."""

    def start(self, log: SearchLog, params: Factors, best: dict) -> None:
        """Rebuild its state from the log (from `best` when it has no rows yet); `params` are
        the factors the run scores."""

    def propose(self) -> Point | None:
        """The next point, loaded into `params`; None: its own limit is reached."""

    def update(self, point: Point, loss: torch.Tensor, best: dict) -> dict:
        """Learn from `point`'s objective (`best` already counts it); returns its log row."""

    def session(self, model) -> ContextManager:
        """What the model needs while this strategy scores (e.g. activation checkpointing)."""

"""LongRoPE's evolutionary search (Ding et al. 2024, arXiv 2402.13753, §3.2, Algorithm 1) over
the same space as the gradient search (space.py): one rescale factor f_i >= 1 per rotary
frequency, non-decreasing towards low frequencies, and the cos/sin attention factor.

A generation is `population` candidates, each scored by one forward (no backward) on the proxy
spans. Every generation is mutations and crossovers of the `parents` best points found before
it: for the first, the seeds (the rope-only methods' exact factors). Mutation leaves each log
f_i as it is with probability 1 − p and adds a normal step N(0, σ) with probability p
(LongRoPE mutates each factor on its own), and moves the log
attention factor by N(0, σ/4), then projects onto the constraints (f_i >= 1, non-decreasing);
crossover takes each f_i from one of two parents. A candidate costs one forward, a gradient
step about three (forward, backward, checkpointed recomputation): the benchmark compares them
per minute (benchmarks/search.py compare).
Every candidate is a row of the search log (kind "candidate"); a resumed run rebuilds the
parents from it and draws generation g from a generator seeded with (seed, g), so the same
candidates come back.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import check_seed
from .log import SearchLog
from .space import Factors
from .strategy import Point, as_best


def _project(log_f: np.ndarray) -> np.ndarray:
    """f_i >= 1 and non-decreasing towards low frequencies (`Factors.project` in numpy)."""
    return np.maximum.accumulate(np.maximum(log_f, 0.0))


@dataclass
class Evolution:
    """The evolutionary strategy: its knobs (`max_generations`: None, the budget alone) and,
    once started, every scored point (the parents' pool) and the generation under way."""
    population: int = 8
    parents: int = 3
    sigma: float = 0.05
    p_mutate: float = 0.3
    p_cross: float = 0.3
    seed: int = 0
    max_generations: int | None = None
    kind, counter, desc, gradient, lr = "candidate", "generation", "evolve", False, 0.0

    def __post_init__(self):
        check_seed("seed", self.seed)
        if self.population < 2 or self.parents < 1 or self.parents > self.population:
            raise ValueError(f"population ({self.population}) must be >= 2 and parents "
                             f"({self.parents}) in 1..population.")

    @property
    def algorithm(self) -> str:
        """What the search log records (a resumed run must have the same settings)."""
        return (f"evolution(population={self.population}, parents={self.parents}, sigma={self.sigma}, "
                f"p_mutate={self.p_mutate}, p_cross={self.p_cross}, seed={self.seed})")

    def logged(self, log: SearchLog) -> list[dict]:
        return [as_best(r["factors"], r["attention_factor"], r["nll"], f"generation {r['generation']}")
                for r in log.of("candidate")]

    def start(self, log: SearchLog, params: Factors, best: dict) -> None:
        """The pool: the seeds (generation 0) and every logged candidate; the next generation is
        the last logged one when it was cut short (budget), so it is completed first."""
        self.params, self.queue = params, []
        self.pool = [{**r, "generation": 0} for r in log.of("seed")] + log.of("candidate")
        cands = log.of("candidate")
        self.generation = max((r["generation"] for r in cands), default=0)
        if 0 < sum(r["generation"] == self.generation for r in cands) < self.population:
            self.generation -= 1

    def propose(self) -> Point | None:
        while not self.queue:
            if self.max_generations is not None and self.generation >= self.max_generations:
                return None
            self.generation += 1
            done = sum(r["generation"] == self.generation for r in self.pool)
            self.queue = list(enumerate(self._children()))[done:]   # scored before a resume
        i, (f, a) = self.queue.pop(0)
        self.params.load(f, a)
        return Point(f, a, f"generation {self.generation}",
                     {"kind": "candidate", "generation": self.generation, "index": i})

    def update(self, point: Point, loss: torch.Tensor, best: dict) -> dict:
        row = {**point.fields, "factors": point.factors, "attention_factor": point.attention_factor,
               "nll": float(loss)}
        self.pool.append(row)
        return row

    def session(self, model):
        return nullcontext()

    def _children(self) -> list[tuple[list[float], float]]:
        """`population` new (factors, attention_factor) bred from the `parents` best of the
        generations before this one only (so a generation resumed half-way draws the same
        children), from a generator seeded with (seed, generation)."""
        parents = sorted((r for r in self.pool if r["generation"] < self.generation),
                         key=lambda r: r["nll"])[:self.parents]
        rng = np.random.default_rng([self.seed, self.generation])
        return [_child(parents, rng, self.sigma, self.p_mutate, self.p_cross) for _ in range(self.population)]


def _child(parents: list[dict], rng: np.random.Generator, sigma: float, p_mutate: float,
           p_cross: float) -> tuple[list[float], float]:
    """One child: a parent, crossed with another with probability `p_cross`, then mutated."""
    a = parents[int(rng.integers(len(parents)))]
    log_f, log_a = np.log(np.asarray(a["factors"])), math.log(a["attention_factor"])
    if len(parents) > 1 and rng.random() < p_cross:
        b = parents[int(rng.integers(len(parents)))]
        take = rng.random(log_f.shape) < 0.5
        log_f = np.where(take, log_f, np.log(np.asarray(b["factors"])))
        log_a = log_a if rng.random() < 0.5 else math.log(b["attention_factor"])
    mask = rng.random(log_f.shape) < p_mutate
    log_f = _project(log_f + mask * rng.normal(0.0, sigma, log_f.shape))
    log_a = log_a + rng.normal(0.0, sigma / 4)
    return np.exp(log_f).tolist(), float(math.exp(log_a))

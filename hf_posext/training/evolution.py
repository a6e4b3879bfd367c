"""LongRoPE's evolutionary search (Ding et al. 2024, arXiv 2402.13753, §3.2, Algorithm 1) over
the same space as the gradient search (factor_search.py): one rescale factor f_i >= 1 per
rotary frequency, non-decreasing towards low frequencies, and the cos/sin attention factor.

A generation is `population` candidates, each scored by one forward (no backward) on the proxy
spans. The first generation is the seeds (the rope-only methods' exact factors) and mutations
of the best one; every later one is mutations and crossovers of the `parents` best candidates
found so far. Mutation leaves each log f_i as it is with probability 1 − p and adds a normal
step N(0, σ) with probability p (LongRoPE mutates each factor on its own), and moves the log
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
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .factor_search import SearchResult, _Factors, _finish, _Installed, _loss, _start, proxy_chunks


def _project(log_f: np.ndarray) -> np.ndarray:
    """f_i >= 1 and non-decreasing towards low frequencies (the gradient search's projection)."""
    return np.maximum.accumulate(np.maximum(log_f, 0.0))


def _children(parents: list[dict], n: int, rng: np.random.Generator, sigma: float,
              p_mutate: float, p_cross: float) -> list[tuple[list[float], float]]:
    """n new (factors, attention_factor) from the parents (best first)."""
    out = []
    for _ in range(n):
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
        out.append((np.exp(log_f).tolist(), float(math.exp(log_a))))
    return out


def evolution_label(population: int = 8, parents: int = 3, sigma: float = 0.05, p_mutate: float = 0.3,
                    p_cross: float = 0.3, seed: int = 0) -> str:
    """The `algorithm` the search log records (a resumed run must have the same settings)."""
    return (f"evolution(population={population}, parents={parents}, sigma={sigma}, "
            f"p_mutate={p_mutate}, p_cross={p_cross}, seed={seed})")


def evolve(model, docs: Sequence[np.ndarray], target_length: int, log_path: str | Path, *,
           budget_minutes: float = 60.0, proxy_length: int | None = None, population: int = 8,
           parents: int = 3, sigma: float = 0.05, p_mutate: float = 0.3, p_cross: float = 0.3,
           max_generations: int | None = None, seed: int = 0, data: str = "",
           final_check: bool = True, progress: bool = True) -> SearchResult:
    """The evolutionary search; same inputs, log and result as `gradient.search`
    (`max_generations` in place of `max_steps`). The first generation comes from the seeds."""
    if population < 2 or parents < 1 or parents > population:
        raise ValueError(f"population ({population}) must be >= 2 and parents ({parents}) in 1..population.")
    run = _start(model, docs, target_length, log_path, proxy_length, 0.0, data,
                 algorithm=evolution_label(population, parents, sigma, p_mutate, p_cross, seed))
    log = run.log
    spans = proxy_chunks(target_length, run.settings.proxy_length)
    scored = [{"factors": r["factors"], "attention_factor": r["attention_factor"], "nll": r["nll"],
               "source": r["method"], "generation": 0} for r in log.of("seed")] + \
             [{"factors": r["factors"], "attention_factor": r["attention_factor"], "nll": r["nll"],
               "source": f"generation {r['generation']}", "generation": r["generation"]}
              for r in log.of("candidate")]
    best: dict = min(scored, key=lambda r: r["nll"])
    budget = budget_minutes * 60.0
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=round(budget), initial=min(round(run.elapsed()), round(budget)), unit="s",
                   desc="evolve", leave=True)
    params = _Factors([1.0] * (run.dim // 2), 1.0)
    generation = max((r["generation"] for r in log.of("candidate")), default=0)
    if 0 < len([r for r in log.of("candidate") if r["generation"] == generation]) < population:
        generation -= 1   # the last generation was cut short (budget): complete it first
    try:
        with _Installed(model, params, run.powers):
            while run.elapsed() < budget and (max_generations is None or generation < max_generations):
                generation += 1
                done = [r for r in log.of("candidate") if r["generation"] == generation]
                # parents from the generations before this one only, so a generation resumed
                # half-way draws the same children as it did before it was cut short
                pool = sorted((r for r in scored if r["generation"] < generation),
                              key=lambda r: r["nll"])[:parents]
                rng = np.random.default_rng([seed, generation])
                for i, (f, a) in enumerate(_children(pool, population, rng, sigma, p_mutate, p_cross)):
                    if i < len(done) or run.elapsed() >= budget:
                        continue  # scored before a resume, or out of time
                    with torch.no_grad():
                        params.log_f.copy_(torch.tensor(f, dtype=torch.float64).log())
                        params.log_a.fill_(math.log(a))
                        nll = float(_loss(model, docs, spans, grad=False))
                    row = {"factors": f, "attention_factor": a, "nll": nll,
                           "source": f"generation {generation}", "generation": generation}
                    scored.append(row)
                    if nll < best["nll"]:
                        best = row
                    log.add({"kind": "candidate", "generation": generation, "index": i,
                             "factors": f, "attention_factor": a, "nll": nll,
                             "best_nll": best["nll"], "best_ratio": math.exp(best["nll"] - run.baseline),
                             "elapsed": run.elapsed()})
                    if bar is not None:
                        bar.set_postfix(generation=generation,
                                        best_ratio=f"{math.exp(best['nll'] - run.baseline):.4f}")
                        bar.update(max(0, min(round(run.elapsed()), round(budget)) - bar.n))
    finally:
        if bar is not None:
            bar.close()
    return _finish(model, docs, run, best, final_check, steps=len(log.of("candidate")))

"""One search run, for every algorithm: check the model, open (or resume) the log, score the
sliding-window baseline and the seeds once, then let a `Strategy` (strategy.py) propose points
until the budget or its own limit ends the run, logging every score; then the best point's check
over the whole target length. A rerun with the same log resumes where the last one stopped."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..evaluation.perplexity.run import sliding_nll
from ..patcher import is_patched, trained_length
from ..rope.compat import get_rope_parameters, rotary_dim, text_config
from ..rope.longrope import rope_powers
from .log import SearchLog, SearchSettings, open_log
from .needle import OBJECTIVES, Needle, needle_objective
from .objective import objective, proxy_chunks
from .space import Factors, Installed, seed_candidates
from .strategy import Strategy, as_best


@dataclass(frozen=True)
class SearchOptions:
    """What the caller asks of one run (the strategy's own knobs live in the strategy)."""
    target_length: int
    proxy_length: int | None = None   # tokens per evaluation (proxy_chunks); None: the target
    budget_minutes: float = 60.0      # the whole run, baseline and seeds included
    data: str = ""                    # fingerprint of the tuning tokens (the log records it)
    final_check: bool = True          # score the best point over the whole target length
    progress: bool = True             # a tqdm bar
    objective: str = "perplexity"     # or "needle" (needle.py), scoring `needles`
    needles: Sequence[Needle] = ()    # needle.needles of the tuning documents


@dataclass
class SearchResult:
    factors: list[float]
    attention_factor: float
    nll: float                    # mean NLL at the target length on the tuning text
    proxy_nll: float              # the search objective (mean NLL over the proxy spans)
    baseline_nll: float           # the unpatched model, sliding window of L, same tokens
    source: str                   # "step N", "generation N" or the seed method it is
    steps: int                    # the strategy's evaluations (gradient steps, candidates)
    checked: bool = True          # False: `nll` is the proxy objective (final_check=False)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    @property
    def ratio(self) -> float:
        return math.exp(self.nll - self.baseline_nll)


@dataclass
class _Run:
    """A search under way: its log, settings, clock, baseline and the factors it scores."""
    model: object
    docs: Sequence[np.ndarray]
    log: SearchLog
    settings: SearchSettings
    elapsed: Callable[[], float]
    baseline: float
    dim: int                      # rotary dimension and base of the model's plain RoPE
    base: float
    params: Factors
    needles: Sequence[Needle] = ()  # the needle objective's documents; empty: plain perplexity

    def score(self, spans, grad: bool = False) -> torch.Tensor:
        """The searched objective: needle-driven (the needles carry their own pieces) or the
        perplexity over `spans`."""
        if self.needles:
            return needle_objective(self.model, self.needles, grad)
        return objective(self.model, self.docs, spans, grad)


def run_search(model, docs: Sequence[np.ndarray], log_path: str | Path, options: SearchOptions,
               strategy: Strategy) -> SearchResult:
    """Search factors for `model` (plain RoPE, weights untouched) on the token arrays `docs`
    (each at least `target_length` + 1 tokens) with `strategy`, logging to `log_path`; resumes
    from that log. `options.objective` "needle" scores `options.needles` (needle.needles of the
    same docs) instead of the perplexity; the final check is plain perplexity either way. Returns the
    best point found (the best seed when nothing beats it)."""
    if options.objective not in OBJECTIVES:
        raise ValueError(f"objective {options.objective!r}: use one of {', '.join(OBJECTIVES)}.")
    if (options.objective == "needle") != bool(options.needles):
        raise ValueError("the needle objective scores needle documents (hf_posext.search.needle."
                         "needles) and only it: pass them with objective='needle'.")
    run = _start(model, docs, log_path, options, strategy)
    run.needles = options.needles
    with Installed(model, run.params, rope_powers(run.dim, run.base)):
        best = _seeds(run)
        for row in strategy.logged(run.log):
            best = row if row["nll"] < best["nll"] else best
        best = _loop(run, strategy, best, options)
        steps = len(run.log.of(strategy.kind))
        if not options.final_check:
            return SearchResult(best["factors"], best["attention_factor"], best["nll"], best["nll"],
                                run.baseline, best["source"], steps, checked=False)
        return _checked(run, best, steps)


def _start(model, docs, log_path, options: SearchOptions, strategy: Strategy) -> _Run:
    """Check the model and the log (a resumed run must have the same settings), freeze the
    weights and score the sliding baseline (once: from the log when resuming)."""
    config = text_config(model.config)
    rope = get_rope_parameters(config)
    if is_patched(model) or rope.get("rope_type", "default") != "default":
        raise ValueError("search starts from a model with plain RoPE; unpatch it (or load the "
                         "un-extended checkpoint) first.")
    trained, target = trained_length(model), options.target_length
    if target <= trained:
        raise ValueError(f"target length {target} must exceed the trained length {trained}.")
    settings = SearchSettings(target, options.proxy_length or target, strategy.lr, trained,
                              options.data, strategy.algorithm, options.objective)
    log = open_log(log_path, settings)
    elapsed = log.clock()
    for p in model.parameters():
        p.requires_grad_(False)
    rows = log.of("baseline")
    if rows:
        baseline = rows[0]["nll"]
    else:
        with torch.no_grad():
            total, count = sliding_nll(model, docs, trained, trained // 4, target)
        baseline = log.add({"kind": "baseline", "window": trained, "nll": total / count,
                            "tokens": count, "elapsed": elapsed()})["nll"]
    dim = rotary_dim(config)
    return _Run(model, docs, log, settings, elapsed, baseline, dim, float(rope["rope_theta"]),
                Factors([1.0] * (dim // 2), 1.0))


def _seeds(run: _Run) -> dict:
    """Score each seed once (LongRoPE's start: the static methods' exact factors); the best."""
    s = run.settings
    done = {r["method"]: r for r in run.log.of("seed")}
    seeds = seed_candidates(run.dim, run.base, s.baseline_window, s.target_length / s.baseline_window)
    for method, (f, a) in seeds.items():
        if method not in done:
            run.params.load(f, a)
            nll = float(run.score(proxy_chunks(s.target_length, s.proxy_length)))
            done[method] = run.log.add({"kind": "seed", "method": method, "factors": f,
                                        "attention_factor": a, "nll": nll, "elapsed": run.elapsed()})
    best = min(done.values(), key=lambda r: r["nll"])
    return as_best(best["factors"], best["attention_factor"], best["nll"], best["method"])


def _loop(run: _Run, strategy: Strategy, best: dict, options: SearchOptions) -> dict:
    """Propose, score, log, update until the budget or the strategy's own limit ends it."""
    budget = options.budget_minutes * 60.0
    spans = proxy_chunks(run.settings.target_length, run.settings.proxy_length)
    strategy.start(run.log, run.params, best)
    with strategy.session(run.model), _Progress(options.progress, budget, run.elapsed, strategy.desc) as bar:
        while run.elapsed() < budget and (point := strategy.propose()) is not None:
            loss = run.score(spans, grad=strategy.gradient)
            nll = float(loss.detach())
            if nll < best["nll"]:  # equal: the same point (a gradient step 1 re-reads the seed)
                best = as_best(point.factors, point.attention_factor, nll, point.source)
            row = strategy.update(point, loss, best)
            ratio = math.exp(best["nll"] - run.baseline)
            run.log.add({**row, "best_nll": best["nll"], "best_ratio": ratio, "elapsed": run.elapsed()})
            bar.show(**{strategy.counter: row[strategy.counter], "best_ratio": f"{ratio:.4f}"})
    return best


def _checked(run: _Run, best: dict, steps: int) -> SearchResult:
    """The best point's NLL over the whole target length (once per best point, logged), so the
    printed perplexity and ratio to the sliding baseline are full-length figures."""
    key = [best["factors"], best["attention_factor"]]
    rows = [r for r in run.log.of("check") if [r["factors"], r["attention_factor"]] == key]
    if rows:
        nll = rows[0]["nll"]
    else:
        run.params.load(best["factors"], best["attention_factor"])
        # plain perplexity over the whole target, whatever the search optimised
        nll = float(objective(run.model, run.docs, [(0, run.settings.target_length)], False))
        run.log.add({"kind": "check", "factors": best["factors"],
                     "attention_factor": best["attention_factor"], "source": best["source"],
                     "nll": nll, "ratio": math.exp(nll - run.baseline),
                     "elapsed": run.elapsed()})
    return SearchResult(best["factors"], best["attention_factor"], nll, best["nll"], run.baseline,
                        best["source"], steps)


class _Progress:
    """A tqdm bar over the time budget in seconds (nothing when off)."""

    def __init__(self, on: bool, budget: float, elapsed: Callable[[], float], desc: str):
        self.on, self.budget, self.elapsed, self.desc, self.bar = on, round(budget), elapsed, desc, None

    def __enter__(self):
        if self.on:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=self.budget, initial=min(round(self.elapsed()), self.budget), unit="s",
                            desc=self.desc, leave=True)
        return self

    def show(self, **postfix) -> None:
        if self.bar is not None:
            self.bar.set_postfix(**postfix)
            self.bar.update(max(0, min(round(self.elapsed()), self.budget) - self.bar.n))

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()

"""The gradient search (`hf_posext.search_factors`, `hf-posext search --algorithm gradient`): Adam on
(log f, log attention factor) with the weights frozen. The loss is differentiable in inv'_i (cos
and sin of position × inv'_i), so one backward gives every direction at once. Early rejection
(LongRoPE's cost cut, arXiv 2402.13753 §3.2): a step whose objective is worse than the best goes
back to the best and halves the step size. Steps log their parameters and Adam moments, so a
resumed run continues where it stopped.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..rope.compat import checkpointing
from .log import SearchLog
from .run import SearchOptions, SearchResult, run_search
from .space import Factors
from .strategy import Point, as_best


@dataclass
class Gradient:
    """The gradient strategy: its knobs (`lr`, `max_steps`: None, the budget alone) and, once
    started, Adam's state over the run's factors."""
    lr: float = 0.05
    max_steps: int | None = None
    kind, counter, desc, gradient, algorithm = "step", "step", "search", True, "gradient"

    def logged(self, log: SearchLog) -> list[dict]:
        return [as_best(r["factors"], r["attention_factor"], r["checked"], f"step {r['step']}")
                for r in log.of("step") if r.get("checked") is not None]

    def start(self, log: SearchLog, params: Factors, best: dict) -> None:
        """From the best seed, or from the last logged step with its Adam moments (resuming)."""
        steps = log.of("step")
        last = steps[-1] if steps else None
        self.params, self.step = params, last["step"] if last else 0
        self.rate = last["lr"] if last else self.lr
        if last:
            params.load(last["next_factors"], last["next_attention_factor"])
        else:
            params.load(best["factors"], best["attention_factor"])
        self.opt = torch.optim.Adam(params.parameters(), lr=self.rate)
        if last and last.get("m") is not None:  # Adam's moments back from the log
            for p, m, v in zip(params.parameters(), last["m"], last["v"]):
                self.opt.state[p] = {"step": torch.tensor(float(last["step"])),
                                     "exp_avg": torch.tensor(m).reshape(p.shape),
                                     "exp_avg_sq": torch.tensor(v).reshape(p.shape)}

    def propose(self) -> Point | None:
        if self.max_steps is not None and self.step >= self.max_steps:
            return None
        self.step += 1
        f, a = self.params.values()
        return Point(f, a, f"step {self.step}", {"kind": "step", "step": self.step})

    def update(self, point: Point, loss: torch.Tensor, best: dict) -> dict:
        self.opt.zero_grad()
        loss.backward()
        checked = float(loss.detach())  # the objective at the parameters before this step
        rejected = checked > best["nll"]
        if rejected:  # early rejection: back to the best point with half the step size
            self.rate /= 2
            self.params.load(best["factors"], best["attention_factor"])
            self.opt = torch.optim.Adam(self.params.parameters(), lr=self.rate)
        else:
            self.opt.step()
            self.params.project()
        nf, na = self.params.values()
        state = [self.opt.state.get(p) for p in self.params.parameters()]
        m = v = None
        if all(s is not None for s in state):
            m = [s["exp_avg"].flatten().tolist() for s in state]
            v = [s["exp_avg_sq"].flatten().tolist() for s in state]
        return {**point.fields, "factors": point.factors, "attention_factor": point.attention_factor,
                "proxy_nll": checked, "checked": checked, "rejected": rejected, "lr": self.rate,
                "next_factors": nf, "next_attention_factor": na, "m": m, "v": v}

    @contextmanager
    def session(self, model):
        """Layers checkpointed, in training mode, where transformers checkpoints (these models
        have no dropout)."""
        checkpointing(model, True)
        model.train()
        try:
            yield
        finally:
            checkpointing(model, False)
            model.eval()


def search_factors(model, docs: Sequence[np.ndarray], target_length: int, log_path: str | Path, *,
                   budget_minutes: float = 60.0, proxy_length: int | None = None, lr: float = 0.05,
                   max_steps: int | None = None, data: str = "", final_check: bool = True,
                   progress: bool = True) -> SearchResult:
    """`hf_posext.search_factors`: the gradient search of `model` (plain RoPE, weights untouched) on the
    token arrays `docs` (each at least `target_length` + 1 tokens), logging to `log_path` and
    resuming from it; `run_search` with `Gradient(lr, max_steps)` (run.py, the knobs there).
    With `final_check` False the result's `nll` is the proxy objective, not a full-length figure."""
    options = SearchOptions(target_length, proxy_length, budget_minutes, data, final_check, progress)
    return run_search(model, docs, log_path, options, Gradient(lr, max_steps))

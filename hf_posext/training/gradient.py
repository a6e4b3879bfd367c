"""The gradient search (`hf_posext.search`, `hf-posext search --algorithm gradient`): Adam on
(log f, log attention factor) with the weights frozen. The loss is differentiable in inv'_i (cos
and sin of position × inv'_i), so one backward gives every direction at once. Early rejection
(LongRoPE's cost cut): a step whose objective is worse than the best goes back to the best and
halves the step size. Steps log their parameters and Adam moments, so a resumed run continues.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .factor_search import (SearchLog, SearchResult, SearchSettings, _Factors, _finish, _Installed,
                            _loss, _start, proxy_chunks)


def search(model, docs: Sequence[np.ndarray], target_length: int, log_path: str | Path, *,
           budget_minutes: float = 60.0, proxy_length: int | None = None, lr: float = 0.05,
           max_steps: int | None = None, data: str = "", final_check: bool = True,
           progress: bool = True) -> SearchResult:
    """Search factors for `model` (plain RoPE, weights untouched) on the token arrays `docs`
    (each at least `target_length` + 1 tokens), logging to `log_path`; resumes from that log.
    Returns the best config found (the best seed when no step beats it); with `final_check`
    False its `nll` is the proxy objective, not a full-length figure (saves a target-length
    forward). `evolution.evolve` searches the same space by LongRoPE's evolutionary search."""
    run = _start(model, docs, target_length, log_path, proxy_length, lr, data)
    params = _Factors([1.0] * (run.dim // 2), 1.0)
    with _Installed(model, params, run.powers):
        best = _descend(model, docs, params, run.best, run.settings, run.log, budget_minutes,
                        max_steps, run.elapsed, progress, run.baseline)
    return _finish(model, docs, run, best, final_check, steps=len(run.log.of("step")))


def _descend(model, docs, params: _Factors, best: dict, settings: SearchSettings, log: SearchLog,
             budget_minutes: float, max_steps: int | None, elapsed, progress: bool,
             baseline: float) -> dict:
    """Adam on (log f, log a) from the best seed, or from the last logged step when resuming."""
    steps = log.of("step")
    for row in steps:
        if row.get("checked") is not None and row["checked"] < best["nll"]:
            best = {"factors": row["factors"], "attention_factor": row["attention_factor"],
                    "nll": row["checked"], "source": f"step {row['step']}"}
    state = steps[-1] if steps else {"factors": best["factors"], "attention_factor": best["attention_factor"],
                                     "lr": settings.lr, "step": 0, "m": None, "v": None}
    with torch.no_grad():
        params.log_f.copy_(torch.tensor(state["next_factors"] if steps else state["factors"],
                                        dtype=torch.float64).log())
        params.log_a.fill_(math.log(state["next_attention_factor"] if steps else state["attention_factor"]))
    lr = state["lr"]
    opt = torch.optim.Adam(params.parameters(), lr=lr)
    if state.get("m") is not None:  # Adam moments back from the log: the resumed run continues
        for p, m, v in zip(params.parameters(), state["m"], state["v"]):
            opt.state[p] = {"step": torch.tensor(float(state["step"])),
                            "exp_avg": torch.tensor(m).reshape(p.shape),
                            "exp_avg_sq": torch.tensor(v).reshape(p.shape)}
    step, budget = state["step"], budget_minutes * 60.0
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=round(budget), initial=min(round(elapsed()), round(budget)), unit="s",
                   desc="search", leave=True)
    # transformers 5.x renamed gradient_checkpointing_* to activation_checkpointing_* (4.57: old)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        disable = model.activation_checkpointing_disable
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        disable = model.gradient_checkpointing_disable
    model.train()  # transformers checkpoints layers in training mode only (no dropout in these)
    try:
        while elapsed() < budget and (max_steps is None or step < max_steps):
            step += 1
            f, a = params.values()
            opt.zero_grad()
            loss = _loss(model, docs, proxy_chunks(settings.target_length, settings.proxy_length), grad=True)
            loss.backward()
            checked = float(loss.detach())  # the objective at the parameters before this step
            rejected = checked > best["nll"]
            if checked < best["nll"]:  # equal: the same point (step 1 re-reads the seed)
                best = {"factors": f, "attention_factor": a, "nll": checked, "source": f"step {step}"}
            if rejected:  # early rejection: back to the best point with half the step size
                lr /= 2
                with torch.no_grad():
                    params.log_f.copy_(torch.tensor(best["factors"], dtype=torch.float64).log())
                    params.log_a.fill_(math.log(best["attention_factor"]))
                opt = torch.optim.Adam(params.parameters(), lr=lr)
            else:
                opt.step()
                params.project()
            nf, na = params.values()
            st = [opt.state.get(p) for p in params.parameters()]
            moments = None if any(s is None for s in st) else (
                [s["exp_avg"].flatten().tolist() for s in st],
                [s["exp_avg_sq"].flatten().tolist() for s in st])
            log.add({"kind": "step", "step": step, "factors": f, "attention_factor": a,
                     "proxy_nll": checked, "checked": checked, "rejected": rejected, "lr": lr,
                     "next_factors": nf, "next_attention_factor": na,
                     "m": moments and moments[0], "v": moments and moments[1],
                     "best_nll": best["nll"], "best_ratio": math.exp(best["nll"] - baseline),
                     "elapsed": elapsed()})
            if bar is not None:
                bar.set_postfix(step=step, best_ratio=f"{math.exp(best['nll'] - baseline):.4f}")
                bar.update(max(0, min(round(elapsed()), round(budget)) - bar.n))
    finally:
        disable()
        model.eval()
        if bar is not None:
            bar.close()
    return best

"""Optimiser, schedule and gradient norms for the recipe, following the YaRN paper §4.1:
AdamW, lr 2e-5, betas (0.9, 0.95), no weight decay, linear warm-up over 20 steps, then constant."""

from __future__ import annotations

import math
from typing import Iterable

import torch

SCHEDULES = ("constant_with_warmup", "linear", "cosine")


def build_optimizer(params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float],
                    weight_decay: float) -> torch.optim.AdamW:
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("No trainable parameters: with LoRA, check lora.target_modules names the "
                         "model's projection layers.")
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


def build_scheduler(optimizer, name: str, warmup_steps: int, total_steps: int):
    """LambdaLR: linear warm-up from lr/warmup to lr over `warmup_steps`, then `name`'s decay."""
    if name not in SCHEDULES:
        raise ValueError(f"Unknown lr schedule {name!r}; use one of {SCHEDULES}.")

    def factor(step: int) -> float:   # `step` = optimizer steps already taken
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if name == "constant_with_warmup":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        if name == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def grad_norm(parameters: Iterable[torch.nn.Parameter]) -> float:
    """The global L2 norm of the gradients, computed independently of the clipping code so the
    log shows whether clipping really happened (float64 to avoid fp32 round-off in the sum)."""
    total = 0.0
    for p in parameters:
        if p.grad is not None:
            total += float(p.grad.detach().double().pow(2).sum())
    return math.sqrt(total)

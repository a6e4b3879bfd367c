"""Optimiser, schedule and gradient norms for the recipe, following the YaRN paper §4.1:
AdamW, lr 2e-5, betas (0.9, 0.95), no weight decay, linear warm-up over 20 steps, then constant.

Schedules are `transformers.get_scheduler`'s (the Trainer's): the same names and shapes users know
from `TrainingArguments.lr_scheduler_type`, instead of a hand-written LambdaLR."""

from __future__ import annotations

import math
from typing import Iterable

import torch
from transformers import get_scheduler

SCHEDULES = ("constant_with_warmup", "linear", "cosine")


def build_optimizer(params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float],
                    weight_decay: float) -> torch.optim.AdamW:
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("No trainable parameters: with LoRA, check lora.target_modules names the "
                         "model's projection layers.")
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


def build_scheduler(optimizer, name: str, warmup_steps: int, total_steps: int):
    """`transformers.get_scheduler(name)`: warm-up from 0 over `warmup_steps`, then `name`'s shape;
    stepped once per optimizer step."""
    if name not in SCHEDULES:
        raise ValueError(f"Unknown lr schedule {name!r}; use one of {SCHEDULES}.")
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


def grad_norm(parameters: Iterable[torch.nn.Parameter]) -> float:
    """The global L2 norm of the gradients, computed independently of the clipping code so the
    log shows whether clipping really happened (float64 to avoid fp32 round-off in the sum)."""
    total = 0.0
    for p in parameters:
        if p.grad is not None:
            total += float(p.grad.detach().double().pow(2).sum())
    return math.sqrt(total)

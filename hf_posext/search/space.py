"""The searched space (LongRoPE, Ding et al. 2024, arXiv 2402.13753, §3.2): one rescale factor
f_i per rotary frequency (inv'_i = inv_i / f_i, f_i >= 1, non-decreasing from high to low
frequency) and the cos/sin attention factor; a rotary module that computes cos/sin from them
with gradients; and the seeds, every static rope-only method in its exact longrope form."""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..rope.config import RopeExtensionConfig
from ..rope.longrope import rescale_factors
from ..rope.registry import rotary_modules
from ..rope.units import STATIC_METHODS

SEED_METHODS = STATIC_METHODS  # every static method seeds the search (its exact factors)


class Factors(torch.nn.Module):
    """The searched parameters: log f_i (one per frequency) and log attention_factor."""

    def __init__(self, factors: Sequence[float], attention_factor: float):
        super().__init__()
        self.log_f = torch.nn.Parameter(torch.tensor(factors, dtype=torch.float64).log().float())
        self.log_a = torch.nn.Parameter(torch.tensor(math.log(attention_factor)))

    @torch.no_grad()
    def load(self, factors: Sequence[float], attention_factor: float) -> None:
        """Move to the point (factors, attention_factor), in place (an optimiser keeps its state)."""
        self.log_f.copy_(torch.tensor(factors, dtype=torch.float64).log())
        self.log_a.fill_(math.log(attention_factor))

    @torch.no_grad()
    def project(self) -> None:
        """LongRoPE's constraints: f_i >= 1 and non-decreasing towards low frequencies."""
        self.log_f.clamp_(min=0.0)
        self.log_f.copy_(torch.cummax(self.log_f, 0).values)

    def values(self) -> tuple[list[float], float]:
        return self.log_f.detach().double().exp().tolist(), float(self.log_a.detach().exp())


class SearchRotary(torch.nn.Module):
    """A rotary module computing cos/sin from the searched factors with gradients, as
    transformers' longrope does (1 / (f_i · b^(2i/d)), cos/sin × attention_factor)."""

    powers: torch.Tensor   # a buffer (register_buffer below)

    def __init__(self, params: Factors, powers: torch.Tensor):
        super().__init__()
        self.params = params
        self.register_buffer("powers", powers, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        inv_freq = 1.0 / (self.params.log_f.exp() * self.powers)                   # [d/2]
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]          # [B, T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)                                     # [B, T, d]
        a = self.params.log_a.exp()
        return (emb.cos() * a).to(x.dtype), (emb.sin() * a).to(x.dtype)


class Installed:
    """Swap every rotary module for a `SearchRotary` while inside the block."""

    def __init__(self, model, params: Factors, powers: torch.Tensor):
        self.model, self.params, self.powers, self.saved = model, params, powers, []

    def __enter__(self):
        for parent, name, module in rotary_modules(self.model):
            self.saved.append((parent, name, module))
            setattr(parent, name, SearchRotary(self.params, self.powers))
        return self

    def __exit__(self, *exc):
        for parent, name, module in self.saved:
            setattr(parent, name, module)


def seed_candidates(dim: int, base: float, trained: int,
                    factor: float) -> dict[str, tuple[list[float], float]]:
    """The rope-only methods in their longrope form: method -> (factors, attention_factor)."""
    out = {}
    for method in SEED_METHODS:
        try:
            out[method] = rescale_factors(RopeExtensionConfig(method, factor, trained), dim, base)
        except ValueError:   # cope on a model none of whose components it clips: plain RoPE,
            continue         # which is no seed (the search's own start is plain RoPE's factors)

    return out

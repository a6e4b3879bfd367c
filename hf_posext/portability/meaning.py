"""What a checkpoint's rope *means* (its method on a base, compared at L, midway and s·L) and how
far a reader's reading is from it. Split out of verdicts.py so that portable.py (which asks
"does transformers read this rope as that method?") and verdicts.py no longer import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import engines
from ..rope.config import RopeExtensionConfig
from ..rope.registry import compute

TOLERANCE = 1e-5


@dataclass(frozen=True)
class Meaning:
    """What a checkpoint means: its rope method (None: plain RoPE), original base, dim, the
    lengths compared, and its attention-level method (the `hf_posext_attention` entry) if any."""
    spec: RopeExtensionConfig | None
    theta: float
    dim: int
    lengths: tuple[int, ...]
    attention: dict[str, Any] | None = None

    def freqs(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        if self.spec is None:
            return engines.plain(self.dim, self.theta), 1.0
        inv, scale = compute(self.spec, self.dim, self.theta, seq_len)
        return inv.double(), float(scale)

    @property
    def label(self) -> str:
        if self.spec is None:
            rope = "plain RoPE"
        else:
            knobs = ", ".join(f"{k}={v:g}" for k, v in self.spec.knobs.items())
            rope = f"{self.spec.method} (factor {self.spec.factor:g}{', ' + knobs if knobs else ''})"
        if self.attention is None:
            return rope
        knobs = ", ".join(f"{k}={v}" for k, v in self.attention.items() if k != "method")
        return f"{rope} + attention method {self.attention.get('method')!r} ({knobs})"


def meaning_of(spec: RopeExtensionConfig, theta: float, dim: int, max_pos: int) -> Meaning:
    """`spec` on base `theta`, compared at L, midway and s·L (where dynamic methods differ)."""
    if spec.factor == 1.0:
        return Meaning(None, theta, dim, (max_pos,))
    L = spec.trained_length or max_pos
    return Meaning(spec, theta, dim, tuple(sorted({L, round(L * (1 + spec.factor) / 2),
                                                   round(L * spec.factor)})))


def errors(reading: engines.Reading, target: Meaning) -> tuple[float, float]:
    """Max relative inv_freq error and scale error of `reading` against `target` over its lengths."""
    freq_err = scale_err = 0.0
    for length in target.lengths:
        inv, scale = reading.freqs(length)
        ref, ref_scale = target.freqs(length)
        freq_err = max(freq_err, ((inv.double() - ref).abs() / ref).max().item())
        scale_err = max(scale_err, abs(scale - ref_scale) / ref_scale)
    return freq_err, scale_err

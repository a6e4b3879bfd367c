"""Every static rope-only method written as transformers' `longrope` rope config.

transformers' `longrope` (`_compute_longrope_parameters`, 4.57 and 5.x) computes

    inv_freq'_i = 1 / (f_i · b^(2i/d))        cos/sin × attention_factor

with `f = short_factor` up to `original_max_position_embeddings` and `long_factor` beyond (the
LongRoPE paper's rescale factors λ_i, arXiv 2402.13753 §3). A static method's frequencies are a
fixed per-frequency rescale of plain RoPE, so it is exactly this with f_i = inv_freq_i / inv'_i
(linear: f_i = s; NTK-aware: f_i = s^(2i/(d−2)); NTK-by-parts and YaRN: the ramp between 1 and
s) and its cos/sin scale as an explicit `attention_factor`. Two details make the form exact in
both versions (read from transformers' `_compute_longrope_parameters` and, for the choice of
set, `longrope_frequency_update` in modeling_rope_utils.py; docs/dynamic.md):

- `short_factor` = `long_factor`: which set transformers picks depends on the sequence length and,
  in 4.57, on `config.max_position_embeddings` rather than the dict's L; equal sets make the
  choice irrelevant, as a static method must be.
- `attention_factor` is always written: its default (sqrt(1 + ln s / ln L)) is LongRoPE's, not
  the method's.

f_i is computed against the float32 power b^(2i/d) transformers itself multiplies, so
transformers' float32 product gives back the method's inv'_i to about one ulp.
Dynamic methods have no such form: their frequencies change with every length.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .config import RopeExtensionConfig
from .registry import compute
from .units import STATIC_METHODS, UNITS


def rope_powers(dim: int, base: float) -> torch.Tensor:
    """b^(2i/d) in float32, as transformers' `_compute_longrope_parameters` computes it, [d/2]."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return base ** exponents


def factors_of(inv_freq: torch.Tensor, dim: int, base: float) -> list[float]:
    """The longrope rescale factors f_i with 1 / (f_i · b^(2i/d)) = inv_freq_i."""
    return (1.0 / (inv_freq.double().cpu() * rope_powers(dim, base).double())).tolist()


def rescale_factors(spec: RopeExtensionConfig, dim: int, base: float) -> tuple[list[float], float]:
    """A static method's longrope factors and cos/sin scale: the unit's closed form where it has
    one (CoPE: 1/w_i, a frozen component written as `units.FROZEN_FACTOR`), else `factors_of`
    its frequencies."""
    inv_freq, scale = compute(spec, dim, base)
    closed = UNITS[spec.method].longrope_factors
    factors = closed(spec, dim, base) if closed is not None else factors_of(inv_freq, dim, base)
    return factors, float(scale)


def longrope_dict(factors: Sequence[float], attention_factor: float, base: float,
                  original_max: int, factor: float, short_factors: Sequence[float] | None = None,
                  **extra: Any) -> dict[str, Any]:
    """A `longrope` rope dict (5.x flat layout, with rope_theta) with the cos/sin scale written
    out: `factors` beyond L, and `short_factors` up to L (default: the same set at every length)."""
    factors = [float(f) for f in factors]
    short = factors if short_factors is None else [float(f) for f in short_factors]
    if len(short) != len(factors):
        raise ValueError(f"short_factors has {len(short)} values, the long set {len(factors)}: "
                         "one per rotary frequency in both")
    return {"rope_type": "longrope", "rope_theta": float(base), "factor": float(factor),
            "original_max_position_embeddings": int(original_max),
            "short_factor": list(short), "long_factor": list(factors),
            "attention_factor": float(attention_factor), **extra}


def longrope_form(spec: RopeExtensionConfig, dim: int, base: float, **extra: Any) -> dict[str, Any]:
    """The exact `longrope` rope dict of a static method `spec` on rotary dim `dim`, base `base`
    (`extra`: e.g. partial_rotary_factor, copied through)."""
    if spec.is_dynamic:
        raise ValueError(f"{spec.method!r} has no longrope form: its frequencies follow the current "
                         "length, while longrope holds one fixed factor set per side of L. Use a "
                         f"static method ({', '.join(STATIC_METHODS)}).")
    if spec.trained_length is None:
        raise ValueError("the longrope form needs trained_length (the trained "
                         "length L); pass it or let hf_posext.patch read it from the model.")
    factors, scale = rescale_factors(spec, dim, base)
    return longrope_dict(factors, scale, base, spec.trained_length, spec.factor,
                         **extra)


# The checkpoint `hf-posext search` writes is a `longrope` config; `check`'s table and the engine
# measurements stand it for with the searched form's seed, YaRN at the same s (LONGROPE_SEED).
LONGROPE_SEED = "yarn"


def longrope_knobs(spec: RopeExtensionConfig, dim: int, base: float) -> dict[str, Any]:
    """The keyword arguments of `patch(model, "longrope", s, **knobs)` that run the static
    method `spec` as a longrope config (the three keys `hf-posext search` writes)."""
    rope = longrope_form(spec, dim, base)
    return {k: rope[k] for k in ("short_factor", "long_factor", "attention_factor")}

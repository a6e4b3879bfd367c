"""The RoPE math of every context-extension method, as plain functions.

Notation (docs/rope_methods.md): rotary dimension `d` (head_dim × partial_rotary_factor), base `b`
(rope_theta), pair index `i = 0 .. d/2-1`, `inv_freq_i = b^(-2i/d)`, wavelength
`λ_i = 2π / inv_freq_i`, trained context `L` (original_max_position_embeddings), scale `s`.

Every function returns `(inv_freq, attention_scale)`: `inv_freq` is a float32 tensor of shape
`[d/2]`, `attention_scale` multiplies cos and sin (so attention logits scale by its square).
Frequencies are always computed in float32 (float64 for the base arithmetic): a bf16
position × frequency product loses precision past a few hundred tokens.

At `s = 1` every method is the identity and returns the default frequencies exactly.
"""

from __future__ import annotations

import math

import torch

Freqs = tuple[torch.Tensor, float]


def default_inv_freq(dim: int, base: float, device=None) -> torch.Tensor:
    """Original RoPE (Su et al. 2021): inv_freq_i = b^(-2i/d), shape [d/2], float32."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim
    return 1.0 / (base ** exponents)


def linear(dim: int, base: float, factor: float, device=None) -> Freqs:
    """Position Interpolation (Chen et al. 2023, eq. 4): positions m -> m/s, i.e. inv_freq / s."""
    return default_inv_freq(dim, base, device) / factor, 1.0


def ntk_base(dim: int, base: float, factor: float) -> float:
    """NTK-aware base change (bloc97, 2023): b' = b · s^(d/(d-2)).

    The exponent makes the lowest frequency (i = d/2 - 1) exactly interpolated by s while the
    highest (i = 0) is untouched."""
    return base * factor ** (dim / (dim - 2))


def ntk(dim: int, base: float, factor: float, device=None) -> Freqs:
    """Static NTK-aware scaling: default RoPE with the base b' of `ntk_base`."""
    if factor == 1.0:
        return default_inv_freq(dim, base, device), 1.0
    return default_inv_freq(dim, ntk_base(dim, base, factor), device), 1.0


def dynamic_ntk_base(dim: int, base: float, factor: float, original_max: int, seq_len: int) -> float:
    """Dynamic NTK's base at the current length l (emozilla 2023; transformers `dynamic`):
    b' = b · ((s·l/L) − (s−1))^(d/(d−2)), the NTK base of `ntk_base` at the scale s·l/L − (s−1)."""
    return ntk_base(dim, base, (factor * seq_len / original_max) - (factor - 1))


def dynamic_ntk(dim: int, base: float, factor: float, original_max: int, seq_len: int | None,
                device=None) -> Freqs:
    """Dynamic NTK: `dynamic_ntk_base` for l > L; unchanged for l <= L."""
    if seq_len is None or seq_len <= original_max:
        return default_inv_freq(dim, base, device), 1.0
    return default_inv_freq(dim, dynamic_ntk_base(dim, base, factor, original_max, seq_len), device), 1.0


# ---- NTK-by-parts / YaRN (Peng et al. 2023, arXiv 2309.00071, §3.2-3.4) --------------------

def correction_dim(num_rotations: float, dim: int, base: float, original_max: int) -> float:
    """The (fractional) dimension index whose frequency makes `num_rotations` full turns over L.

    From r = L / λ and λ_j = 2π · b^(j/d) (j the dimension index, 2i):
    dim(r) = d · ln(L / (2π r)) / (2 ln b)   (YaRN reference code, `find_correction_dim`)."""
    return dim * math.log(original_max / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def correction_range(beta_fast: float, beta_slow: float, dim: int, base: float,
                     original_max: int) -> tuple[int, int]:
    """Pair indices [low, high] where the ramp runs: frequencies turning more than beta_fast times
    over L (below `low`) keep extrapolating, those turning fewer than beta_slow times (above
    `high`) are fully interpolated. floor/ceil and the clamp to [0, d-1] follow the reference code."""
    low = math.floor(correction_dim(beta_fast, dim, base, original_max))
    high = math.ceil(correction_dim(beta_slow, dim, base, original_max))
    return max(low, 0), min(high, dim - 1)


def yarn_ramp(low: float, high: float, n: int, device=None) -> torch.Tensor:
    """The ramp γ over pair index j: clamp((j − low)/(high − low), 0, 1), shape [n = d/2].

    0 where a frequency is kept (high frequencies), 1 where it is fully interpolated. The paper
    writes the extrapolation weight as 1 − γ(r); the reference code (and this) ramps over j."""
    if low == high:
        high += 0.001  # avoid a division by zero when the range collapses (reference code)
    j = torch.arange(n, dtype=torch.float32, device=device)
    return torch.clamp((j - low) / (high - low), 0.0, 1.0)


def ntk_by_parts(dim: int, base: float, factor: float, original_max: int,
                 beta_fast: float = 32.0, beta_slow: float = 1.0, device=None) -> Freqs:
    """NTK-by-parts (YaRN §3.2): interpolate low frequencies by s, keep high ones, ramp between.

    inv_freq'_i = (1 − w_i) · inv_freq_i / s + w_i · inv_freq_i, with extrapolation weight
    w = 1 − ramp."""
    inv_freq = default_inv_freq(dim, base, device)
    if factor == 1.0:
        return inv_freq, 1.0
    low, high = correction_range(beta_fast, beta_slow, dim, base, original_max)
    extrapolation = 1.0 - yarn_ramp(low, high, dim // 2, device)
    return (inv_freq / factor) * (1.0 - extrapolation) + inv_freq * extrapolation, 1.0


def yarn_mscale(factor: float, coefficient: float = 0.1) -> float:
    """YaRN attention temperature (§3.4, eq. 22): sqrt(1/t) = 0.1·ln(s) + 1 for s > 1, else 1.

    The YaRN authors' Mistral runs used coefficient 0.07."""
    if factor <= 1.0:
        return 1.0
    return coefficient * math.log(factor) + 1.0


def yarn(dim: int, base: float, factor: float, original_max: int, beta_fast: float = 32.0,
         beta_slow: float = 1.0, mscale_coefficient: float = 0.1,
         attention_factor: float | None = None, device=None) -> Freqs:
    """YaRN (§3.4): NTK-by-parts frequencies plus the attention temperature.

    cos and sin are multiplied by mscale (so q·k logits by mscale²); `attention_factor`, when
    given, replaces the mscale formula."""
    inv_freq, _ = ntk_by_parts(dim, base, factor, original_max, beta_fast, beta_slow, device)
    scale = attention_factor if attention_factor is not None else yarn_mscale(factor, mscale_coefficient)
    return inv_freq, scale


def dynamic_yarn_scale(original_max: int, seq_len: int | None, finetuned_factor: float = 1.0) -> float:
    """The scale dynamic YaRN uses at the current length l: s(l) = max(s_ft, l / L).

    Plain dynamic YaRN (§3.3) has s_ft = 1: no change up to L, then s = l / L. The YaRN reference
    code's fine-tuned mode (`LlamaDynamicYaRNScaledRotaryEmbedding(finetuned=True)`) is for a
    model fine-tuned with YaRN at s_ft: it builds static YaRN at s_ft = fine-tuned length / L
    and recomputes with s = l / L only once l exceeds the fine-tuned length s_ft·L. Both rules
    are this one maximum, since l / L <= s_ft exactly when l <= s_ft·L."""
    if seq_len is None:
        return float(finetuned_factor)
    return max(float(finetuned_factor), seq_len / original_max)


def dynamic_yarn(dim: int, base: float, original_max: int, seq_len: int | None,
                 beta_fast: float = 32.0, beta_slow: float = 1.0, mscale_coefficient: float = 0.1,
                 finetuned_factor: float = 1.0, device=None) -> Freqs:
    """Dynamic YaRN (§3.3): YaRN at the scale `dynamic_yarn_scale` gives for the current length l
    (s = max(1, l / L); fine-tuned mode: s = max(s_ft, l / L)). The ramp stays anchored at the
    trained L, as in the reference code."""
    factor = dynamic_yarn_scale(original_max, seq_len, finetuned_factor)
    return yarn(dim, base, factor, original_max, beta_fast, beta_slow, mscale_coefficient,
                device=device)

"""The RoPE math of every context-extension method, as plain functions.

Notation (docs/rope_methods.md): rotary dimension `d` (head_dim × partial_rotary_factor), base `b`
(rope_theta), pair index `i = 0 .. d/2-1`, `inv_freq_i = b^(-2i/d)`, wavelength
`λ_i = 2π / inv_freq_i`, trained context `L` (trained_length; `original_max_position_embeddings` in
transformers' rope dicts), scale `s`.

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
                     original_max: int, truncate: bool = True) -> tuple[float, float]:
    """Pair indices [low, high] where the ramp runs: frequencies turning more than beta_fast times
    over L (below `low`) keep extrapolating, those turning fewer than beta_slow times (above
    `high`) are fully interpolated. floor/ceil and the clamp to [0, d-1] follow the reference code;
    `truncate=False` keeps the fractional bounds (transformers' `truncate` key of `yarn`, which
    gpt-oss sets: `_compute_yarn_parameters.find_correction_range`)."""
    low = correction_dim(beta_fast, dim, base, original_max)
    high = correction_dim(beta_slow, dim, base, original_max)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
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
                 beta_fast: float = 32.0, beta_slow: float = 1.0, device=None,
                 truncate: bool = True) -> Freqs:
    """NTK-by-parts (YaRN §3.2): interpolate low frequencies by s, keep high ones, ramp between.

    inv_freq'_i = (1 − w_i) · inv_freq_i / s + w_i · inv_freq_i, with extrapolation weight
    w = 1 − ramp."""
    inv_freq = default_inv_freq(dim, base, device)
    if factor == 1.0:
        return inv_freq, 1.0
    low, high = correction_range(beta_fast, beta_slow, dim, base, original_max, truncate)
    extrapolation = 1.0 - yarn_ramp(low, high, dim // 2, device)
    return (inv_freq / factor) * (1.0 - extrapolation) + inv_freq * extrapolation, 1.0


def yarn_mscale(factor: float, coefficient: float = 0.1) -> float:
    """YaRN attention temperature (§3.4, eq. 22): sqrt(1/t) = 0.1·ln(s) + 1 for s > 1, else 1.

    The YaRN authors' Mistral runs used coefficient 0.07."""
    if factor <= 1.0:
        return 1.0
    return coefficient * math.log(factor) + 1.0


def deepseek_mscale(factor: float, mscale: float, mscale_all_dim: float) -> float:
    """DeepSeek's YaRN cos/sin scale: get_mscale(s, mscale) / get_mscale(s, mscale_all_dim), with
    get_mscale(s, m) = 0.1·m·ln(s) + 1 (transformers `_compute_yarn_parameters`, when both keys
    are set). DeepSeek-V3's attention multiplies its softmax scale by get_mscale(s,
    mscale_all_dim)² on top (`DeepseekV3Attention`, `yarn_apply_mscale`): with mscale ==
    mscale_all_dim the cos/sin scale is 1 and the whole temperature sits in the softmax."""
    return yarn_mscale(factor, 0.1 * mscale) / yarn_mscale(factor, 0.1 * mscale_all_dim)


def yarn(dim: int, base: float, factor: float, original_max: int, beta_fast: float = 32.0,
         beta_slow: float = 1.0, mscale_coefficient: float = 0.1,
         attention_factor: float | None = None, device=None, truncate: bool = True,
         mscale: float | None = None, mscale_all_dim: float | None = None) -> Freqs:
    """YaRN (§3.4): NTK-by-parts frequencies plus the attention temperature.

    cos and sin are multiplied by mscale (so q·k logits by mscale²); `attention_factor`, when
    given, replaces the mscale formula, and so does DeepSeek's ratio when `mscale` and
    `mscale_all_dim` are both given (`deepseek_mscale`; transformers' order of precedence)."""
    inv_freq, _ = ntk_by_parts(dim, base, factor, original_max, beta_fast, beta_slow, device, truncate)
    if attention_factor is not None:
        scale = attention_factor
    elif mscale and mscale_all_dim:
        scale = deepseek_mscale(factor, mscale, mscale_all_dim)
    else:
        scale = yarn_mscale(factor, mscale_coefficient)
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
                 finetuned_factor: float = 1.0, device=None, truncate: bool = True) -> Freqs:
    """Dynamic YaRN (§3.3): YaRN at the scale `dynamic_yarn_scale` gives for the current length l
    (s = max(1, l / L); fine-tuned mode: s = max(s_ft, l / L)). The ramp stays anchored at the
    trained L, as in the reference code."""
    factor = dynamic_yarn_scale(original_max, seq_len, finetuned_factor)
    return yarn(dim, base, factor, original_max, beta_fast, beta_slow, mscale_coefficient,
                device=device, truncate=truncate)


# ---- CoPE, clipped RoPE (Li et al. 2026, arXiv 2602.05258) ---------------------------------
# The paper's text was not reachable here (its abstract: "soft clipping low-frequency components
# of RoPE"); this follows the authors' code, github hrlics/CoPE `modeling_cope.py`
# (LlamaRotaryEmbedding.__init__: theta = linspace(0, π, clip); smooth_mask = ½(1 + cos theta);
# inv_freq[start:] *= smooth_mask, i.e. the taper multiplies the *frequency*, the rotation angle,
# not the component's amplitude; `use_hardclip`: inv_freq[start:] = 0), and the clip size of
# mlx-lm PR #1387 (commit 1712568, `CoPERoPE`: every component whose period exceeds
# original_max_position_embeddings is clipped; the authors' code fixes 20 of 64 for Llama-3-8B).

def cope_clipped(dim: int, base: float, clip_period: float) -> int:
    """How many of the d/2 components CoPE clips: those whose period 2π·b^(2i/d) (tokens per
    full turn) exceeds `clip_period`; they are the lowest frequencies, the last n pair indices."""
    return sum(2 * math.pi * base ** (2 * i / dim) > clip_period for i in range(dim // 2))


def cope_weights(dim: int, base: float, clip_period: float, hard: bool = False) -> torch.Tensor:
    """CoPE's weight w_i per component (float64, [d/2]): inv_freq_i -> w_i · inv_freq_i.

    1 for the components that turn at least once within `clip_period`; over the n clipped ones
    (j = 0 … n−1, from the boundary to the lowest frequency) the raised-cosine (Hann) taper
    w = ½(1 + cos(π·j/(n−1))): 1 at the boundary component (untouched), 0 at the lowest
    frequency (frozen: no rotation at any position). `hard`: every clipped component frozen
    (the paper's HardClip ablation). Raises when nothing would change (n < 2 for the taper,
    whose only weight is then 1; n = 0 for the hard clip)."""
    n, half = cope_clipped(dim, base, clip_period), dim // 2
    if n < (1 if hard else 2):
        raise ValueError(f"cope clips nothing here: {n} of the {half} rotary components (rotary dim "
                         f"{dim}, rope_theta {base:g}) have a period above clip_period={clip_period:g} "
                         f"tokens, and the taper needs 2 (its boundary weight is 1), so this would "
                         "be plain RoPE. Lower clip_period, or pick another method.")
    taper = torch.zeros(n, dtype=torch.float64) if hard else \
        0.5 * (1.0 + torch.cos(torch.linspace(0.0, math.pi, n, dtype=torch.float64)))
    if not hard:
        taper[-1] = 0.0   # cos(π) is -1 up to rounding: the lowest frequency frozen exactly
    return torch.cat([torch.ones(half - n, dtype=torch.float64), taper])


def cope(dim: int, base: float, factor: float, clip_period: float, hard_clip: bool = False,
         device=None) -> Freqs:
    """CoPE: `cope_weights` times the default frequencies; in-distribution components (period
    <= clip_period) bit for bit untouched, cos/sin scale 1 (no attention temperature). The
    frequencies do not depend on s (> 1 only records the target); s = 1 is no extension, the
    default frequencies, as for every method here."""
    inv_freq = default_inv_freq(dim, base, device)
    if factor == 1.0:
        return inv_freq, 1.0
    weights = cope_weights(dim, base, clip_period, hard_clip).to(device=inv_freq.device)
    return inv_freq * weights.to(torch.float32), 1.0

"""The position maps of the attention-level methods, as plain functions (docs/attention_methods.md).

Each method replaces the relative position `Δ = i − j` that RoPE gives a query at position i and a
key at position j (j <= i) by another number r(i, j). Because rotations compose,
R(a)·R(b) = R(a+b), every map below is written as a *query position* and a *key position* whose
difference is r: a query already rotated at i, rotated once more by (q_pos − i), and a key rotated
once more by (k_pos − j), score exactly as RoPE would at relative position q_pos − k_pos.

The maps split the keys of a query into a near part (Δ < window: ordinary RoPE, untouched) and a
far part (Δ >= window), where the far query/key positions below apply. Dual Chunk Attention
splits by chunk instead (`dual_chunk_*`).
"""

from __future__ import annotations

import math

import torch


# --- ReRoPE / leaky ReRoPE (Su 2023, bojone/rerope: rerope_patch.py, leaky_rerope_patch.py) -------

def rerope_far_query(i: torch.Tensor, window: int, leak: float | None) -> torch.Tensor:
    """Beyond the window ReRoPE gives every key r = w, leaky ReRoPE r = w + (Δ − w)/k.
    ReRoPE: the query sits at w, keys at 0. Leaky: positions scaled by 1/k and the query
    shifted by w(k−1)/k (the authors' `position_ids + window*(k-1)` under linear scaling k)."""
    if leak is None:
        return torch.full_like(i, float(window))
    return i / leak + window * (1.0 - 1.0 / leak)


def rerope_far_key(j: torch.Tensor, leak: float | None) -> torch.Tensor:
    return torch.zeros_like(j) if leak is None else j / leak


# --- Self-Extend (Jin et al. 2024, datamllab/LongLM self_extend_patch/Llama.py) -----------------

def self_extend_far_query(i: torch.Tensor, group_size: int, window: int) -> torch.Tensor:
    """⌊i/G⌋ + W − W/G: grouped positions shifted so that at Δ = W the grouped relative
    position ⌊i/G⌋ − ⌊j/G⌋ + W − W/G continues from the neighbour window (LongLM uses the true
    division W/G here)."""
    return torch.floor(i / group_size) + window - window / group_size


def self_extend_far_key(j: torch.Tensor, group_size: int) -> torch.Tensor:
    return torch.floor(j / group_size)


# --- Dual Chunk Attention (An et al. 2024, HKUNLP/ChunkLlama chunkllama_attn_replace.py) ----------

def dual_chunk_len(chunk_size: int, local_window: int) -> int:
    """Keys are placed at j mod c with c = chunk_size − local_window."""
    return chunk_size - local_window


def dual_chunk_key(j: torch.Tensor, chunk_size: int, local_window: int) -> torch.Tensor:
    return torch.remainder(j, dual_chunk_len(chunk_size, local_window))


def dual_chunk_query(i: torch.Tensor, kind: str, chunk_size: int, local_window: int) -> torch.Tensor:
    """Query position for keys in the same chunk (`intra`: i mod c), the previous chunk
    (`successive`: min(i mod c + c, chunk_size)) or any earlier chunk (`inter`: the successive
    position of the chunk's last query, min(2c − 1, chunk_size))."""
    c = dual_chunk_len(chunk_size, local_window)
    if kind == "intra":
        return torch.remainder(i, c)
    if kind == "successive":
        return torch.clamp(torch.remainder(i, c) + c, max=chunk_size)
    if kind == "inter":
        return torch.full_like(i, float(min(2 * c - 1, chunk_size)))
    raise ValueError(f"unknown dual chunk part {kind!r}")


# --- STRING (An et al. 2024, arXiv 2410.18745; HKUNLP/STRING string_for_llama.py) ---------------

def string_far_query(i: torch.Tensor, shifted_offset: int, local_value: int) -> torch.Tensor:
    """The shifted pass moves queries only (`position_ids - diag_size + local_window`); keys stay."""
    return i - shifted_offset + local_value


# --- log-n query scaling (Su 2021 entropy invariance; Qwen `logn_attn`; rerope_patch.py) ---------

def logn_scale(positions: torch.Tensor, trained_length: int) -> torch.Tensor:
    """max(1, log n / log L) with n = position + 1: queries past L sharpen their logits."""
    n = positions.to(torch.float64) + 1.0
    return torch.clamp(torch.log(n) / math.log(trained_length), min=1.0)


# --- DPE (Lu et al. 2025, arXiv 2504.18857; LuLuLuyi/DPE dpe_for_llama.py @46b85de) --------------
# Self-Extend per dimension group: the rotary components (inv_freq index c = 0 .. d/2 − 1, highest
# frequency first) are split into equal groups, `dimension_groups_range` [0, 8, .., 64] of the
# reference (`concat_tensors`, lines 224-232, takes group g's slice of both rotate-half halves);
# beyond the local window each group reads its positions floor-divided by its own scale
# (lines 328-330: query ⌊i/s⌋ + w − w/s, key ⌊j/s⌋). Components left out by the key-dimension
# selection keep their positions (lines 348-354: `torch.where(dim_mask, scale_cos, normal_cos)`).

def dpe_component_scales(group_scales, half: int) -> torch.Tensor:
    """The scale of each of the `half` rotary components: group g covers components
    [g·half/G, (g+1)·half/G), as `dimension_groups_range` splits them evenly."""
    groups = len(group_scales)
    if half % groups:
        raise ValueError(f"dpe: {groups} group_scales cannot split {half} rotary frequencies (rotary "
                         f"dim {2 * half} / 2) into equal groups; give a number of groups that "
                         f"divides {half} (the authors use 8).")
    return torch.tensor([float(s) for s in group_scales],
                        dtype=torch.float64).repeat_interleave(half // groups)


def dpe_far_query(i: torch.Tensor, scales: torch.Tensor, window: int,
                  keep: torch.Tensor | None = None) -> torch.Tensor:
    """Per-component far query positions [n, d/2] (or [H, n, d/2] when `keep`, bool [H, d/2],
    marks each head's scaled components): ⌊i/s⌋ + w − w/s, or i where not scaled."""
    s = scales.to(i.device)
    scaled = torch.floor(i[:, None] / s) + window - window / s
    return scaled if keep is None else torch.where(keep.to(i.device)[:, None, :], scaled, i[:, None])


def dpe_far_key(j: torch.Tensor, scales: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    s = scales.to(j.device)
    scaled = torch.floor(j[:, None] / s)
    return scaled if keep is None else torch.where(keep.to(j.device)[:, None, :], scaled, j[:, None])

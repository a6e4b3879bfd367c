"""Generation with dynamic methods: fix the scale for a whole `generate` call.

Dynamic NTK and dynamic YaRN recompute frequencies from the current length. With a KV cache the
cached keys were rotated with the frequencies of earlier, shorter lengths while each new query
uses the current ones, so cached decoding drifts from a full recompute (REFERENCE.md §2
measured up to 9.6e-3 in logits on a tiny model). `fixed_rope_scale(model, n)` computes the
frequencies once for length n (prompt + max_new_tokens) and holds them, so cache and queries
agree; `generate` wraps `model.generate` in it.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import modeling_rope_utils

from .registry import rotary_modules

# A rope_type without "dynamic" in it: transformers' `dynamic_rope_update` then leaves the
# frequencies alone (it recomputes only when "dynamic" is in the module's rope_type).
_FROZEN = "hf_posext_fixed"


@contextmanager
def fixed_rope_scale(model: torch.nn.Module, seq_len: int):
    """Within the block, dynamic rotary modules use the frequencies of length `seq_len`.

    Static methods are unaffected (their frequencies never change)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    saved = []
    try:
        for _, _, module in rotary_modules(model):
            rope_type = getattr(module, "rope_type", "default")
            if not isinstance(rope_type, str) or "dynamic" not in rope_type:
                continue
            saved.append((module, rope_type, module.inv_freq, module.attention_scaling,
                          module.max_seq_len_cached))
            init_fn = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]
            inv_freq, scale = init_fn(module.config, module.inv_freq.device, seq_len=seq_len)
            module.register_buffer("inv_freq", inv_freq.to(module.inv_freq.device), persistent=False)
            module.attention_scaling = scale
            module.rope_type = _FROZEN
        yield model
    finally:
        for module, rope_type, inv_freq, scale, cached in saved:
            module.register_buffer("inv_freq", inv_freq, persistent=False)
            module.attention_scaling = scale
            module.max_seq_len_cached = cached
            module.rope_type = rope_type


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs):
    """`model.generate` with a dynamic method's scale fixed for prompt + max_new_tokens."""
    total = int(input_ids.shape[-1]) + int(max_new_tokens)
    with fixed_rope_scale(model, total):
        return model.generate(input_ids, max_new_tokens=max_new_tokens, **kwargs)

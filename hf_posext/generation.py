"""Generation with length-dependent ropes: fix the scale for a whole `generate` call.

Dynamic NTK and dynamic YaRN recompute frequencies from the current length. With a KV cache the
cached keys were rotated with the frequencies of earlier, shorter lengths while each new query
uses the current ones, so cached decoding drifts from a full recompute (docs/rope_methods.md:
measured up to 9.6e-3 in logits on a tiny model). `fixed_rope_scale(model, n)` computes the
frequencies once for length n (prompt + max_new_tokens) and holds them, so cache and queries
agree; `generate` wraps `model.generate` in it. transformers' `longrope` is held the same way:
it picks `short_factor` or `long_factor` from each forward's length, so a prompt shorter than L
decoded past L would mix keys rotated with one set and queries with the other.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .rope import dynamic
from .rope.registry import rotary_modules


@contextmanager
def fixed_rope_scale(model: torch.nn.Module, seq_len: int):
    """Within the block, dynamic (and longrope) rotary modules use the frequencies of length
    `seq_len`.

    Static methods are unaffected (their frequencies never change). The held modules' rope type
    is renamed for the block (`dynamic.FROZEN`), so neither transformers' dynamic update nor
    hf_posext's history-free hook recomputes them."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    saved = []
    try:
        for _, _, module in rotary_modules(model):
            for slot in dynamic.slots(module):
                rope_type = dynamic.slot_type(module, slot)
                # longrope switches factor sets with the forward's length (transformers'
                # `longrope_frequency_update`): a prompt <= L cached with short_factor, then
                # decoded past L with long_factor, mixes the two (only Phi-3 drops its cache)
                if not (dynamic.is_dynamic_type(rope_type) or rope_type == "longrope"):
                    continue
                inv_freq, scale = dynamic.get_frequencies(module, slot)
                cached = getattr(module, dynamic._name(slot, "max_seq_len_cached"), None)
                saved.append((module, slot, rope_type, inv_freq, scale, cached))
                new_inv, new_scale = dynamic.frequencies_at(module, slot, seq_len, inv_freq.device)
                dynamic.set_frequencies(module, slot, new_inv.to(inv_freq.device), new_scale)
                dynamic.set_slot_type(module, slot, dynamic.FROZEN)
        yield model
    finally:
        for module, slot, rope_type, inv_freq, scale, cached in saved:
            dynamic.set_frequencies(module, slot, inv_freq, scale)
            if cached is not None:
                setattr(module, dynamic._name(slot, "max_seq_len_cached"), cached)
            dynamic.set_slot_type(module, slot, rope_type)


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs):
    """`model.generate` with a dynamic method's (or longrope's) scale fixed for prompt +
    max_new_tokens."""
    total = int(input_ids.shape[-1]) + int(max_new_tokens)
    with fixed_rope_scale(model, total):
        return model.generate(input_ids, max_new_tokens=max_new_tokens, **kwargs)

"""Attention of a continuation over a cached prefix at the cost of its own share of the work.

A forward of Q new tokens over a cache (K keys in all, the queries the last Q) needs the
lower-right causal mask: query t sees keys 0..K − Q + t. transformers' SDPA path materialises it
as a bool [B, 1, Q, K] (masking_utils.sdpa_mask skips the mask only when Q == K), repeats the
key/value heads because a mask rules out SDPA's GQA (integrations/sdpa_attention.py,
`use_gqa_in_sdpa`), and PyTorch's CPU flash kernel then computes every block of the Q × K
rectangle and adds the mask to it. At 8k with half the prompt cached that attention took 1.2–1.3×
the attention of a full causal forward of all K tokens, for 3/4 of its query–key pairs
(benchmarks/results/prefix_reuse.md).

Here the keys split in two, as kernel.py splits a method's parts: the cached prefix, which every
query sees (no mask; GQA by stacking each key head's query heads along the rows), and the Q new
keys, a square under SDPA's `is_causal` (upper-left aligned, exact on a square). The two merge by
their log-sum-exp (as flash attention merges blocks; for two parts one lerp). The log-sum-exp comes from
the CPU flash kernel (`backends.py`), so the split runs on CPU tensors; anything else (another
device, a mask that is not exactly the lower-right causal one: padding, a sliding window, a
static cache's unfilled slots) goes to transformers' own SDPA function unchanged.

Opt-in for a block: `continuation_attention(model)` names this implementation in the model's
config where it was "sdpa" (the name transformers' attention modules read on every forward, as
interface.py's), and restores "sdpa" after. The mask function registered beside it is
transformers' SDPA mask, whose result is remembered (by identity) when it is the lower-right
causal mask, so the attention function need not test it again in each layer.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

NAME = "hf_posext_continuation"
_LOWER_RIGHT: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> mask seen lower-right
# keyword arguments some models pass that change the scores: those calls keep transformers' SDPA
_SCORE_KWARGS = ("softcap", "position_bias", "s_aux", "sinks")


def _flash():
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _is_lower_right(mask) -> bool:
    """True when `mask` is exactly query t (of Q) on keys 0..K − Q + t, with 1 < Q < K."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4:
        return False
    Q, K = mask.shape[-2:]
    if not 1 < Q < K:
        return False
    want = torch.ones(Q, K, dtype=torch.bool, device=mask.device).tril(K - Q)
    return bool(torch.equal(mask, want.expand(mask.shape)))


def continuation_mask(**kwargs):
    """transformers' SDPA mask, remembered when it is the lower-right causal one."""
    mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](**kwargs)
    if _is_lower_right(mask):
        _LOWER_RIGHT[id(mask)] = mask
    return mask


def split_attention(query, key, value, scaling: float) -> torch.Tensor:
    """Lower-right causal attention of query [B, H, Q, D] over key/value [B, H_kv, K, D]
    (K > Q) on CPU: the K − Q prefix keys unmasked plus the last Q under `is_causal`, merged by
    log-sum-exp. Returns [B, Q, H, D] (contiguous: the layout the model reads back)."""
    flash = _flash()
    B, H, Q, D = query.shape
    n_kv, P = key.shape[1], key.shape[2] - Q
    n_rep = H // n_kv
    # head h = kv * n_rep + r (transformers' repeat_kv order): [B, H_kv, n_rep·Q, D] rows
    o1, l1 = flash(query.reshape(B, n_kv, n_rep * Q, D), key[:, :, :P], value[:, :, :P], scale=scaling)
    k2, v2 = key[:, :, P:], value[:, :, P:]
    if n_rep > 1:
        k2, v2 = k2.repeat_interleave(n_rep, dim=1), v2.repeat_interleave(n_rep, dim=1)
    o2, l2 = flash(query, k2, v2, is_causal=True, scale=scaling)
    # Two parts, each row seeing at least one key of each (every key of the prefix; itself): the
    # merge Σ o_p·exp(lse_p)/Σ exp(lse_p) (kernel._merge) is o2 + σ(lse1 − lse2)·(o1 − o2), one
    # fused lerp written straight into the [B, Q, H, D] output, in [B, H_kv, n_rep, Q, D] views
    # (a general merge's stack/exp/sum passes cost a fifth of the attention itself here).
    grouped = (B, n_kv, n_rep, Q)
    w = torch.sigmoid(l1.float().reshape(grouped) - l2.float().reshape(grouped)).to(o1.dtype)
    out = query.new_empty(B, Q, H, D)
    torch.lerp(o2.reshape(*grouped, D), o1.reshape(*grouped, D), w[..., None],
               out=out.view(B, Q, n_kv, n_rep, D).permute(0, 2, 3, 1, 4))
    return out


def continuation_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                   scaling: float | None = None, **kwargs):
    """transformers' attention-function contract: returns ([B, Q, H, D], None)."""
    lower_right = attention_mask is not None and _LOWER_RIGHT.get(id(attention_mask)) is attention_mask
    if (not lower_right or dropout or query.device.type != "cpu" or _flash() is None
            or any(kwargs.get(k) is not None for k in _SCORE_KWARGS)
            or key.shape[2] != attention_mask.shape[-1] or query.shape[2] != attention_mask.shape[-2]):
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask,
                                               dropout=dropout, scaling=scaling, **kwargs)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    return split_attention(query, key, value, scaling), None


def register() -> None:
    """Add the name to transformers' attention and mask interfaces (idempotent; the registry
    is read as interface.register reads it)."""
    current = AttentionInterface().get(NAME)
    if current is not None and current is not continuation_attention_forward:
        raise RuntimeError(f"attn_implementation {NAME!r} is already registered by someone else.")
    AttentionInterface.register(NAME, continuation_attention_forward)
    AttentionMaskInterface.register(NAME, continuation_mask)


@contextmanager
def continuation_attention(model):
    """Within the block, a model running transformers' "sdpa" attends by `split_attention`
    wherever a forward continues a cache; any other implementation is left as it is."""
    config = model.config
    swap = getattr(config, "_attn_implementation", None) == "sdpa"
    if swap:
        register()
        config._attn_implementation = NAME
    try:
        yield model
    finally:
        if swap:
            config._attn_implementation = "sdpa"

"""The attention function hf_posext registers with transformers' public `AttentionInterface`.

A model opts in through its own config: `config._attn_implementation = "hf_posext"` (the name
transformers' attention modules look up on every forward) and `config.hf_posext_attention`
(the method's knobs, a dict). Other models in the process keep their own implementation, so
registering the name changes nothing for them. The mask function registered under the same name
is transformers' own SDPA mask (None when there is no padding, else a bool [B, 1, Q, K]).

Queries and keys arrive rotated by the model's plain RoPE at their positions; the kernel
re-rotates them by the difference to the method's positions (exact, R(a)·R(b) = R(a+b)).
Positions: keys 0..K−1 in the cache, queries K−Q..K−1 (a dynamic cache; the usual case).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..compat import get_rope_parameters, rotary_dim
from ..methods import default_inv_freq
from .config import AttentionExtensionConfig
from .kernel import attend
from .plans import plan_for
from .positions import logn_scale

IMPLEMENTATION = "hf_posext"   # the attn_implementation name
CONFIG_KEY = "hf_posext_attention"  # the config attribute (and config.json block) with the knobs


@lru_cache(maxsize=64)
def _spec(items: tuple) -> AttentionExtensionConfig:
    return AttentionExtensionConfig.from_dict(dict(items))


def spec_of(config) -> AttentionExtensionConfig:
    block = getattr(config, CONFIG_KEY, None)
    if not isinstance(block, dict):
        raise ValueError(f"attn_implementation {IMPLEMENTATION!r} needs the config block "
                         f"{CONFIG_KEY!r} (the method and its knobs); set it with hf_posext.patch.")
    return _spec(tuple(sorted(block.items())))


def _keep_mask(attention_mask, Q: int, K: int):
    """transformers' mask as bool (True = attend), or None."""
    if attention_mask is None:
        return None
    m = attention_mask[..., -Q:, :K] if attention_mask.dim() == 4 else attention_mask
    if m.dtype == torch.bool:
        return m
    return m > torch.finfo(m.dtype).min / 2


def hf_posext_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                        scaling: float | None = None, **kwargs):
    """transformers' attention-function contract: returns ([B, Q, H, D], None)."""
    config = module.config
    spec = spec_of(config)
    if dropout:
        raise NotImplementedError("hf_posext's attention methods are training-free; attention "
                                  "dropout is not supported. Call model.eval().")
    Q, K = query.shape[2], key.shape[2]
    offset = K - Q
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if spec.logn:
        pos = torch.arange(offset, K, device=query.device)
        query = query * logn_scale(pos, spec.trained_length).to(query.dtype)[None, None, :, None]
    if not spec.changes_positions:  # log-n alone: the model's own SDPA on the scaled queries
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask,
                                               dropout=dropout, scaling=scaling, **kwargs)
    rope = get_rope_parameters(config)
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{spec.method!r} re-rotates plain RoPE, but this model's rope_type is "
                         f"{rope['rope_type']!r}. Patch with hf_posext.patch, which sets plain RoPE.")
    inv_freq = default_inv_freq(rotary_dim(config), float(rope["rope_theta"]), query.device)
    out = attend(query, key, value, _keep_mask(attention_mask, Q, K), scaling, plan_for(spec),
                 inv_freq, offset)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Add the name to transformers' attention and mask interfaces (idempotent)."""
    current = ALL_ATTENTION_FUNCTIONS._global_mapping.get(IMPLEMENTATION)
    if current is not None and current is not hf_posext_attention:
        raise RuntimeError(f"attn_implementation {IMPLEMENTATION!r} is already registered by "
                           "someone else; hf_posext will not replace it.")
    AttentionInterface.register(IMPLEMENTATION, hf_posext_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])

"""The attention function hf_posext registers with transformers' public `AttentionInterface`.

A model opts in through its own config: `config._attn_implementation = "hf_posext"` (the name
transformers' attention modules look up on every forward) and `config.hf_posext_attention`
(the method's knobs, a dict). Other models in the process keep their own implementation, so
registering the name changes nothing for them. The mask function registered under the same name
is transformers' own SDPA mask (None when there is no padding, else a bool [B, 1, Q, K]).

Queries and keys arrive rotated by the model's plain RoPE at their positions; the kernel
re-rotates them by the difference to the method's positions (exact, R(a)·R(b) = R(a+b)).
Positions: keys 0..K−1 in the cache, queries K−Q..K−1 (a dynamic cache; the usual case). A
static cache hands over all of its max_cache_len slots, the unfilled tail masked (or, at a 5.x
prefill of an empty cache without padding, no mask: SDPA's upper-left `is_causal`), so the keys
no query can see are dropped first (`_seen_keys`). A
left-padded row that the model positions from its first real token (`position_ids` =
cumsum(mask) − 1, as `generate` does) has real positions index − p (p = its padding): the
methods whose maps depend on absolute positions (Self-Extend's ⌊i/G⌋, Dual Chunk's chunks,
log-n) then run row by row on the row's real tokens. ReRoPE's maps depend on i − j only, so
padding never changes them.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..rope.compat import get_rope_parameters, rotary_dim
from ..rope.methods import default_inv_freq
from .config import AttentionExtensionConfig
from .kernel import attend
from .units import UNITS, plan_for
from .positions import logn_scale

IMPLEMENTATION = "hf_posext"   # the attn_implementation name
CONFIG_KEY = "hf_posext_attention"  # the config attribute (and config.json entry) with the knobs


@lru_cache(maxsize=64)
def _spec(items: tuple) -> AttentionExtensionConfig:
    return AttentionExtensionConfig.from_dict(dict(items))


def _frozen(value):
    """A knob value as a hashable key (DPE's list knobs: group_scales, key_dims)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def spec_of(config) -> AttentionExtensionConfig:
    entry = getattr(config, CONFIG_KEY, None)
    if not isinstance(entry, dict):
        raise ValueError(f"attn_implementation {IMPLEMENTATION!r} needs the config entry "
                         f"{CONFIG_KEY!r} (the method and its knobs); set it with hf_posext.patch.")
    return _spec(tuple(sorted((k, _frozen(v)) for k, v in entry.items())))


def _keep_mask(attention_mask, Q: int, K: int):
    """transformers' mask as bool (True = attend), or None."""
    if attention_mask is None:
        return None
    m = attention_mask[..., -Q:, :K] if attention_mask.dim() == 4 else attention_mask
    if m.dtype == torch.bool:
        return m
    return m > torch.finfo(m.dtype).min / 2


def _seen_keys(keep, Q: int, K: int) -> int:
    """How many leading key slots hold the cache up to the last query: K, except under a static
    cache, whose unfilled tail would otherwise be taken for the keys just before the queries
    (and re-rotated as if it were). Without a mask and 1 < Q < K: transformers' SDPA runs
    `is_causal` upper-left, query t on key t, "only during prefill with an empty StaticCache"
    (integrations/sdpa_attention.py, which slices the keys to Q the same way)."""
    if keep is None:
        return Q if 1 < Q < K else K
    if bool(keep[..., -1, -1].any()):
        return K        # the last query sees the last slot: nothing after it (the usual case)
    # Trailing columns no query sees are either a static cache's unfilled slots or right
    # padding (slots that are queries themselves). Query t sits at slot e − (Q − 1 − t), where e
    # is the last query's slot; it sees at most its own slot, and exactly it when it is a real
    # token. So e = max over rows and queries of (last slot seen + Q − 1 − t).
    e, slots = -1, torch.arange(K, device=keep.device)
    for a in range(0, Q, 256):          # [B, 1, C, K] at a time: the full mask may be large
        blk = keep[..., a:a + 256, :]
        last = torch.where(blk, slots, -1).amax(-1)                     # [B, 1, C]
        t = torch.arange(a, a + blk.shape[-2], device=keep.device)
        reach = torch.where(last >= 0, last + (Q - 1 - t), -1)
        e = max(e, int(reach.max()))
    return e + 1 if e >= 0 else K


def _row_padding(spec, position_ids, keep, offset: int, B: int, Q: int) -> list[int] | None:
    """Per-row shift p = index − real position of the queries (None when every row starts at
    0, or when the method only sees i − j), checked against the padding mask."""
    absolute = spec.logn or UNITS[spec.method].absolute
    if not absolute or position_ids is None or position_ids.shape[-1] != Q:
        return None
    # from the last query: always a real token under left padding (the first may be padding,
    # whose position_ids are clamped to 0)
    shift = (offset + Q - 1 - position_ids[..., -1]).expand(B).tolist()
    if not any(shift):
        return None
    for b, p in enumerate(shift):
        real = max(0, p - offset)   # the row's first real query (earlier ones are padding)
        if p < 0 or (p and (keep is None or bool(keep[b, :, real:, :p].any()))):
            raise ValueError(
                f"{spec.method}: position_ids of row {b} put key index {offset + Q - 1} at position "
                f"{offset + Q - 1 - p}, but only left padding (masked keys before the row's first "
                "real token, position_ids = cumsum(attention_mask) − 1) can shift positions. Pass "
                "position_ids that count from the first real token (`generate` infers a mask from "
                "pad_token_id when none is given: pass attention_mask if the pad token also occurs "
                "inside a prompt).")
    return shift


def hf_posext_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                        scaling: float | None = None, **kwargs):
    """transformers' attention-function contract: returns ([B, Q, H, D], None)."""
    spec = spec_of(module.config)
    if dropout:
        raise NotImplementedError("hf_posext's attention methods are training-free; attention "
                                  "dropout is not supported. Call model.eval().")
    B, Q, K = query.shape[0], query.shape[2], key.shape[2]
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    keep = _keep_mask(attention_mask, Q, K)
    seen = _seen_keys(keep, Q, K)
    if seen < K:       # a static cache's unfilled tail: [B, H, K, D] -> [B, H, seen, D]
        key, value, K = key[:, :, :seen], value[:, :, :seen], seen
        keep = None if keep is None else keep[..., :seen]
        attention_mask = None if attention_mask is None else attention_mask[..., :seen]
    offset = K - Q
    shifts = _row_padding(spec, kwargs.get("position_ids"), keep, offset, B, Q)
    if shifts is None:
        return _attention(module, spec, query, key, value, attention_mask, keep, scaling, offset,
                          kwargs), None
    out = query.new_zeros(B, Q, query.shape[1], query.shape[3])
    for b, p in enumerate(shifts):          # each row on its real tokens, at real positions
        s = max(0, p - offset)              # its queries that are padding: output left at 0
        if s < Q:
            row_keep = keep[b:b + 1, :, s:, p:]
            out[b:b + 1, s:] = _attention(module, spec, query[b:b + 1, :, s:], key[b:b + 1, :, p:],
                                          value[b:b + 1, :, p:], row_keep, row_keep, scaling,
                                          offset + s - p, kwargs)
    return out, None


def _attention(module, spec, query, key, value, attention_mask, keep, scaling, offset, kwargs):
    """[B, Q, H, D] for queries at positions offset..K−1 over keys at 0..K−1."""
    config = module.config
    if spec.logn:
        pos = torch.arange(offset, offset + query.shape[2], device=query.device)
        query = query * logn_scale(pos, spec.trained_length).to(query.dtype)[None, None, :, None]
    if not spec.changes_positions:  # log-n alone: the model's own SDPA on the scaled queries
        kwargs = {k: v for k, v in kwargs.items() if k != "position_ids"}
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask,
                                               scaling=scaling, **kwargs)[0]
    rope = get_rope_parameters(config)
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{spec.method!r} re-rotates plain RoPE, but this model's rope_type is "
                         f"{rope['rope_type']!r}. Patch with hf_posext.patch, which sets plain RoPE.")
    inv_freq = default_inv_freq(rotary_dim(config), float(rope["rope_theta"]), query.device)
    plan = plan_for(spec, getattr(module, "layer_idx", None), inv_freq.numel())
    out = attend(query, key, value, keep, scaling, plan, inv_freq, offset)
    return out.transpose(1, 2).contiguous()


def register() -> None:
    """Add the name to transformers' attention and mask interfaces (idempotent).

    Who holds the name is read through the public Mapping API of a fresh `AttentionInterface()`:
    its local mapping is empty, so it shows exactly the class-wide registry that the classmethod
    `register` writes (transformers' `GeneralInterface`, 4.57 and 5.23: "a call to `register`
    can be reflected into all other files correctly, even if a new instance is created")."""
    current = AttentionInterface().get(IMPLEMENTATION)
    if current is not None and current is not hf_posext_attention:
        raise RuntimeError(f"attn_implementation {IMPLEMENTATION!r} is already registered by "
                           "someone else; hf_posext will not replace it.")
    AttentionInterface.register(IMPLEMENTATION, hf_posext_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])

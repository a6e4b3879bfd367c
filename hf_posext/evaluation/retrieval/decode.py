"""Greedy answers for a cell's trials, prefilling their shared prefix once.

The prefix (head + haystack before the depth) is run once with a cache; each trial continues
from a deep copy of that cache (transformers' documented prefix-cache reuse: pass the copy as
`past_key_values` to `generate` with the whole prompt; generate feeds only the uncached tokens).
A dynamic method's frequencies depend on the forward's length: they are held at the cell's
`hold_length` for the prefix and every trial (`generation.fixed_rope_scale`), so the cached keys
and the trial's queries are rotated alike. tests/test_retrieval_decode.py checks that a cached
trial's logits equal a full recompute under the same hold.
"""

from __future__ import annotations

import copy

import torch
from transformers.generation import utils as _generation_utils

from ...generation import fixed_rope_scale
from .prompt import CellPrompts


# transformers 5.x renamed generate's `past_key_values` to `cache` (deprecated alias until 5.40,
# generation/utils.py ALL_CACHE_NAMES); 4.x knows only the old name.
CACHE_KWARG = "cache" if "cache" in getattr(_generation_utils, "ALL_CACHE_NAMES", ()) else "past_key_values"


def _device(model):
    return next(model.parameters()).device


def _pad(tokenizer) -> int | None:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.inference_mode()
def prefill(model, prefix: list[int]):
    """The cache of `prefix` (logits of its last position only: a 16k × vocab logit matrix
    would take gigabytes)."""
    ids = torch.tensor([prefix], device=_device(model))
    out = model(ids, use_cache=True, logits_to_keep=1)
    return out[CACHE_KWARG] if CACHE_KWARG in out else out.past_key_values


@torch.inference_mode()
def generate_trial(model, tokenizer, ids: list[int], max_new_tokens: int, cache=None,
                   scores: bool = False):
    """Greedy continuation of `ids` (new token ids; with `scores`, also the logits of each
    step), continuing from `cache` when given (a cache of a prefix of `ids`, left untouched)."""
    x = torch.tensor([ids], device=_device(model))
    extra = {CACHE_KWARG: copy.deepcopy(cache)} if cache is not None else {}
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=_pad(tokenizer), return_dict_in_generate=True,
                         output_logits=scores, **extra)
    seq = out.sequences if hasattr(out, "sequences") else out   # a generate override may return ids
    new = seq[0, x.shape[1]:].tolist()
    return (new, [l[0] for l in out.logits]) if scores else new


def answer_cell(model, tokenizer, cell: CellPrompts, reuse_prefix: bool = True) -> list[str]:
    """The decoded answer of every trial of the cell."""
    texts = []
    with fixed_rope_scale(model, cell.hold_length):
        cache = prefill(model, cell.prefix) if reuse_prefix and len(cell.prefix) > 1 else None
        for i, m in enumerate(cell.max_new_tokens):
            new = generate_trial(model, tokenizer, cell.prompt(i), m, cache)
            texts.append(tokenizer.decode(new, skip_special_tokens=True))
    return texts

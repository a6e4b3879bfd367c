"""Greedy answers for a cell's trials, prefilling their shared prefix once.

The prefix (head + haystack before the depth) is run once with a cache; each trial continues
from a deep copy of that cache (transformers' documented prefix-cache reuse: pass the copy as
`past_key_values` to `generate` with the whole prompt; generate feeds only the uncached tokens).
A trial continues from a *fork* of that cache, not a deep copy: transformers' DynamicLayer.update
grows a layer by `torch.cat` into new tensors (cache_utils.py, DynamicLayer.update) and never
writes into the ones it holds, so new layer objects over the prefix's own tensors leave the prefix
untouched; any other cache or layer type is deep-copied (a deep copy of a 4k-token prefix moved
~190 MB per trial at 8k). Not cropped back: DynamicCache.crop's argument changed meaning in 5.x.
The fork's layers reserve the trial's whole length (`reserved.ReservedLayer`): the suffix forward
copies the prefix into a buffer once, and each decode step writes its token in place instead of
DynamicLayer's cat copying the whole cache per layer per step.
Every forward that continues a cache attends by `attention.continuation` (the cached keys
unmasked, the new ones causal, merged by log-sum-exp), not by SDPA over a materialised mask.

A greedy decode step (one new token) runs on one thread (`one_thread_steps`): its ops are tiny
and memory-bound, so a second thread gains little, and where the cores are shared (here: a
fine-tuning run beside the suite) every op waits for a preempted second thread at its barrier:
at 2,048 tokens a step took 2.3 s on 2 threads against 0.09 s on 1, the matrix products 35x
slower each (torch.profiler; benchmarks/results/prefix_reuse.md). Prefills keep every thread.

Across the depths of one (task, method, length): a deeper cell's prefix extends a shallower
one's token for token (prompt.py: the head, then whole haystack pieces, the same pieces at every
depth), so `SharedPrefix` keeps the last prefix's cache and a deeper cell only prefills the
pieces between the two needles on top of it. It checks the tokens, not the depths, and holds
one cache per model state (the caller's key: method, factor, knobs) and rope hold length.
Across the looks of a sequential question (the same prompts at every look, `prompt.py`'s
`layout_seeds`), it keeps the deepest prefix and serves every depth from a view of its first
tokens: a later look prefills nothing.
A dynamic method's frequencies depend on the forward's length: they are held at the cell's
`hold_length` for the prefix and every trial (`generation.fixed_rope_scale`), so the cached keys
and the trial's queries are rotated alike. tests/test_retrieval_decode.py checks that a cached
trial's logits equal a full recompute under the same hold.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager
from typing import cast

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.generation import utils as _generation_utils

from ...attention.continuation import continuation_attention
from ...generation import fixed_rope_scale
from .prompt import CellPrompts
from .reserved import reserved_fork


# transformers 5.x renamed generate's `past_key_values` to `cache` (deprecated alias until 5.40,
# generation/utils.py ALL_CACHE_NAMES); 4.x knows only the old name.
CACHE_KWARG = "cache" if "cache" in getattr(_generation_utils, "ALL_CACHE_NAMES", ()) else "past_key_values"


def _device(model):
    return next(model.parameters()).device


def _pad(tokenizer) -> int | None:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.inference_mode()
def prefill(model, prefix: list[int], cache=None):
    """The cache of `prefix` (logits of its last position only: a 16k × vocab logit matrix
    would take gigabytes); with `cache` (of a prefix of `prefix`, extended in place) only the
    tokens after it run."""
    done = 0 if cache is None else cache.get_seq_length()
    ids = torch.tensor([prefix[done:]], device=_device(model))
    extra = {} if cache is None else {CACHE_KWARG: cache}
    out = model(ids, use_cache=True, logits_to_keep=1, **extra)
    return out[CACHE_KWARG] if CACHE_KWARG in out else out.past_key_values


class SharedPrefix:
    """Prefix caches kept for later cells (module doc), one per model state (the caller's key
    and the rope hold): the longest prefix prefilled under it. A cell whose prefix extends it
    prefills only the tokens after it; one whose prefix it extends gets a view of its first
    tokens (`head_view`, no forward: a later look of a sequential question, whose depths the
    held deepest prefix covers). Up to `max_bytes` of caches are kept, the least recently used
    dropped first; 0 keeps the last one only, dropped before another state's prefill (the fixed
    design's cells come one model state at a time). `prefilled`: the prefix tokens run so far."""

    def __init__(self, max_bytes: int = 0):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes, self.prefilled = max_bytes, 0
        self.held: dict = {}   # key -> (tokens, cache), the most recently used last

    def cache_of(self, model, prefix: list[int], key) -> object:
        """The cache of `prefix` under `key` (held, a view of a held one, or extended)."""
        tokens, cache = self.held.pop(key, ([], None))
        n = len(tokens)
        if cache is not None and n >= len(prefix) and tokens[:len(prefix)] == prefix:
            view = cache if n == len(prefix) else head_view(cache, len(prefix))
            if view is not None:
                self.held[key] = (tokens, cache)
                return view
        if cache is None or n > len(prefix) or prefix[:n] != tokens:
            tokens, cache = [], None   # freed before the new prefill
        if self.max_bytes == 0:
            self.held.clear()
        self.prefilled += len(prefix) - len(tokens)
        cache = prefill(model, prefix, cache)
        self.held[key] = (list(prefix), cache)
        while len(self.held) > 1 and sum(cache_bytes(c) for _, c in self.held.values()) > self.max_bytes:
            self.held.pop(next(iter(self.held)))   # the least recently used
        return cache


def cache_bytes(cache) -> int:
    """The bytes of a cache's keys and values."""
    return sum(t.numel() * t.element_size() for layer in getattr(cache, "layers", ())
               for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if torch.is_tensor(t))


def head_view(cache, n: int):
    """A cache of the first `n` tokens of `cache`, over views of its tensors (nothing copied,
    `cache` untouched), or None for a cache that is not a plain DynamicCache of DynamicLayers (a
    sliding window's or a quantized layer's first tokens are not a slice of what it holds)."""
    if type(cache) is not DynamicCache or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    out = copy.copy(cache)
    out.layers = [_first_tokens(cast(DynamicLayer, layer), n) for layer in cache.layers]
    return out


def _first_tokens(layer: DynamicLayer, n: int) -> DynamicLayer:
    out = copy.copy(layer)
    if out.is_initialized and out.keys is not None and out.keys.numel():
        out.keys, out.values = out.keys[..., :n, :], out.values[..., :n, :]
    return out


@contextmanager
def one_thread_steps(model):
    """Within the block, a forward of one new token runs on one thread, any longer one on the
    threads there were (CPU only); the thread count is restored on exit."""
    wide = torch.get_num_threads()
    if wide == 1 or _device(model).type != "cpu":
        yield
        return

    def narrow(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        torch.set_num_threads(1 if ids is not None and ids.shape[-1] == 1 else wide)

    handle = model.register_forward_pre_hook(narrow, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
        torch.set_num_threads(wide)


def fork(cache):
    """A cache a trial may grow without touching `cache` (module doc): new DynamicLayer objects
    over the same tensors, or a deep copy of any other kind."""
    if type(cache) is not DynamicCache or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return copy.deepcopy(cache)
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    return out


def trial_cache(cache, capacity: int):
    """What a trial continues from: a fork of `cache` whose layers reserve `capacity` tokens
    (`reserved.reserved_fork`), or, with `capacity` 0 or a cache of another kind, `fork(cache)`."""
    return (reserved_fork(cache, capacity) if capacity > 0 else None) or fork(cache)


@torch.inference_mode()
def generate_trial(model, tokenizer, ids: list[int], max_new_tokens: int, cache=None,
                   scores: bool = False, capacity: int | None = None):
    """Greedy continuation of `ids` (new token ids; with `scores`, also the logits of each
    step), continuing from `cache` when given (a cache of a prefix of `ids`, left untouched).
    `capacity`: the tokens the trial's cache layers reserve (None: the prompt and the answer,
    all the trial holds, as generate feeds back every new token but the last; 0: none, the
    layers grow by DynamicLayer's cat; fewer than the trial needs: they grow past it)."""
    x = torch.tensor([ids], device=_device(model))
    if capacity is None:
        capacity = len(ids) + max_new_tokens - 1
    extra = {CACHE_KWARG: trial_cache(cache, capacity)} if cache is not None else {}
    with one_thread_steps(model):
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=_pad(tokenizer), return_dict_in_generate=True,
                             output_logits=scores, **extra)
    seq = out.sequences if hasattr(out, "sequences") else out   # a generate override may return ids
    new = seq[0, x.shape[1]:].tolist()
    return (new, [l[0] for l in out.logits]) if scores else new


def takes_shared(fn) -> bool:
    """Whether an `answer_fn` accepts answer_cell's `shared` keyword (a user's may not)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "shared" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def answer_cell(model, tokenizer, cell: CellPrompts, reuse_prefix: bool = True,
                shared: tuple[SharedPrefix, object] | None = None) -> list[str]:
    """The decoded answer of every trial of the cell; `shared` = (holder, model-state key):
    the prefix's cache from (and left in) the holder, extended from a shallower cell's."""
    texts = []
    with fixed_rope_scale(model, cell.hold_length), continuation_attention(model):
        cache = None
        if reuse_prefix and len(cell.prefix) > 1:
            cache = (shared[0].cache_of(model, cell.prefix, (shared[1], cell.hold_length))
                     if shared is not None else prefill(model, cell.prefix))
        for i, m in enumerate(cell.max_new_tokens):
            new = generate_trial(model, tokenizer, cell.prompt(i), m, cache)
            texts.append(tokenizer.decode(new, skip_special_tokens=True))
    return texts

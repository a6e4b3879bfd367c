"""A trial's cache with reserved capacity: each decode step writes its token in place.

transformers' DynamicLayer.update grows a layer by `torch.cat([self.keys, key_states], dim=-2)`
into new tensors (cache_utils.py, DynamicLayer.update, 4.57 and 5.x alike), so every greedy step
of a trial copies the whole layer once: at 8k on the embedded SmolLM2-135M (30 layers, 3 key/value
heads of 64, float32) ~0.38 GB read and written per step, beside the weights' 0.54 GB
(benchmarks/results/prefix_reuse.md). A trial knows how many tokens it will hold (its prompt plus
its answer's max_new_tokens), so `ReservedLayer` allocates that once, at its first update (the
suffix forward, which copies the prefix in once, as the cat did), and every later update writes
its tokens into the free slots and returns views of the filled part.

It is a DynamicLayer subclass over the prefix layer's tensors, put into a fork of the cache (new
layer objects, as `decode.fork`): the prefix's own layers and tensors are never written, so the
trials of one depth and `decode.SharedPrefix`'s cross-depth extension keep reading them. More
tokens than reserved stay correct: the layer grows, one copy per update, as DynamicLayer does.
Every method runs on it: the attention-level ones (attention/interface.py) read the keys and
values the layer returns and keep no cache state of their own. Caches of any other layer type
(sliding windows, quantized, static) are forked as before (`decode.fork`).
"""

from __future__ import annotations

import copy

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class ReservedLayer(DynamicLayer):
    """A DynamicLayer holding `source`'s tensors that, at its first update, moves them into
    buffers of `capacity` tokens and from then on writes each update in place."""

    def __init__(self, source: DynamicLayer, capacity: int):
        super().__init__()
        self.__dict__.update(source.__dict__)   # the same tensors and state, as copy.copy
        self.capacity = capacity
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def _filled_in_buffers(self, need: int) -> bool:
        """Whether keys/values are the leading slots of the buffers and `need` tokens fit there.
        Not so before the first update, and after a method that replaced the tensors
        (batch_repeat_interleave, reorder_cache); crop keeps a view, so it stays true."""
        if self.buffers is None:
            return False
        return all(t.data_ptr() == b.data_ptr() and t.stride() == b.stride() and need <= b.shape[-2]
                   for t, b in zip((self.keys, self.values), self.buffers))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """DynamicLayer's contract (4.57's `cache_kwargs`, 5.x's `*args, **kwargs`, both unused
        by it): append, return all keys and values held."""
        if not self.is_initialized or self.keys is None or self.keys.numel() == 0:
            return super().update(key_states, value_states, *args, **kwargs)   # nothing to keep
        n, need = self.keys.shape[-2], self.keys.shape[-2] + key_states.shape[-2]
        if not self._filled_in_buffers(need):
            # the one copy of what is held; past the reserve, exactly the size needed (growing)
            size = max(self.capacity, need)
            keys, values = (t.new_empty(*t.shape[:-2], size, t.shape[-1]) for t in (self.keys, self.values))
            keys[..., :n, :].copy_(self.keys)
            values[..., :n, :].copy_(self.values)
            self.buffers = keys, values
        keys, values = self.buffers
        keys[..., n:need, :].copy_(key_states)
        values[..., n:need, :].copy_(value_states)
        self.keys, self.values = keys[..., :need, :], values[..., :need, :]
        return self.keys, self.values


def reserved_fork(cache, capacity: int):
    """A fork of `cache` (left untouched) whose layers hold `capacity` tokens once grown, or
    None when `cache` is not a plain DynamicCache of DynamicLayers (the caller forks it as
    before)."""
    plain = [layer for layer in getattr(cache, "layers", ()) if type(layer) is DynamicLayer]
    if type(cache) is not DynamicCache or len(plain) != len(cache.layers):
        return None
    out = copy.copy(cache)
    out.layers = [ReservedLayer(layer, capacity) for layer in plain]
    return out

"""attention/continuation.py: a forward continuing a cache attends by the split (cached keys
unmasked + the new ones causal, merged by log-sum-exp), which must equal PyTorch's SDPA under the
materialised lower-right causal mask; masks of any other shape keep transformers' SDPA."""

import copy

import pytest
import torch
import torch.nn.functional as F

import hf_posext
from _evalkit import tiny_model
from hf_posext.attention import continuation
from hf_posext.attention.continuation import NAME, continuation_attention, split_attention
from hf_posext.evaluation.retrieval.decode import CACHE_KWARG, prefill

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("heads,kv_heads,Q,K", [(4, 2, 37, 100), (3, 3, 5, 6), (6, 2, 64, 65), (2, 1, 80, 300)])
def test_split_equals_sdpa_under_the_lower_right_causal_mask(heads, kv_heads, Q, K):
    g = torch.Generator().manual_seed(Q + K)
    q = torch.randn(2, heads, Q, 16, generator=g)
    k, v = (torch.randn(2, kv_heads, K, 16, generator=g) for _ in range(2))
    # the reference: SDPA with query t (position K - Q + t) on keys 0..K - Q + t, materialised
    i = torch.arange(K - Q, K)[:, None]
    j = torch.arange(K)[None, :]
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(heads // kv_heads, 1),
                                          v.repeat_interleave(heads // kv_heads, 1), attn_mask=j <= i)
    torch.testing.assert_close(split_attention(q, k, v, 16 ** -0.5), want.transpose(1, 2), atol=1e-6, rtol=1e-5)


def test_only_the_exact_lower_right_mask_is_taken_for_one():
    full = torch.ones(5, 9, dtype=torch.bool).tril(4)[None, None]
    assert continuation._is_lower_right(full)
    holed = full.clone()
    holed[0, 0, 3, 0] = False                      # padding, a window: not the plain causal mask
    assert not continuation._is_lower_right(holed)
    assert not continuation._is_lower_right(torch.ones(1, 1, 5, 5, dtype=torch.bool).tril())  # Q == K
    assert not continuation._is_lower_right(None)


def _spy(monkeypatch):
    calls = []
    real = continuation.split_attention
    monkeypatch.setattr(continuation, "split_attention", lambda *a: calls.append(a[0].shape) or real(*a))
    return calls


@pytest.mark.parametrize("method", ["none", "yarn"])
def test_a_cached_continuation_gives_the_full_forwards_logits(method, monkeypatch):
    model = tiny_model()
    if method != "none":
        hf_posext.patch(model, method, 4.0)
    ids = torch.randint(3, 120, (1, 230), generator=torch.Generator().manual_seed(1))
    calls = _spy(monkeypatch)
    with torch.inference_mode():
        want = model(ids).logits[0, 150:]                      # transformers' SDPA, no cache
        cache = prefill(model, ids[0, :150].tolist())
        with continuation_attention(model):
            assert model.config._attn_implementation == NAME
            got = model(ids[:, 150:], **{CACHE_KWARG: copy.deepcopy(cache)}, use_cache=True).logits[0]
    assert model.config._attn_implementation == "sdpa"          # restored
    assert len(calls) == model.config.num_hidden_layers          # every layer took the split
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_padding_keeps_transformers_sdpa(monkeypatch):
    model = tiny_model()
    ids = torch.randint(3, 120, (1, 60), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0                                   # left padding: not the plain causal mask
    calls = _spy(monkeypatch)
    with torch.inference_mode():
        want = model(ids, attention_mask=mask).logits[0, 40:]
        out = model(ids[:, :40], attention_mask=mask[:, :40], use_cache=True)
        cache = out[CACHE_KWARG] if CACHE_KWARG in out else out.past_key_values
        with continuation_attention(model):
            got = model(ids[:, 40:], attention_mask=mask, **{CACHE_KWARG: cache}, use_cache=True).logits[0]
    assert not calls
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_an_attention_method_keeps_its_own_implementation():
    model = tiny_model()
    hf_posext.patch(model, "dual_chunk", 4.0)
    before = model.config._attn_implementation
    with continuation_attention(model):
        assert model.config._attn_implementation == before != NAME


def test_split_in_bfloat16_stays_within_bfloat16s_rounding():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 40, 16, generator=g)
    k, v = (torch.randn(1, 2, 90, 16, generator=g) for _ in range(2))
    mask = torch.arange(90)[None, :] <= torch.arange(50, 90)[:, None]
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask)
    got = split_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.25)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.transpose(1, 2), atol=3e-2, rtol=2e-2)

"""Generation with a KV cache: static methods agree with full forwards; dynamic methods drift
(the cached keys were rotated with other frequencies) unless the scale is fixed for the call."""

import pytest
import torch
from conftest import TRAINED, tiny_model

import hf_posext

PROMPT, NEW = 40, 90  # 40 + 90 = 130 tokens: well past the trained length 64


def cached_scores(model, prompt, generate=None):
    # an explicit mask: otherwise generate masks every prompt token equal to pad_token_id
    out = (generate or model.generate)(prompt, attention_mask=torch.ones_like(prompt),
                                       max_new_tokens=NEW, do_sample=False, use_cache=True,
                                       output_logits=True, return_dict_in_generate=True,
                                       pad_token_id=0)
    return out.sequences, torch.stack(out.logits, 1)  # [b, NEW], [b, NEW, vocab]


def full_forward_scores(model, sequences):
    """What each decoding step would see recomputing the whole prefix without a cache."""
    with torch.no_grad():
        logits = model(sequences[:, :-1], use_cache=False).logits  # [b, PROMPT+NEW-1, vocab]
    return logits[:, PROMPT - 1:]


@pytest.fixture
def prompt():
    return torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(3))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["linear", "ntk", "ntk_by_parts", "yarn"])
def test_static_methods_cache_equals_full_forward(arch, prompt, method):
    model = hf_posext.patch(tiny_model(arch), method, factor=4.0)
    sequences, scores = cached_scores(model, prompt)
    torch.testing.assert_close(scores, full_forward_scores(model, sequences), rtol=1e-4, atol=1e-4)
    no_cache = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW,
                              do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(no_cache, sequences)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_dynamic_methods_drift_with_cache_and_fixed_scale_fixes_it(arch, prompt, method):
    model = hf_posext.patch(tiny_model(arch), method, factor=4.0)
    # Plain generate: frequencies change as the sequence grows past L, so keys in the cache
    # were rotated with older frequencies than the current queries -> drift vs recompute.
    sequences, scores = cached_scores(model, prompt)
    drift = (scores - full_forward_scores(model, sequences)).abs().max().item()
    assert drift > 1e-4, drift

    # hf_posext.generate fixes the scale for prompt + max_new_tokens: cache and queries agree
    # with a full forward under the same fixed scale.
    sequences, scores = cached_scores(model, prompt, lambda p, **kw: hf_posext.generate(model, p, **kw))
    with hf_posext.fixed_rope_scale(model, PROMPT + NEW):
        reference = full_forward_scores(model, sequences)
    torch.testing.assert_close(scores, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_longrope_with_two_factor_sets_drifts_with_cache_and_fixed_scale_fixes_it(prompt):
    """transformers' longrope switches from short_factor to long_factor when a forward passes L:
    a 40-token prompt is cached with the short set, decoding past 64 queries with the long one.
    hf_posext.generate holds the set of prompt + max_new_tokens (the long one) for the call."""
    long = [1.0 + 0.5 * i for i in range(8)]   # head_dim 16: 8 frequencies
    model = hf_posext.patch(tiny_model("llama"), "longrope", 4.0, short_factor=[1.0] * 8,
                            long_factor=long, attention_factor=1.0)
    sequences, scores = cached_scores(model, prompt)
    drift = (scores - full_forward_scores(model, sequences)).abs().max().item()
    assert drift > 1e-4, drift
    sequences, scores = cached_scores(model, prompt, lambda p, **kw: hf_posext.generate(model, p, **kw))
    # the reference: every step recomputed without a cache, 130 tokens > L, so the long set
    torch.testing.assert_close(scores, full_forward_scores(model, sequences), rtol=1e-4, atol=1e-4)
    assert model.model.rotary_emb.rope_type == "longrope"   # restored after the call


def test_fixed_scale_uses_the_frequencies_of_the_total_length_and_restores():
    model = hf_posext.patch(tiny_model("llama"), "dynamic_yarn", factor=4.0)
    rotary = model.model.rotary_emb
    before = rotary.inv_freq.clone()
    with hf_posext.fixed_rope_scale(model, 3 * TRAINED):
        expected, scale = hf_posext.rope.methods.dynamic_yarn(16, 10_000.0, TRAINED, 3 * TRAINED)
        torch.testing.assert_close(model.model.rotary_emb.inv_freq, expected)
        assert model.model.rotary_emb.attention_scaling == pytest.approx(scale)
        model(torch.zeros(1, 10, dtype=torch.long))  # a short forward must not reset it
        torch.testing.assert_close(model.model.rotary_emb.inv_freq, expected)
    assert torch.equal(rotary.inv_freq, before) and "dynamic" in rotary.rope_type
    with pytest.raises(ValueError, match="positive integer"):
        with hf_posext.fixed_rope_scale(model, 0):
            pass

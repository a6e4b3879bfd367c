"""Chunked scoring reads the logits the model's own forward computes: for every supported family
(a tiny random model, its logit tail made large where it has one), decoder + `LMHead` equal
transformers' `model(ids).logits`; the chunked loss equals transformers' own loss and gradients;
a forward that post-processes logits in a way the table does not know is refused; and the
perplexity evaluation of a family with a tail scores the model's logits, not the bare linear
layer's (it did not, before the tails were applied)."""

import pytest
import torch
import torch.nn.functional as F
from families_tiny import build, plain_rope

from hf_posext.evaluation.lm_head import (IGNORE_INDEX, LOGIT_TAILS, LMHead, check_lm_head,
                                          chunked_nll_sum, decoder_and_head)
from hf_posext.evaluation.perplexity.loss import causal_targets, token_nll
from hf_posext.rope.compat import IS_V5
from hf_posext.rope.registry import SUPPORTED_MODEL_TYPES

pytestmark = pytest.mark.usefixtures("one_thread")

# Config values that make each tail far from a no-op on a tiny random model (its logits are ~1:
# Gemma's default cap of 30 would change them by ~1e-4 only).
STRONG = {
    **{t: {"logit_scale": 3.0} for t in ("cohere", "cohere2", "cohere2_moe")},
    **{t: {"logits_scaling": 0.25} for t in ("granite", "granitemoe", "granitemoehybrid", "granitemoeshared")},
    "hyperclovax": {"logits_scaling": 4.0},
    "minicpm3": {"dim_model_base": 16},                # logits_scaling = hidden_size / dim_model_base = 4
    "falcon_h1": {"lm_head_multiplier": 4.0},
    "modernbert-decoder": {},                          # its prediction head is a dense + norm layer
    **{t: {"final_logit_softcapping": 0.5} for t in ("gemma2", "gemma3_text", "gemma3n_text", "vaultgemma", "nanochat")},
}
SLOW = {"bamba", "falcon_h1", "gemma3n_text", "granitemoehybrid", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"}
FAMILIES = ([pytest.param(t, marks=pytest.mark.slow) if t in SLOW else t for t in SUPPORTED_MODEL_TYPES]
            if IS_V5 else ["llama", "gemma2", "granite"])


def strong(model_type: str):
    return build(model_type, plain_rope(model_type) if IS_V5 else None, **STRONG.get(model_type, {}))


def test_every_tail_has_a_strong_setting():
    assert set(LOGIT_TAILS) == set(STRONG)


@pytest.mark.parametrize("model_type", FAMILIES)
@torch.no_grad()
def test_decoder_and_lm_head_give_the_models_own_logits(model_type):
    model = strong(model_type)
    ids = torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(0))
    own = model(input_ids=ids, use_cache=False).logits[0].float()          # transformers' forward
    decoder, linear = decoder_and_head(model)
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0]
    torch.testing.assert_close(LMHead(model)(hidden), own, rtol=1e-5, atol=1e-5)
    check_lm_head(model)                                                     # and the probe agrees
    if model_type in LOGIT_TAILS:   # the tail matters here: the bare linear layer is wrong
        bare = F.linear(hidden.float(), linear.weight.float(), getattr(linear, "bias", None))
        assert (bare - own).abs().max() > 1e-2


def test_a_forward_with_an_unknown_tail_is_refused():
    model = build("llama")
    model.register_forward_hook(lambda m, args, out: out.__setitem__("logits", out.logits * 2.0))
    with pytest.raises(ValueError, match="post-processes the logits.*LOGIT_TAILS"):
        check_lm_head(model)


def test_perplexity_scores_the_models_logits_for_a_family_with_a_tail():
    model = strong("granite" if not IS_V5 else "cohere")
    ids = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(1))
    targets = causal_targets(ids)
    with torch.no_grad():
        own = model(input_ids=ids[None]).logits[0].float()
    expected = F.cross_entropy(own[:-1], targets[:-1], reduction="none").double()
    got = token_nll(model, ids, targets, chunk_size=16)
    torch.testing.assert_close(got[:-1], expected, rtol=1e-5, atol=1e-5)
    assert torch.isnan(got[-1])


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_chunked_loss_equals_transformers_loss_and_gradients(model_type):
    ids = torch.randint(3, 128, (1, 50), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[0, :7] = IGNORE_INDEX                       # e.g. a loss on the answer only
    ref_model, model = strong(model_type), strong(model_type)
    ref = ref_model(input_ids=ids, labels=labels).loss                     # transformers' own
    ref.backward()
    decoder, _ = decoder_and_head(model)
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0]
    targets = F.pad(labels[0, 1:], (0, 1), value=IGNORE_INDEX)              # next token at each position
    loss = chunked_nll_sum(LMHead(model), hidden, targets, chunk=16) / (targets != IGNORE_INDEX).sum()
    loss.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)

"""Prefix-cache reuse: a trial continued from the shared prefix's cache gives the logits of a
full recompute of its prompt (same held rope scale), for static, dynamic and attention-level
methods; and the whole cell's answers match one full prefill per trial."""

import pytest
import torch

import hf_posext
from _evalkit import char_tokenizer, tiny_model
from hf_posext.evaluation.retrieval import build_cell, get_task, noise_haystack
from hf_posext.evaluation.retrieval.decode import answer_cell, generate_trial, prefill
from hf_posext.generation import fixed_rope_scale

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("method", ["none", "yarn", "dynamic_ntk", "leaky_rerope", "dual_chunk"])
def test_cached_trial_equals_full_recompute(method):
    tok, model = char_tokenizer(), tiny_model()
    if method != "none":
        hf_posext.patch(model, method, 4.0)
    cell = build_cell(tok, get_task("multi_key"), noise_haystack(tok), 700, 0.5, [0, 1])
    assert len(cell.prefix) > 100          # a real shared prefix
    with fixed_rope_scale(model, cell.hold_length):
        cache = prefill(model, cell.prefix)
        for i in range(2):
            ids, m = cell.prompt(i), cell.max_new_tokens[i]
            cached, cached_logits = generate_trial(model, tok, ids, m, cache, scores=True)
            full, full_logits = generate_trial(model, tok, ids, m, None, scores=True)
            assert cached == full
            for a, b in zip(cached_logits, full_logits):
                torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
        assert cache.get_seq_length() == len(cell.prefix)   # the shared cache was not consumed


def test_cell_answers_with_and_without_prefix_reuse_agree():
    tok, model = char_tokenizer(), tiny_model()
    hf_posext.patch(model, "dynamic_ntk", 4.0)
    cell = build_cell(tok, get_task("single_needle"), noise_haystack(tok), 600, 1.0, [3, 4, 5])
    assert answer_cell(model, tok, cell, reuse_prefix=True) == answer_cell(model, tok, cell, reuse_prefix=False)

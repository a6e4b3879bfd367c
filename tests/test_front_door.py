"""The front door: `hf_posext.__all__` is the user API and nothing else, both
evaluation entry points among it, and `patch` takes either config class."""

import inspect
import types

import pytest
import torch
from conftest import TRAINED, tiny_model

import hf_posext
from hf_posext import AttentionExtensionConfig, RopeExtensionConfig


def test_all_is_the_user_api_only():
    names = set(hf_posext.__all__)
    assert {"patch", "unpatch", "from_pretrained", "generate", "check", "export",
            "evaluate_perplexity", "evaluate_retrieval", "PerplexityGrid", "RetrievalGrid",
            "RunInfo", "search_factors"} <= names
    # internals stay in their subpackages: no module, no registration hook, no math function
    for name in names - {"__version__"}:
        obj = getattr(hf_posext, name)
        assert not isinstance(obj, types.ModuleType), name
    assert not {"compute", "register", "methods", "embedded", "errors", "run_grid"} & names
    assert not hasattr(hf_posext, "register") and not hasattr(hf_posext, "compute")
    # `hf_posext.search` is the package again, not a function shadowing it
    assert isinstance(hf_posext.search, types.ModuleType)


def test_evaluation_entry_points_take_one_shape():
    """(model, tokenizer-or-documents, grid, *, run=...): the grid third, the run a keyword."""
    for fn in (hf_posext.evaluate_perplexity, hf_posext.evaluate_retrieval):
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params[:3]][0] == "model" and params[2].name == "grid", fn
        assert inspect.signature(fn).parameters["run"].kind is inspect.Parameter.KEYWORD_ONLY, fn


@pytest.mark.parametrize("fn, grid", [(hf_posext.evaluate_perplexity, "PerplexityGrid"),
                                      (hf_posext.evaluate_retrieval, "RetrievalGrid")])
def test_grid_fields_as_keywords_are_refused_naming_the_grid(fn, grid):
    """One guard on every entry point: `methods=` and `lengths=` belong in the grid object."""
    with pytest.raises(TypeError, match=grid):
        fn(tiny_model(), None, methods=["yarn"], lengths=[128])


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_patch_takes_an_attention_config_like_the_named_call():
    ids = torch.randint(0, 128, (1, 3 * TRAINED), generator=torch.Generator().manual_seed(0))
    named = hf_posext.patch(tiny_model(attn_implementation="sdpa"), "self_extend", factor=3,
                            window=16, group_size=4)
    config = AttentionExtensionConfig("self_extend", TRAINED, target_length=3 * TRAINED,
                                      window=16, group_size=4)
    given = hf_posext.patch(tiny_model(attn_implementation="sdpa"), config)
    assert given.config.to_dict() == named.config.to_dict()
    torch.testing.assert_close(logits(given, ids), logits(named, ids), rtol=0, atol=0)
    # and the rope config class, for symmetry
    rope = hf_posext.patch(tiny_model(), RopeExtensionConfig("yarn", 2.0, TRAINED))
    assert rope.config.max_position_embeddings == 2 * TRAINED


def test_patch_refuses_an_attention_config_of_another_length_or_mixed_arguments():
    config = AttentionExtensionConfig("self_extend", 4 * TRAINED, window=16, group_size=4)
    with pytest.raises(ValueError, match=f"trained_length={TRAINED}"):
        hf_posext.patch(tiny_model(), config)
    ok = AttentionExtensionConfig("self_extend", TRAINED, window=16, group_size=4)
    with pytest.raises(ValueError, match="not both"):
        hf_posext.patch(tiny_model(), ok, factor=2)

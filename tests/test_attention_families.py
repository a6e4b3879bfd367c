"""hf_posext's attention-level methods on the found families: they run where the family's attention
is the one their kernel replaces (every layer rotated, half-split layout, one rope), and elsewhere
are refused in one line naming why, with the model left as it was."""

import pytest
import torch
from families_tiny import build, logits, plain_rope

import hf_posext

# The families found in transformers' own modules are a 5.x feature: on 4.57 hf_posext supports the
# eleven families tests/test_families.py covers (their rope classes predate the shared pattern there).
from hf_posext.rope.compat import IS_V5 as _IS_V5  # noqa: E402
if not _IS_V5:
    pytest.skip("families found from transformers' modules: transformers 5.x", allow_module_level=True)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("model_type, why", [
    ("gpt_oss", "adds learned sinks to the softmax"),
    ("deepseek_v3", "multi-head latent attention"),
    ("llama4_text", "attend within chunks"),
    ("smollm3", "NoPE layers"),
    ("exaone4", "rotates queries and keys only where"),
    ("glm4", "rotary layout is interleaved"),
    ("cohere", "rotary layout is interleaved"),
])
@pytest.mark.parametrize("method, knobs", [("rerope", {}), ("self_extend", {}), ("logn", {}),
                                           ("yarn", {"logn": True})])
def test_refused_in_one_line(model_type, why, method, knobs):
    model = build(model_type, plain_rope(model_type))
    before, config = logits(model), model.config.to_dict()
    with pytest.raises(ValueError, match=f"cannot run on model_type '{model_type}': .*{why}") as err:
        hf_posext.patch(model, method, 2.0, **knobs)
    assert "\n" not in str(err.value)
    assert model.config.to_dict() == config and torch.equal(logits(model), before)


def test_refused_before_weights_load(tmp_path):
    build("gpt_oss", plain_rope("gpt_oss")).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="learned sinks"):
        hf_posext.from_pretrained(tmp_path, "rerope", 2.0)


def test_per_layer_rope_that_differs_is_refused():
    rope = plain_rope("olmo3")
    rope["sliding_attention"] = {**rope["sliding_attention"], "rope_theta": 1_000.0}
    model = build("olmo3", rope)
    with pytest.raises(ValueError, match="sliding-window layers use another rope"):
        hf_posext.patch(model, "rerope", 2.0)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "starcoder2", "olmo3", "phi"])
def test_run_where_the_attention_takes_them(model_type):
    model = build(model_type, plain_rope(model_type))
    before = logits(model)
    hf_posext.patch(model, "rerope", 2.0, window=16)
    out = logits(model)
    assert torch.isfinite(out).all() and (out - before).abs().max() > 1e-6
    # inside the window every relative position is trained: the first 16 tokens are unchanged
    torch.testing.assert_close(out[:, :16], before[:, :16], rtol=1e-5, atol=1e-5)
    hf_posext.unpatch(model)
    assert torch.equal(logits(model), before)

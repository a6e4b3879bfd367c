"""Every bad input gets an error that names the problem; the config object round-trips."""

import math

import pytest
import torch
from conftest import TRAINED, tiny_model
from transformers import GPT2Config, GPT2LMHeadModel

import hf_posext
from hf_posext import RopeExtensionConfig
from hf_posext.rope.compat import get_rope_parameters


@pytest.mark.parametrize("factor,match", [
    (0.5, "factor must be >= 1"), (0.0, "factor must be >= 1"), (-2, "factor must be >= 1"),
    (math.nan, "finite"), (math.inf, "finite"), ("2", "number"), (True, "number"),
])
def test_bad_factor(model, factor, match):
    with pytest.raises((ValueError, TypeError), match=match):
        hf_posext.patch(model, "yarn", factor=factor)
    assert not hf_posext.is_patched(model)
    assert get_rope_parameters(model.config)["rope_type"] == "default"  # nothing half-applied


def test_unknown_method(model):
    with pytest.raises(ValueError, match=r"Unknown RoPE extension method 'yarnn'.*yarn"):
        hf_posext.patch(model, "yarnn", factor=2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(beta_fast=1, beta_slow=32), "beta_fast must be greater than beta_slow"),
    (dict(beta_fast=4, beta_slow=4), "beta_fast must be greater than beta_slow"),
    (dict(beta_fast=math.nan), "finite"),
    (dict(beta_slow=0), "beta_slow must be > 0"),
    (dict(mscale_coefficient=-1), "mscale_coefficient must be > 0"),
    (dict(attention_factor=math.inf), "finite"),
    (dict(trained_length=0), "positive integer"),
    (dict(trained_length=10.5), "positive integer"),
])
def test_bad_yarn_knobs(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        hf_posext.patch(model, "yarn", factor=2, **kwargs)


def test_knob_the_method_does_not_use_is_refused(model):
    with pytest.raises(ValueError, match="'linear' does not use 'beta_fast'"):
        hf_posext.patch(model, "linear", factor=2, beta_fast=64)
    with pytest.raises(TypeError, match="Unknown parameter.*betafast"):
        hf_posext.patch(model, "yarn", factor=2, betafast=64)


def test_factor_and_target_length(model):
    with pytest.raises(ValueError, match="factor= .*target_length="):
        hf_posext.patch(model, "yarn")
    with pytest.raises(ValueError, match="disagree"):
        hf_posext.patch(model, "yarn", factor=2, target_length=8 * TRAINED)
    with pytest.raises(ValueError, match="shorter than the trained length"):
        hf_posext.patch(model, "yarn", target_length=TRAINED // 2)
    with pytest.raises(ValueError, match="positive integer"):
        hf_posext.patch(model, "yarn", target_length=-5)


def test_model_without_rope_is_refused():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64))
    with pytest.raises(ValueError, match="'gpt2'.*no rotary position embedding.*docs/families.md"):
        hf_posext.patch(gpt2, "yarn", factor=2)


def test_unsupported_rope_architecture_is_refused():
    """GPT-J keeps rotary frequencies of its own (no ROPE_INIT_FUNCTIONS): refused, saying why."""
    from transformers import GPTJConfig, GPTJForCausalLM
    other = GPTJForCausalLM(GPTJConfig(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64,
                                       rotary_dim=8, eos_token_id=0, bos_token_id=0))
    # (4.57's GPT-J computes its rotation inline, with no rotary module to find: refused as having none)
    with pytest.raises(ValueError, match="'gptj' (uses RoPE but hf_posext cannot extend it: .*shared rope functions|"
                                         ".*no rotary position embedding)"):
        hf_posext.patch(other, "yarn", factor=2)


def test_not_a_model():
    with pytest.raises(TypeError, match="transformers model"):
        hf_posext.patch(torch.nn.Linear(2, 2), "yarn", factor=2)


def test_stacking_on_a_foreign_extension_is_refused(model):
    hf_posext.patch(model, "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    model.__dict__.pop("_hf_posext_state")  # as if loaded from a llama3 checkpoint
    with pytest.raises(ValueError, match="already uses transformers' rope_type 'llama3'"):
        hf_posext.patch(model, "yarn", factor=2)


def test_config_missing_what_the_method_needs():
    with pytest.raises(ValueError, match="needs trained_length"):
        RopeExtensionConfig("yarn", 4.0).to_rope_dict(10_000.0)
    with pytest.raises(ValueError, match="mscale needs mscale_all_dim"):   # transformers ignores it alone
        RopeExtensionConfig.from_rope_dict({"rope_type": "yarn", "factor": 4.0, "mscale": 0.7,
                                            "original_max_position_embeddings": 64})
    with pytest.raises(ValueError, match="not an hf_posext method"):
        RopeExtensionConfig.from_rope_dict({"rope_type": "llama3", "factor": 4.0})


def test_invalid_saved_config_fails_on_load(tmp_path):
    """Our validators are registered with transformers: a config.json carrying a bad value for
    one of our types fails when transformers reads it, instead of producing a broken model."""
    import json

    from transformers import AutoConfig

    model = hf_posext.patch(tiny_model(), "dynamic_yarn", factor=4.0)
    model.config.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    for rope_key in ("rope_parameters", "rope_scaling"):  # both layouts are written
        data[rope_key]["beta_fast"] = 0.5  # below beta_slow
    (tmp_path / "config.json").write_text(json.dumps(data))
    # 5.x wraps it in huggingface_hub's StrictDataclassClassValidationError
    with pytest.raises(Exception, match="beta_fast must be greater than beta_slow"):
        AutoConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("method", hf_posext.ROPE_METHODS)
def test_config_dict_round_trip(method):
    cfg = RopeExtensionConfig(method, 4.0, 8192)
    assert RopeExtensionConfig.from_dict(cfg.to_dict()) == cfg
    back = RopeExtensionConfig.from_rope_dict(cfg.to_rope_dict(1e5), max_position_embeddings=8192 *
                                              (1 if cfg.is_dynamic else 4))
    assert back == cfg
    with pytest.raises(ValueError, match="Unknown RopeExtensionConfig keys"):
        RopeExtensionConfig.from_dict({**cfg.to_dict(), "typo": 1})


def test_config_defaults_and_aliases():
    cfg = RopeExtensionConfig("dynamic", 2.0, 4096)
    assert cfg.method == "dynamic_ntk" and cfg.rope_type == "dynamic" and cfg.is_dynamic
    yarn = RopeExtensionConfig("yarn", 2.0, 4096)
    assert (yarn.beta_fast, yarn.beta_slow, yarn.mscale_coefficient) == (32.0, 1.0, 0.1)
    mistral = RopeExtensionConfig("yarn", 8.0, 8192, beta_fast=128, beta_slow=2, mscale_coefficient=0.07)
    rope = mistral.to_rope_dict(1e6)
    assert rope["attention_factor"] == pytest.approx(0.07 * math.log(8) + 1)

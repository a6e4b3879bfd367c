"""Patches never half-apply, configs are always valid, argument errors come before weights load.
Each failure case is a test here."""

import copy
import dataclasses
import json

import pytest
import torch
from conftest import TRAINED, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM, modeling_rope_utils

import hf_posext
from hf_posext import RopeExtensionConfig
from hf_posext.rope.compat import IS_V5, get_rope_parameters

pytestmark = pytest.mark.usefixtures("one_thread")


def snapshot(model):
    return (copy.deepcopy(model.config.to_dict()), model.model.rotary_emb,
            hf_posext.is_patched(model))


def assert_unchanged(model, before):
    config, rotary, patched = before
    assert model.config.to_dict() == config
    assert model.model.rotary_emb is rotary
    assert hf_posext.is_patched(model) == patched


@pytest.mark.parametrize("first", [None, "yarn", "dynamic_yarn"])
def test_llama3_without_knobs_leaves_the_previous_patch(arch, tmp_path, first):
    """The original case: yarn, then llama3 without its knobs -> used to leave yarn modules under
    a plain config with is_patched True, and save_pretrained wrote plain RoPE."""
    model = tiny_model(arch)
    if first:
        hf_posext.patch(model, first, 2.0)
    before = snapshot(model)
    tokens = torch.arange(3 * TRAINED)[None] % 100
    with torch.no_grad():
        expected = model(tokens).logits
    with pytest.raises(ValueError, match=r"'llama3' needs \['low_freq_factor', 'high_freq_factor'\]"):
        hf_posext.patch(model, "llama3", 8)
    assert_unchanged(model, before)
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, expected)
    model.save_pretrained(tmp_path)
    saved = AutoConfig.from_pretrained(tmp_path)
    assert get_rope_parameters(saved)["rope_type"] == {None: "default", "yarn": "yarn",
                                                       "dynamic_yarn": "dynamic_yarn"}[first]


def _raise(*args, **kwargs):
    raise RuntimeError("boom inside transformers")


@pytest.mark.parametrize("where", ["validation", "rotary constructor"])
def test_any_exception_inside_transformers_is_undone(monkeypatch, where):
    model = hf_posext.patch(tiny_model("llama"), "yarn", 2.0)
    before = snapshot(model)
    if where == "rotary constructor":
        monkeypatch.setattr(type(model.model.rotary_emb), "__init__", _raise)
    elif IS_V5:
        monkeypatch.setattr(type(model.config), "validate_rope", _raise)
    else:
        monkeypatch.setattr(modeling_rope_utils, "rope_config_validation", _raise)
    with pytest.raises(RuntimeError, match="boom"):
        hf_posext.patch(model, "ntk", 4.0)
    monkeypatch.undo()
    assert_unchanged(model, before)
    hf_posext.unpatch(model)  # the state kept is still the original one
    assert get_rope_parameters(model.config)["rope_type"] == "default"
    assert model.config.max_position_embeddings == TRAINED


def test_a_failed_first_patch_leaves_the_model_unpatched(monkeypatch):
    model = tiny_model("llama")
    before = snapshot(model)
    monkeypatch.setattr(type(model.model.rotary_emb), "__init__", _raise)
    with pytest.raises(RuntimeError):
        hf_posext.patch(model, "yarn", 2.0)
    assert_unchanged(model, before)
    assert not hf_posext.is_patched(model)


def test_config_cannot_hold_an_invalid_value():
    cfg = RopeExtensionConfig("yarn", 4.0, 4096)
    for field, value in (("factor", 0), ("beta_fast", -5), ("method", "nope")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cfg, field, value)
    assert cfg.factor == 4.0 and cfg.beta_fast == 32.0
    with pytest.raises(ValueError, match="factor must be >= 1"):
        dataclasses.replace(cfg, factor=0)
    with pytest.raises(ValueError, match="beta_fast must be > 0"):
        dataclasses.replace(cfg, beta_fast=-5)
    assert dataclasses.replace(cfg, factor=8.0).factor == 8.0  # a changed copy, validated


@pytest.mark.parametrize("method,params", [
    ("llama3", {"low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ("longrope", {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}),
])
def test_passthrough_types_get_the_same_guards(method, params):
    model = tiny_model("llama")
    before = snapshot(model)
    with pytest.raises(ValueError, match="factor must be >= 1"):  # used to lower L with a warning
        hf_posext.patch(model, method, 0.5, **params)
    with pytest.raises(ValueError, match="shorter than the trained length"):
        hf_posext.patch(model, method, target_length=TRAINED // 2, **params)
    with pytest.raises(TypeError, match="factor must be a number"):
        hf_posext.patch(model, method, "2", **params)
    with pytest.raises(ValueError, match="needs"):
        hf_posext.patch(model, method, 2.0)
    assert_unchanged(model, before)
    hf_posext.patch(model, method, 2.0, **params)
    assert model.config.max_position_embeddings == 2 * TRAINED


def _hand_written(tmp_path, rope: dict):
    tiny_model("llama").config.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.pop("rope_parameters", None)
    data.pop("rope_scaling", None)
    key = "rope_parameters" if IS_V5 else "rope_scaling"
    data[key] = rope if not IS_V5 else {"rope_theta": 10_000.0, **rope}
    (tmp_path / "config.json").write_text(json.dumps(data))


@pytest.mark.parametrize("rope_type", ["ntk", "ntk_by_parts", "dynamic_yarn"])
@pytest.mark.parametrize("factor,match", [
    (None, r"rope_type '\w+' is missing the required key 'factor'"),
    ("2", r"rope config key 'factor' \(rope_type '\w+'\): factor must be a number, got '2'"),
    (0.5, r"rope config key 'factor' \(rope_type '\w+'\): factor must be >= 1"),
])
def test_hand_written_config_with_missing_or_mistyped_factor(tmp_path, rope_type, factor, match):
    """Used to load silently as plain RoPE (no factor) or raise a TypeError from deep inside."""
    rope = {"rope_type": rope_type, "original_max_position_embeddings": TRAINED}
    if factor is not None:
        rope["factor"] = factor
    _hand_written(tmp_path, rope)
    with pytest.raises(Exception, match=match):  # 5.x wraps it in a StrictDataclass error
        AutoConfig.from_pretrained(tmp_path)
    with pytest.raises(Exception, match=match):
        AutoModelForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("args,kwargs,error,match", [
    (("llama3", 8.0), {}, ValueError, "needs"),
    (("llama3", 0.5), {"low_freq_factor": 1.0, "high_freq_factor": 4.0}, ValueError, "factor must be >= 1"),
    (("yarn",), {"target_length": TRAINED // 2}, ValueError, "shorter than the trained"),
    (("yarn", 2.0), {"target_length": 8 * TRAINED}, ValueError, "disagree"),
    (("yarn",), {}, ValueError, "Pass factor="),
    (("yarn", 2.0), {"beta_fst": 64}, TypeError, "did you mean 'beta_fast'"),
    (("yarn", 2.0), {"finetuned": True}, ValueError, "'yarn' does not use 'finetuned'"),
    (("dynamic_yarn", 2.0), {"finetuned": "yes"}, TypeError, "finetuned must be True or False"),
    (("ntk", 2.0), {"beta_fast": 64}, ValueError, "'ntk' does not use 'beta_fast'"),
    (("longrope", 4.0), {"short_factor": [1.0] * 8}, ValueError, "needs"),
])
def test_from_pretrained_argument_errors_before_any_weight_loads(tmp_path, monkeypatch, args,
                                                                 kwargs, error, match):
    tiny_model("llama").save_pretrained(tmp_path)
    import hf_posext.loading as loading

    def no_weights(*a, **k):
        raise AssertionError("weights loaded before the argument error")
    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(error, match=match):
        hf_posext.from_pretrained(tmp_path, *args, **kwargs)

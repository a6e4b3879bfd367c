"""Patched vs unpatched models: identity at s=1, divergence past L, replace-not-compound, exact
unpatch, logits against transformers' own rope types, float32 frequencies, rotary contract."""

import copy
import math

import pytest
import torch
from conftest import TRAINED, tiny_model

import hf_posext
from hf_posext.rope import methods
from hf_posext.rope.compat import fill_head_dim, get_rope_parameters, set_rope_parameters


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("method", hf_posext.ROPE_METHODS)
def test_factor_one_equals_unpatched(model, tokens, method):
    before = logits(model, tokens)
    hf_posext.patch(model, method, factor=1.0)
    torch.testing.assert_close(logits(model, tokens), before, rtol=1e-6, atol=1e-6)
    hf_posext.patch(model, method, target_length=TRAINED)  # target == trained length
    torch.testing.assert_close(logits(model, tokens), before, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", hf_posext.ROPE_METHODS)
def test_extension_changes_outputs_past_trained_length(model, tokens, method):
    before = logits(model, tokens)
    hf_posext.patch(model, method, factor=4.0)
    after = logits(model, tokens)
    # every method changes how positions beyond L are encoded; CoPE touches only the components
    # whose period exceeds L (the 5 slowest of the tiny model's 8, tapered from 1 at the boundary),
    # which turn less than a period over 3L, so its logits move less than the others'
    floor = 1e-4 if method == "cope" else 1e-3
    assert (after[:, TRAINED:] - before[:, TRAINED:]).abs().max() > floor
    if method.startswith("dynamic"):  # dynamic methods stay the identity up to L (seq_len <= L)
        short = tokens[:, :TRAINED]
        hf_posext.unpatch(model)
        ref = logits(model, short)
        hf_posext.patch(model, method, factor=4.0)
        torch.testing.assert_close(logits(model, short), ref, rtol=1e-6, atol=1e-6)


def test_config_and_max_position_embeddings(model):
    hf_posext.patch(model, "yarn", factor=4.0)
    rope = get_rope_parameters(model.config)
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0
    assert rope["original_max_position_embeddings"] == TRAINED
    assert model.config.max_position_embeddings == 4 * TRAINED
    hf_posext.patch(model, "linear", target_length=6 * TRAINED)  # factor from the target
    assert get_rope_parameters(model.config)["factor"] == 6.0
    assert model.config.max_position_embeddings == 6 * TRAINED
    hf_posext.patch(model, "dynamic", factor=2.0)  # transformers' name accepted
    assert get_rope_parameters(model.config)["rope_type"] == "dynamic"
    assert model.config.max_position_embeddings == TRAINED  # transformers reads it as L


@pytest.mark.parametrize("method", hf_posext.ROPE_METHODS)
def test_patch_twice_replaces(arch, tokens, method):
    fresh = hf_posext.patch(tiny_model(arch), method, factor=2.0)
    twice = hf_posext.patch(hf_posext.patch(tiny_model(arch), "yarn", factor=8.0), method, factor=2.0)
    torch.testing.assert_close(logits(twice, tokens), logits(fresh, tokens), rtol=0, atol=0)
    assert twice.config.to_dict() == fresh.config.to_dict()


@pytest.mark.parametrize("method", hf_posext.ROPE_METHODS)
def test_unpatch_restores_exactly(model, tokens, method):
    config_before = copy.deepcopy(model.config.to_dict())
    rotary_before = model.model.rotary_emb
    before = logits(model, tokens)
    hf_posext.patch(model, method, factor=3.0)
    hf_posext.patch(model, "ntk", factor=2.0)
    assert hf_posext.is_patched(model)
    hf_posext.unpatch(model)
    assert not hf_posext.is_patched(model)
    assert model.config.to_dict() == config_before
    assert model.model.rotary_emb is rotary_before
    assert torch.equal(logits(model, tokens), before)
    with pytest.raises(ValueError, match="not patched"):
        hf_posext.unpatch(model)


def native_model(arch, rope: dict, max_pos: int):
    """The same tiny model built by transformers alone from a native rope config."""
    m = tiny_model(arch)
    cfg = m.config
    cfg.max_position_embeddings = max_pos
    fill_head_dim(cfg)  # transformers 4.x Mistral: its own rope functions need head_dim set
    set_rope_parameters(cfg, {"rope_theta": 10_000.0, **rope})
    m.model.rotary_emb = type(m.model.rotary_emb)(config=cfg)
    return m


@pytest.mark.parametrize("method,rope,max_pos", [
    ("linear", {"rope_type": "linear", "factor": 4.0}, 4 * TRAINED),
    ("dynamic_ntk", {"rope_type": "dynamic", "factor": 4.0}, TRAINED),
    ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAINED}, 4 * TRAINED),
])
def test_logits_match_transformers_native_types(arch, tokens, method, rope, max_pos):
    ours = hf_posext.patch(tiny_model(arch), method, factor=4.0)
    theirs = native_model(arch, rope, max_pos)
    torch.testing.assert_close(logits(ours, tokens), logits(theirs, tokens), rtol=1e-5, atol=1e-5)


def test_our_registered_types_match_transformers_where_they_agree(arch, tokens):
    """ntk_by_parts with YaRN's temperature folded in is transformers' yarn; our rope init
    function drives the model, so this checks it end to end in logits."""
    theirs = native_model(arch, {"rope_type": "yarn", "factor": 4.0,
                                 "original_max_position_embeddings": TRAINED}, 4 * TRAINED)
    ours = hf_posext.patch(tiny_model(arch), "ntk_by_parts", factor=4.0)
    ours.model.rotary_emb.attention_scaling = 0.1 * math.log(4.0) + 1  # YaRN's mscale
    torch.testing.assert_close(logits(ours, tokens), logits(theirs, tokens), rtol=1e-5, atol=1e-5)
    # static NTK is default RoPE with base b·s^(d/(d-2))
    d = ours.config.head_dim
    ntk = hf_posext.patch(tiny_model(arch), "ntk", factor=4.0)
    plain = native_model(arch, {"rope_type": "default"}, TRAINED)
    set_rope_parameters(plain.config, {"rope_type": "default",
                                       "rope_theta": 10_000.0 * 4.0 ** (d / (d - 2))})
    plain.model.rotary_emb = type(plain.model.rotary_emb)(config=plain.config)
    torch.testing.assert_close(logits(ntk, tokens), logits(plain, tokens), rtol=1e-5, atol=1e-5)


def test_mistral_yarn_settings_reachable(arch):
    model = hf_posext.patch(tiny_model(arch), "yarn", factor=8.0, beta_fast=128, beta_slow=2,
                            mscale_coefficient=0.07)
    rotary = model.model.rotary_emb
    assert rotary.attention_scaling == pytest.approx(0.07 * math.log(8.0) + 1)
    expected, _ = methods.yarn(16, 10_000.0, 8.0, TRAINED, 128.0, 2.0)
    torch.testing.assert_close(rotary.inv_freq, expected, rtol=2e-6, atol=0)


def test_frequencies_stay_float32_in_bf16_models(arch, tokens):
    model = tiny_model(arch).to(torch.bfloat16)
    hf_posext.patch(model, "yarn", factor=4.0)
    rotary = model.model.rotary_emb
    assert rotary.inv_freq.dtype == torch.float32
    positions = torch.arange(5000)[None]  # far positions: bf16 products would be off by tens
    x = torch.zeros(1, 1, dtype=torch.bfloat16)
    cos, sin = rotary(x, positions)
    assert cos.dtype == torch.bfloat16 and cos.shape == (1, 5000, 16)
    ref_inv, mscale = methods.yarn(16, 10_000.0, 4.0, TRAINED)
    angle = positions[0, :, None].double() * ref_inv.double()  # [5000, 8]
    ref_cos = (torch.cat([angle, angle], -1).cos() * mscale).to(torch.bfloat16)
    torch.testing.assert_close(cos[0], ref_cos, rtol=0, atol=8e-3)  # bf16 rounding only


def test_rotary_contract_returns_cos_sin(model):
    hf_posext.patch(model, "dynamic_yarn", factor=4.0)
    x = torch.zeros(2, 3, 4)
    pos = torch.arange(300)[None].expand(2, -1)
    cos, sin = model.model.rotary_emb(x, pos)
    assert cos.shape == sin.shape == (2, 300, 16)
    inv, scale = methods.dynamic_yarn(16, 10_000.0, TRAINED, 300)
    torch.testing.assert_close(cos[0, 299, :8], torch.cos(299 * inv) * scale, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("passthrough,params", [
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ("longrope", {"factor": 4.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}),
])
def test_transformers_llama3_and_longrope_pass_through(arch, passthrough, params):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = hf_posext.patch(tiny_model(arch), passthrough, **params)
    rope = get_rope_parameters(model.config)
    assert rope["rope_type"] == passthrough and rope["original_max_position_embeddings"] == TRAINED
    expected, _ = ROPE_INIT_FUNCTIONS[passthrough](model.config, None, seq_len=10 * TRAINED)
    if passthrough == "llama3":
        torch.testing.assert_close(model.model.rotary_emb.inv_freq, expected)
    tokens = torch.randint(0, 128, (1, 3 * TRAINED))
    assert torch.isfinite(logits(model, tokens)).all()

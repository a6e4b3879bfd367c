"""The families practitioners extend in 2025-26, beyond the sweep of tests/test_families_found.py:
each family's own long-context form, built by transformers alone, against the same weights
patched by hf_posext: gpt-oss's YaRN without truncation, DeepSeek-V3's YaRN with mscale /
mscale_all_dim (its softmax scale too), Llama 4's llama3 rope with its NoPE layers, SmolLM3's
NoPE layers, OLMo 3's per-layer-type rope; save/reload; the refusals."""

import math

import pytest
import torch
from families_tiny import L, build, logits, native, plain_rope
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.rope.compat import get_rope_parameters

# The families found in transformers' own modules are a 5.x feature: on 4.57 hf_posext supports the
# eleven families tests/test_families.py covers (their rope classes predate the shared pattern there).
from hf_posext.rope.compat import IS_V5 as _IS_V5  # noqa: E402
if not _IS_V5:
    pytest.skip("families found from transformers' modules: transformers 5.x", allow_module_level=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def patched_equals_native(model_type, method, factor, knobs, rope_keys, **config):
    plain = plain_rope(model_type, **config)
    model = hf_posext.patch(build(model_type, plain, **config), method, factor, **knobs)
    reference = build(model_type, native(plain, **rope_keys), **config)
    close(logits(model), logits(reference))
    return model, reference


# -- gpt-oss: YaRN with truncate=False, its own long-context config ---------------------------
def test_gpt_oss_yarn_without_truncation_is_its_native_config():
    keys = dict(rope_type="yarn", factor=8.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                original_max_position_embeddings=L)
    patched_equals_native("gpt_oss", "yarn", 8.0, {"truncate": False}, keys)
    truncated = hf_posext.patch(build("gpt_oss", plain_rope("gpt_oss")), "yarn", 8.0)
    assert (logits(truncated) - logits(build("gpt_oss", native(plain_rope("gpt_oss"), **keys)))
            ).abs().max() > 1e-6, "truncate changed nothing here: pick a config where it matters"


def test_a_native_gpt_oss_checkpoint_is_read_and_re_extended():
    rope = native(plain_rope("gpt_oss"), rope_type="yarn", factor=8.0, truncate=False,
                  original_max_position_embeddings=L)
    model = build("gpt_oss", rope)
    assert hf_posext.trained_length(model) == L
    hf_posext.patch(model, "yarn", 4.0, truncate=False)   # replaces, never compounds
    close(logits(model), logits(build("gpt_oss", {**rope, "factor": 4.0})))


# -- DeepSeek-V3: MLA, interleaved rope on qk_rope_head_dim, mscale / mscale_all_dim ----------
@pytest.mark.parametrize("mscale, mscale_all_dim", [(1.0, 1.0), (0.707, 1.0), (None, 0.707)])
def test_deepseek_v3_yarn_with_its_mscale_keys(mscale, mscale_all_dim):
    knobs = {k: v for k, v in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)) if v is not None}
    keys = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=L, **knobs)
    model, reference = patched_equals_native("deepseek_v3", "yarn", 4.0, knobs, keys)
    ours = [m.scaling for m in model.modules() if hasattr(m, "qk_head_dim")]
    theirs = [m.scaling for m in reference.modules() if hasattr(m, "qk_head_dim")]
    assert ours == theirs
    # DeepSeek's softmax scale: qk_head_dim^-0.5 · (0.1·mscale_all_dim·ln s + 1)², qk_head_dim 16
    assert ours[0] == pytest.approx(16 ** -0.5 * (0.1 * mscale_all_dim * math.log(4.0) + 1) ** 2)


def test_deepseek_v3_unpatch_save_and_reload(tmp_path):
    plain = plain_rope("deepseek_v3")
    model = build("deepseek_v3", plain)
    before, scaling = logits(model), [m.scaling for m in model.modules() if hasattr(m, "qk_head_dim")]
    hf_posext.patch(model, "yarn", 4.0, mscale=1.0, mscale_all_dim=1.0)
    extended = logits(model)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    torch.testing.assert_close(logits(reloaded), extended, rtol=0, atol=0)
    assert get_rope_parameters(reloaded.config)["mscale_all_dim"] == 1.0
    hf_posext.unpatch(model)
    assert torch.equal(logits(model), before)
    assert [m.scaling for m in model.modules() if hasattr(m, "qk_head_dim")] == scaling
    hooked = hf_posext.from_pretrained(tmp_path, "yarn", 2.0, mscale=1.0, mscale_all_dim=1.0,
                                       attn_implementation="eager")
    close(logits(hooked), logits(build("deepseek_v3", native(
        plain, rope_type="yarn", factor=2.0, original_max_position_embeddings=L, mscale=1.0,
        mscale_all_dim=1.0))))


def test_a_failed_patch_restores_the_softmax_scale():
    model = build("deepseek_v3", plain_rope("deepseek_v3"))
    scaling = [m.scaling for m in model.modules() if hasattr(m, "qk_head_dim")]
    with pytest.raises(ValueError, match="cannot run on model_type 'deepseek_v3'"):
        hf_posext.patch(model, "rerope")
    hf_posext.patch(model, "yarn", 4.0, mscale_all_dim=1.0)
    with pytest.raises(ValueError):
        hf_posext.patch(model, "yarn", 4.0, mscale=1.0)    # mscale needs mscale_all_dim
    hf_posext.unpatch(model)
    assert [m.scaling for m in model.modules() if hasattr(m, "qk_head_dim")] == scaling


# -- Llama 4: rope on the chunked-attention layers, NoPE global layers -------------------------
def test_llama4_llama3_rope_is_its_native_config():
    keys = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=L)
    patched_equals_native("llama4_text", "llama3", 8.0,
                          {"low_freq_factor": 1.0, "high_freq_factor": 4.0}, keys)


@pytest.mark.parametrize("model_type, config", [
    ("llama4_text", {"no_rope_layers": [0] * 4}), ("smollm3", {"no_rope_layers": [0] * 4}),
    ("exaone4", {"layer_types": ["full_attention"] * 4}),   # with a sliding window: global = NoPE
])
def test_nope_layers_stay_without_rope(model_type, config):
    """With every layer NoPE the extension has nothing to change: logits stay bit for bit."""
    model = build(model_type, plain_rope(model_type, **config), **config)
    before = logits(model)
    hf_posext.patch(model, "yarn", 4.0)
    assert torch.equal(logits(model), before)


def test_smollm3_every_fourth_layer_nope_matches_native():
    model, _ = patched_equals_native("smollm3", "dynamic_yarn", 4.0, {},
                                     dict(rope_type="yarn", factor=3.0, original_max_position_embeddings=L))
    assert model.config.no_rope_layers == [1, 1, 1, 0]


# -- OLMo 3: per-layer-type rope, only the full-attention layers are scaled --------------------
def test_olmo3_scales_full_attention_layers_only():
    model, reference = patched_equals_native(
        "olmo3", "yarn", 4.0, {}, dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=L))
    rotary = model.model.rotary_emb
    plain_rotary = build("olmo3", plain_rope("olmo3")).model.rotary_emb
    assert torch.equal(rotary.sliding_attention_inv_freq, plain_rotary.sliding_attention_inv_freq)
    assert not torch.equal(rotary.full_attention_inv_freq, plain_rotary.full_attention_inv_freq)
    sliding_only = {"layer_types": ["sliding_attention"] * 4}
    model = build("olmo3", plain_rope("olmo3", **sliding_only), **sliding_only)
    before = logits(model)
    hf_posext.patch(model, "yarn", 4.0)
    assert torch.equal(logits(model), before)


def test_truncate_false_is_refused_in_a_per_layer_type_rope_dict():
    model = build("olmo3", plain_rope("olmo3"))
    before = logits(model)
    with pytest.raises(ValueError, match="reads truncate from the top level of rope_parameters"):
        hf_posext.patch(model, "yarn", 4.0, truncate=False)
    assert torch.equal(logits(model), before)


# -- save / reload of the new families ---------------------------------------------------------
@pytest.mark.parametrize("model_type, knobs", [
    ("qwen3_moe", {}), ("mixtral", {"beta_fast": 64.0}), ("smollm3", {}), ("glm4", {}),
    ("phi", {}), ("starcoder2", {}), ("granitemoe", {}), ("exaone4", {}), ("olmo3", {}),
    ("gpt_oss", {"truncate": False}), ("llama4_text", {}), ("ministral", {}),
])
def test_save_and_reload_keeps_the_logits(model_type, knobs, tmp_path):
    model = hf_posext.patch(build(model_type, plain_rope(model_type)), "yarn", 4.0, **knobs)
    extended = logits(model)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    torch.testing.assert_close(logits(reloaded), extended, rtol=0, atol=0)
    assert hf_posext.trained_length(reloaded) == L


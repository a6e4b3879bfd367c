"""Every supported RoPE family beyond Llama/Mistral, each with a tiny random
config: frequencies against the formulas, logits against a plain-RoPE model built by
transformers, patch/unpatch, save/reload, history-free dynamic rope. Gemma 3 extends only its
global-attention rope; its local (sliding-window) rope keeps rope_local_base_freq."""

import copy
import math

import numpy as np
import pytest
import torch
import transformers
from test_methods import ref_default, ref_ramp_by_parts
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.rope import dynamic
from hf_posext.rope.compat import GLOBAL_LAYER_TYPE, IS_V5, get_rope_parameters
from hf_posext.rope.registry import SUPPORTED_MODEL_TYPES, check_supported, rotary_modules

pytestmark = pytest.mark.usefixtures("one_thread")

L, BASE, LOCAL_BASE = 64, 10_000.0, 1_000.0
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=L, rope_theta=BASE,
              attn_implementation="eager")
# model_type -> (config class, model class, extra config, rotary dim d)
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, 16),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}, 16),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "sliding_window": 16}, 16),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    {"head_dim": 16, "sliding_window": 16, "num_hidden_layers": 3,
                     "sliding_window_pattern": 2, "rope_local_base_freq": LOCAL_BASE}, 16),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"pad_token_id": 0, "eos_token_id": 1}, 16),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}, 16),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"rotary_pct": 0.5}, 8),  # partial
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {"partial_rotary_factor": 0.5}, 8),
}


def build(model_type, seed=0, **overrides):
    config_cls, model_cls, extra, _ = FAMILIES[model_type]
    kwargs = {**COMMON, **extra, **overrides}
    if model_type == "gpt_neox":  # GPT-NeoX names its base rotary_emb_base (4.57 and 5.x)
        kwargs["rotary_emb_base"] = kwargs.pop("rope_theta")
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).eval()


def logits(model, n=3 * L):
    with torch.no_grad():
        return model((torch.arange(n)[None] * 5) % 128).logits


def frequencies(model, local=False):
    """(inv_freq, attention scale) of the global (or Gemma 3's local) rope."""
    for _, _name, module in rotary_modules(model):  # the extended ones
        slots = dynamic.slots(module)
        if slots == [None] and not local:
            return dynamic.get_frequencies(module, None)
        if slots != [None]:  # 5.x per-layer-type module
            return dynamic.get_frequencies(module, "sliding_attention" if local else GLOBAL_LAYER_TYPE)
    return dynamic.get_frequencies(model.model.rotary_emb_local, None)  # 4.57 Gemma 3


def test_the_deep_tests_cover_families_of_the_registry():
    # every supported family: tests/test_families_found.py; phi3: tests/test_longrope.py
    refused_on_4x = set() if IS_V5 else {"olmo2"}   # test_olmo2_on_transformers_4
    assert set(FAMILIES) - refused_on_4x | {"llama", "mistral", "phi3"} <= set(SUPPORTED_MODEL_TYPES)


@pytest.fixture(params=list(FAMILIES))
def family(request):
    if request.param == "olmo2" and not IS_V5:
        pytest.skip("OLMo 2 is refused on transformers 4.57 (test_olmo2_on_transformers_4)")
    return request.param


@pytest.mark.skipif(IS_V5, reason="transformers 4.57 only")
def test_olmo2_on_transformers_4_is_refused_with_the_reason(tmp_path):
    model = build("olmo2")
    with pytest.raises(ValueError, match="'olmo2' uses RoPE but hf_posext cannot extend it: "
                                         "transformers 4.57's Olmo2Config accepts only"):
        hf_posext.patch(model, "yarn", 2.0)
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'olmo2' cannot be extended: transformers 4.57"):
        hf_posext.from_pretrained(tmp_path, "yarn", 2.0)


def test_frequencies_against_the_formulas(family):
    d = FAMILIES[family][3]
    model = build(family)
    torch.testing.assert_close(frequencies(model)[0].double(), torch.from_numpy(ref_default(d, BASE)))
    hf_posext.patch(model, "yarn", 4.0)
    inv, scale = frequencies(model)
    np.testing.assert_allclose(inv.double().numpy(), ref_ramp_by_parts(d, BASE, 4.0, L, 32.0, 1.0), rtol=2e-6)
    assert scale == pytest.approx(0.1 * math.log(4.0) + 1)
    hf_posext.patch(model, "ntk", 4.0)
    inv, scale = frequencies(model)
    np.testing.assert_allclose(inv.double().numpy(), ref_default(d, BASE * 4.0 ** (d / (d - 2))), rtol=2e-6)
    assert scale == 1.0
    if family == "gemma3_text":  # the local rope is never extended
        inv, scale = frequencies(model, local=True)
        np.testing.assert_allclose(inv.double().numpy(), ref_default(d, LOCAL_BASE), rtol=2e-6)
        assert scale == 1.0


def test_static_ntk_logits_equal_plain_rope_with_the_new_base(family):
    """End to end against transformers alone: NTK is plain RoPE with b·s^(d/(d-2)) (only the
    global base for Gemma 3, whose local base stays)."""
    d = FAMILIES[family][3]
    ours = hf_posext.patch(build(family), "ntk", 4.0)
    plain = build(family, rope_theta=BASE * 4.0 ** (d / (d - 2)))
    torch.testing.assert_close(logits(ours), logits(plain), rtol=1e-5, atol=1e-5)


def test_patch_unpatch_and_save_reload(family, tmp_path):
    model = build(family)
    config_before, before = copy.deepcopy(model.config.to_dict()), logits(model)
    hf_posext.patch(model, "yarn", 4.0, beta_fast=64, beta_slow=2)
    extended = logits(model)
    assert (extended - before).abs().max() > 1e-4
    assert model.config.max_position_embeddings == 4 * L
    assert hf_posext.trained_length(model) == L
    hf_posext.unpatch(model)
    assert model.config.to_dict() == config_before
    assert torch.equal(logits(model), before)
    hf_posext.patch(model, "yarn", 4.0, beta_fast=64, beta_slow=2)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert get_rope_parameters(reloaded.config) == get_rope_parameters(model.config)
    torch.testing.assert_close(logits(reloaded), extended, rtol=0, atol=0)
    hooked = hf_posext.from_pretrained(tmp_path, "ntk", 2.0, attn_implementation="eager")
    assert hf_posext.trained_length(hooked) == L  # re-extending a saved extension replaces it


def test_dynamic_yarn_is_history_free(family, tmp_path):
    model = hf_posext.patch(build(family), "dynamic_yarn", 4.0)
    fresh = logits(hf_posext.patch(build(family), "dynamic_yarn", 4.0), 2 * L)
    logits(model, 4 * L)
    torch.testing.assert_close(logits(model, 2 * L), fresh, rtol=0, atol=0)
    model.save_pretrained(tmp_path)  # a plain transformers reload gets the hook too
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert all(dynamic.is_history_free(m) for _, _, m in rotary_modules(reloaded))
    logits(reloaded, 4 * L)
    torch.testing.assert_close(logits(reloaded, 2 * L), fresh, rtol=0, atol=0)
    expected = ref_ramp_by_parts(FAMILIES[family][3], BASE, 2.0, L, 32.0, 1.0)
    inv, scale = frequencies(model)
    np.testing.assert_allclose(inv.double().numpy(), expected, rtol=2e-6)
    assert scale == pytest.approx(0.1 * math.log(2.0) + 1)  # 5.x Gemma 3 too (per-layer scale)


def test_multimodal_rope_is_refused_with_the_reason():
    """A model whose rope dict splits frequencies across position axes (M-RoPE)."""
    model = build("qwen2")
    model.config.model_type = "qwen2_vl_text"  # as a multimodal text tower would be
    rope = get_rope_parameters(model.config)
    key = "rope_parameters" if IS_V5 else "rope_scaling"
    model.config.__dict__[key] = {**rope, "mrope_section": [2, 3, 3]}
    with pytest.raises(ValueError, match="cannot extend it: it uses multimodal RoPE"):
        check_supported(model)


def test_fixed_rope_scale_holds_every_family(family):
    """generation.fixed_rope_scale on one-rope and per-layer-type rotary modules alike."""
    model = hf_posext.patch(build(family), "dynamic_yarn", 4.0)
    d = FAMILIES[family][3]
    with hf_posext.fixed_rope_scale(model, 3 * L):
        logits(model, 10)  # a short forward must not reset the held frequencies
        inv, scale = frequencies(model)
        np.testing.assert_allclose(inv.double().numpy(), ref_ramp_by_parts(d, BASE, 3.0, L, 32.0, 1.0),
                                   rtol=2e-6)
        assert scale == pytest.approx(0.1 * math.log(3.0) + 1)
    logits(model, 10)
    inv, scale = frequencies(model)
    np.testing.assert_allclose(inv.double().numpy(), ref_default(d, BASE), rtol=2e-6)
    assert scale == 1.0

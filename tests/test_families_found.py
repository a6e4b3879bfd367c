"""Every family hf_posext finds in transformers and supports (rope/families.py), each as a tiny
random model: `hf_posext.patch(model, method, ...)` on the plain-RoPE model gives the logits of
the same weights built by transformers with its own rope type in the config (yarn, linear,
dynamic; `dynamic_yarn` at 3·L is transformers' yarn at factor 3; `ntk` is plain RoPE on the
raised base, with the rotary dim read from the model transformers built), over 3·L tokens;
unpatch restores the logits exactly; an unpatched model of the family is untouched."""

import pytest
import torch
from families_tiny import L, build, logits, native, plain_rope, theta

import hf_posext
from hf_posext.rope.compat import GLOBAL_LAYER_TYPE
from hf_posext.rope.registry import LONGROPE_ONLY, SUPPORTED_MODEL_TYPES

# The families found in transformers' own modules are a 5.x feature: on 4.57 hf_posext supports the
# eleven families tests/test_families.py covers (their rope classes predate the shared pattern there).
from hf_posext.rope.compat import IS_V5 as _IS_V5  # noqa: E402
if not _IS_V5:
    pytest.skip("families found from transformers' modules: transformers 5.x", allow_module_level=True)


pytestmark = pytest.mark.usefixtures("one_thread")

S = 4.0
# Families whose tiny model costs seconds per build here (Mamba layers without their kernels,
# Gemma 3n's per-layer inputs, gated delta-net layers): `make test-slow`.
SLOW = {"bamba", "falcon_h1", "gemma3n_text", "granitemoehybrid", "qwen3_5_text",
        "qwen3_5_moe_text", "qwen3_next"}
# LONGROPE_ONLY (Phi-3): saved in its longrope form, tested against transformers' longrope in
# tests/test_longrope.py.
FOUND = [pytest.param(t, marks=pytest.mark.slow) if t in SLOW else t
         for t in SUPPORTED_MODEL_TYPES if t not in LONGROPE_ONLY]


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def rotary_dim(model) -> int:
    """d as transformers computed it: twice its (full-attention) inv_freq's length."""
    for module in model.modules():
        inv = getattr(module, "inv_freq", None)
        inv = getattr(module, f"{GLOBAL_LAYER_TYPE}_inv_freq", inv)
        if type(module).__name__.endswith("RotaryEmbedding") and inv is not None:
            return 2 * inv.numel()
    raise AssertionError("no rotary module")


def test_the_sweep_covers_the_eleven_families_of_before_and_the_new_ones():
    before = {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "olmo2", "granite",
              "gpt_neox", "stablelm", "phi3"}
    new = {"qwen2_moe", "qwen3_moe", "mixtral", "ministral", "smollm3", "gpt_oss", "deepseek_v3",
           "olmo3", "glm4", "phi", "llama4_text", "exaone4", "starcoder2", "granitemoe"}
    assert before | new <= set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", FOUND)
def test_patch_equals_transformers_own_rope_types(model_type):
    plain = plain_rope(model_type)
    model = build(model_type, plain)
    before = logits(model)
    cases = [("yarn", S, native(plain, rope_type="yarn", factor=S, original_max_position_embeddings=L)),
             ("linear", S, native(plain, rope_type="linear", factor=S)),
             ("dynamic_ntk", S, native(plain, rope_type="dynamic", factor=S)),
             # at 3·L tokens dynamic YaRN is YaRN at s = 3 (0.1·ln s + 1: transformers' default)
             ("dynamic_yarn", S, native(plain, rope_type="yarn", factor=3.0,
                                        original_max_position_embeddings=L))]
    d = rotary_dim(model)
    cases.append(("ntk", S, native(plain, rope_theta=theta(plain) * S ** (d / (d - 2)))))
    for method, factor, rope in cases:
        hf_posext.patch(model, method, factor)
        close(logits(model), logits(build(model_type, rope)))
    hf_posext.patch(model, "yarn", S)
    assert (logits(model) - before).abs().max() > 1e-6, "the extension changed nothing"
    hf_posext.unpatch(model)
    assert torch.equal(logits(model), before)


@pytest.mark.parametrize("model_type", FOUND)
def test_nothing_leaks_into_an_unpatched_model(model_type):
    plain = plain_rope(model_type)
    other = build(model_type, plain)
    before = logits(other)
    hf_posext.patch(build(model_type, plain), "dynamic_yarn", S)
    assert torch.equal(logits(other), before)

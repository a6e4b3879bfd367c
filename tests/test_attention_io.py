"""Attention-level methods through save_pretrained / from_pretrained (AutoModelForCausalLM after
`import hf_posext`, and the hook), the config.json they write, and what a reader without
hf_posext gets."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import TRAINED, tiny_model
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.evaluation.shared.inputs import InputError, check_cells
from hf_posext.rope.compat import IS_V5, get_rope_parameters

pytestmark = pytest.mark.usefixtures("one_thread")


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("method,knobs", [("leaky_rerope", {"window": 16, "leak": 4.0}),
                                          ("self_extend", {"window": 16, "group_size": 4}),
                                          ("dual_chunk", {}), ("string", {"local_value": 5}),
                                          ("logn", {})])
def test_save_reload_round_trip(arch, tokens, tmp_path, method, knobs):
    # STRING reaches L + S − W = 64 + 21 − 5 = 80 tokens here (a 2x target is refused)
    s = 1.25 if method == "string" else 2.0
    model = hf_posext.patch(tiny_model(arch, attn_implementation="sdpa"), method, s, **knobs)
    expected = logits(model, tokens)
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["attn_implementation"] == "hf_posext"
    assert data["hf_posext_attention"]["method"] == method
    assert data["hf_posext_attention"]["trained_length"] == TRAINED
    assert data["max_position_embeddings"] == s * TRAINED
    auto = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    if IS_V5:  # 5.x reads config.json's attn_implementation; 4.57 drops it (see install.py)
        assert auto.config._attn_implementation == "hf_posext"
        torch.testing.assert_close(logits(auto, tokens), expected, rtol=0, atol=0)
    else:
        assert auto.config._attn_implementation == "sdpa" and auto.config.hf_posext_attention
    hooked = hf_posext.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(hooked, tokens), expected, rtol=0, atol=0)
    # saved again from the reloaded model: still the method; re-patching knows L
    hooked.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again["attn_implementation"] == "hf_posext"
    assert hf_posext.trained_length(hooked) == TRAINED
    hf_posext.patch(hooked, "yarn", 2.0)
    assert hooked.config._attn_implementation == "sdpa"
    assert hooked.config.max_position_embeddings == 2 * TRAINED


def test_from_pretrained_hook_with_attention_method(tmp_path, tokens):
    tiny_model("llama", attn_implementation="sdpa").save_pretrained(tmp_path)
    model = hf_posext.from_pretrained(tmp_path, method="rerope", factor=2.0, window=16).eval()
    ref = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "rerope", 2.0, window=16)
    torch.testing.assert_close(logits(model, tokens), logits(ref, tokens), rtol=0, atol=0)
    with pytest.raises(ValueError, match="exceeds the trained length"):
        hf_posext.from_pretrained(tmp_path, method="rerope", window=4 * TRAINED)


@pytest.mark.slow
def test_reader_without_hf_posext(tmp_path):
    hf_posext.patch(tiny_model("llama"), "rerope", 2.0, window=16).save_pretrained(tmp_path)
    script = textwrap.dedent(f"""
        import sys
        from transformers import AutoModelForCausalLM
        try:
            AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})
            print("LOADED")
        except ValueError as err:
            print("REFUSED", "hf_posext" in str(err))
        m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, attn_implementation="sdpa")
        assert "hf_posext" not in sys.modules
        print("EXPLICIT", m.config._attn_implementation)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert ("REFUSED True" if IS_V5 else "LOADED") in out and "EXPLICIT sdpa" in out


def test_explicit_attn_implementation_wins(tmp_path, tokens):
    hf_posext.patch(tiny_model("llama"), "rerope", 2.0, window=16).save_pretrained(tmp_path)
    plain = hf_posext.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert plain.config._attn_implementation == "sdpa"
    torch.testing.assert_close(logits(plain, tokens), logits(tiny_model("llama"), tokens),
                               rtol=1e-5, atol=1e-5)


def test_auto_knob_round_trips_with_its_target(tmp_path, tokens):
    """The saved entry keeps leak="auto" and target_length, so a reload fits the same k."""
    model = tiny_model("llama", attn_implementation="sdpa")
    hf_posext.patch(model, "leaky_rerope", 2.5, window=24, leak="auto")
    with torch.no_grad():
        want = model(tokens).logits
    model.save_pretrained(tmp_path)
    entry = json.loads((tmp_path / "config.json").read_text())["hf_posext_attention"]
    assert entry["leak"] == "auto" and entry["target_length"] == round(2.5 * TRAINED)
    again = hf_posext.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(tokens).logits, want, rtol=1e-6, atol=1e-6)


def test_register_refuses_a_name_someone_else_holds():
    """The registry is read through the public Mapping API of AttentionInterface (no private
    attribute): another function under "hf_posext" is refused, ours again is a no-op."""
    from transformers import AttentionInterface

    from hf_posext.attention.interface import IMPLEMENTATION, hf_posext_attention, register
    register()
    assert AttentionInterface().get(IMPLEMENTATION) is hf_posext_attention
    AttentionInterface.register(IMPLEMENTATION, lambda *a, **k: None)
    try:
        with pytest.raises(RuntimeError, match="already registered by someone else"):
            register()
    finally:
        AttentionInterface.register(IMPLEMENTATION, hf_posext_attention)
    register()


def test_logn_alone_keeps_a_saved_extension(tokens, tmp_path):
    """A checkpoint saved extended (YaRN s = 3) asked for `logn` alone: log-n keeps the rope it is
    given, so the patch is the saved YaRN with log-n on top, equal to the base model patched with
    YaRN + log-n (a patch starts from plain RoPE: this once ran the checkpoint on plain RoPE, found
    on a 4x fine-tuned checkpoint whose answers turned to noise). A factor past the saved one is
    refused before any change; the CLI's cell check (before weights load) accepts the cells the saved
    extension covers (its own length and shorter) and refuses a longer one."""
    base = tiny_model("llama", attn_implementation="sdpa")
    reference = logits(hf_posext.patch(base, "yarn", 3.0, logn=True), tokens)
    plain_logn = logits(hf_posext.patch(base, "logn", 3.0), tokens)
    hf_posext.unpatch(base)
    hf_posext.patch(base, "yarn", 3.0).save_pretrained(tmp_path)
    saved = hf_posext.from_pretrained(tmp_path, attn_implementation="sdpa")
    with pytest.raises(ValueError, match=r"saved 'yarn' at factor 3, short of 4\. .*patch\(model, 'yarn', 4, logn=True\)"):
        hf_posext.patch(saved, "logn", 4.0)
    assert not hf_posext.is_patched(saved)
    check_cells(saved.config, ["logn"], [2 * TRAINED, 3 * TRAINED], ["auto"], {})
    with pytest.raises(InputError, match="short of 4"):
        check_cells(saved.config, ["logn"], [4 * TRAINED], ["auto"], {})
    got = logits(hf_posext.patch(saved, "logn"), tokens)
    torch.testing.assert_close(got, reference)
    assert (got - plain_logn).abs().max() > 1e-3   # not plain RoPE under the log-n
    assert saved.config.max_position_embeddings == 3 * TRAINED
    assert get_rope_parameters(saved.config)["rope_type"] == "yarn"
    hf_posext.unpatch(saved)
    torch.testing.assert_close(logits(hf_posext.patch(saved, "logn", 3.0), tokens), reference)

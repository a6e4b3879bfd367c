"""Dynamic methods without call history: a forward's output depends on its own
input only, whatever lengths the module saw before; and the fine-tuned dynamic YaRN mode."""

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import TRAINED, tiny_model
from test_methods import ref_ramp_by_parts
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.rope import dynamic, methods
from hf_posext.rope.compat import get_rope_parameters

pytestmark = pytest.mark.usefixtures("one_thread")

DYNAMIC = [("dynamic_ntk", {}), ("dynamic_yarn", {}), ("dynamic_yarn", {"finetuned": True})]
LENGTHS = (TRAINED // 2, 3 * TRAINED // 2, 4 * TRAINED, 5 * TRAINED)  # short, mid, long, longer


def logits(model, n):
    tokens = (torch.arange(n)[None] * 7) % 128
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("method,knobs", DYNAMIC)
def test_output_does_not_depend_on_earlier_lengths(arch, method, knobs):
    model = hf_posext.patch(tiny_model(arch), method, 2.0, **knobs)
    fresh = {n: logits(hf_posext.patch(tiny_model(arch), method, 2.0, **knobs), n) for n in LENGTHS}
    for order in (LENGTHS[::-1], (5 * TRAINED, TRAINED // 2, 4 * TRAINED, 3 * TRAINED // 2)):
        for n in order:  # longest first: transformers' cache would keep its frequencies/scale
            torch.testing.assert_close(logits(model, n), fresh[n], rtol=0, atol=0)


def test_the_issue_case_attention_scale_is_reset_with_the_frequencies():
    """transformers' reset restores inv_freq only: dynamic_yarn kept 0.1·ln(s)+1 after a long
    forward. Through hf_posext a short forward gets plain RoPE, scale 1."""
    model = hf_posext.patch(tiny_model("llama"), "dynamic_yarn", 4.0)
    rotary = model.model.rotary_emb
    logits(model, 3 * TRAINED)
    assert rotary.attention_scaling == pytest.approx(0.1 * math.log(3.0) + 1)
    logits(model, TRAINED // 2)
    assert rotary.attention_scaling == 1.0
    torch.testing.assert_close(rotary.inv_freq, methods.default_inv_freq(16, 10_000.0), rtol=0, atol=0)
    logits(model, 2 * TRAINED)  # between L and the longest seen: its own length, not 3·L
    expected, scale = methods.dynamic_yarn(16, 10_000.0, TRAINED, 2 * TRAINED)
    torch.testing.assert_close(rotary.inv_freq, expected, rtol=0, atol=0)
    assert rotary.attention_scaling == pytest.approx(scale)


def _history_check_script(path, extra_import):
    """Run in a fresh process: reload with AutoModelForCausalLM, compare a mid-length forward
    after a long one with the same forward on a fresh reload. Prints 'same' or 'differs'."""
    return extra_import + textwrap.dedent(f"""
        import torch
        from transformers import AutoModelForCausalLM
        def run(model, n):
            with torch.no_grad():
                return model((torch.arange(n)[None] * 7) % 128).logits
        load = lambda: AutoModelForCausalLM.from_pretrained({str(path)!r}, attn_implementation="eager").eval()
        ref = run(load(), {3 * TRAINED // 2})
        model = load()
        run(model, {4 * TRAINED})
        print("same" if torch.equal(run(model, {3 * TRAINED // 2}), ref) else "differs")
    """)


@pytest.mark.parametrize("method,with_hf_posext,expected", [
    ("dynamic_yarn", True, "same"),  # our rope type: the rope init function adds the hook
    ("dynamic_ntk", True, "differs"),  # transformers' own `dynamic`: its cached behaviour stays
    ("dynamic_ntk", False, "differs"),
])
@pytest.mark.slow
def test_where_transformers_cached_behaviour_remains(tmp_path, method, with_hf_posext, expected):
    """docs/dynamic.md: after a plain AutoModelForCausalLM reload, `dynamic_yarn` is history-free
    (hf_posext imported), transformers' `dynamic` keeps transformers' cache. Through
    hf_posext.from_pretrained (or patch) both are history-free."""
    hf_posext.patch(tiny_model("llama"), method, 4.0).save_pretrained(tmp_path)
    script = _history_check_script(tmp_path, "import hf_posext\n" if with_hf_posext else "")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == expected
    model = hf_posext.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ref = logits(hf_posext.from_pretrained(tmp_path, attn_implementation="eager").eval(), 3 * TRAINED // 2)
    logits(model, 4 * TRAINED)
    torch.testing.assert_close(logits(model, 3 * TRAINED // 2), ref, rtol=0, atol=0)


def test_hook_is_per_module_and_not_global():
    patched = hf_posext.patch(tiny_model("llama"), "dynamic_yarn", 4.0)
    other = tiny_model("llama")
    static = hf_posext.patch(tiny_model("llama"), "yarn", 4.0)
    assert dynamic.is_history_free(patched.model.rotary_emb)
    assert not dynamic.is_history_free(other.model.rotary_emb)
    assert not dynamic.is_history_free(static.model.rotary_emb)
    assert not other.model.rotary_emb._forward_pre_hooks
    hf_posext.unpatch(patched)
    assert not dynamic.is_history_free(patched.model.rotary_emb)


# ---- fine-tuned dynamic YaRN --------------------------------------------------------------

class ReferenceDynamicYarn:
    """The YaRN reference code's `LlamaDynamicYaRNScaledRotaryEmbedding` (jquesnelle/yarn,
    scaled_rope/), re-derived in float64: with finetuned=True it builds YaRN at
    max_position_embeddings / original_max_position_embeddings and, for a forward longer than
    its cache (max_position_embeddings), rebuilds at seq_len / original. Without finetuned it
    starts from plain RoPE, mscale 1. One fresh instance per length (no history)."""

    def __init__(self, d, b, max_pos, original, finetuned):
        self.d, self.b, self.original, self.cached = d, b, original, max_pos
        self.scale = max_pos / original if finetuned else 1.0

    def forward(self, seq_len):
        scale = seq_len / self.original if seq_len > self.cached else self.scale
        inv = ref_ramp_by_parts(self.d, self.b, scale, self.original, 32.0, 1.0)
        mscale = 1.0 if scale <= 1 else 0.1 * math.log(scale) + 1.0
        return inv, mscale


@pytest.mark.parametrize("s_ft", [1.0, 2.0, 4.0, 16.0])
@pytest.mark.parametrize("seq_len", [1, 100, 4096, 4097, 8192, 8193, 16384, 20000, 65536, 100_000])
def test_finetuned_dynamic_yarn_against_the_reference_code(s_ft, seq_len):
    d, b, L = 64, 10_000.0, 4096
    ref = ReferenceDynamicYarn(d, b, round(s_ft * L), L, finetuned=s_ft > 1)
    ref_inv, ref_mscale = ref.forward(seq_len)
    inv, scale = methods.dynamic_yarn(d, b, L, seq_len, finetuned_factor=s_ft)
    np.testing.assert_allclose(inv.double().numpy(), ref_inv, rtol=2e-6, atol=0)
    assert scale == pytest.approx(ref_mscale, rel=1e-12)
    assert methods.dynamic_yarn_scale(L, seq_len, s_ft) == pytest.approx(max(s_ft, seq_len / L))


def test_finetuned_mode_is_static_yarn_up_to_s_L_and_dynamic_beyond(arch):
    """Against transformers' own `yarn` (static): up to s·L it is yarn at s; at 5·L > 4·L it is
    yarn at 5."""
    model = hf_posext.patch(tiny_model(arch), "dynamic_yarn", 4.0, finetuned=True)
    assert model.config.max_position_embeddings == 4 * TRAINED
    assert get_rope_parameters(model.config)["finetuned"] is True
    assert hf_posext.trained_length(model) == TRAINED
    static4 = hf_posext.patch(tiny_model(arch), "yarn", 4.0)
    static5 = hf_posext.patch(tiny_model(arch), "yarn", 5.0)
    for n in (TRAINED // 2, 2 * TRAINED, 4 * TRAINED):
        torch.testing.assert_close(logits(model, n), logits(static4, n), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits(model, 5 * TRAINED), logits(static5, 5 * TRAINED),
                               rtol=1e-5, atol=1e-5)


def test_finetuned_mode_saves_and_reloads(tmp_path):
    model = hf_posext.patch(tiny_model("llama"), "dynamic_yarn", 4.0, finetuned=True)
    expected = {n: logits(model, n) for n in (2 * TRAINED, 5 * TRAINED)}
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert get_rope_parameters(reloaded.config)["finetuned"] is True
    assert dynamic.is_history_free(reloaded.model.rotary_emb)
    for n in (5 * TRAINED, 2 * TRAINED):
        torch.testing.assert_close(logits(reloaded, n), expected[n], rtol=0, atol=0)
    spec = hf_posext.RopeExtensionConfig.from_rope_dict(get_rope_parameters(reloaded.config))
    assert spec.finetuned and spec.factor == 4.0


def test_fixed_scale_overrides_the_hook_and_restores():
    model = hf_posext.patch(tiny_model("llama"), "dynamic_yarn", 4.0, finetuned=True)
    rotary = model.model.rotary_emb
    with hf_posext.fixed_rope_scale(model, 6 * TRAINED):
        logits(model, 10)  # a short forward must not reset the held frequencies
        expected, scale = methods.dynamic_yarn(16, 10_000.0, TRAINED, 6 * TRAINED, finetuned_factor=4.0)
        torch.testing.assert_close(rotary.inv_freq, expected)
        assert rotary.attention_scaling == pytest.approx(scale)
    logits(model, 10)  # after the block: static s = 4 again for a length <= 4·L
    assert rotary.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1)


def test_rope_init_contract_passes_no_module_so_the_constructor_frame_is_read():
    """Why dynamic.hook_module_under_construction reads the caller's frame: transformers' rope
    init functions receive (config, device, seq_len[, layer_type]), never the rotary module. If
    a version passes the module, this fails: then take it from the arguments instead."""
    import inspect

    from transformers import modeling_rope_utils
    params = set(inspect.signature(modeling_rope_utils.ROPE_INIT_FUNCTIONS["yarn"]).parameters)
    assert params <= {"config", "device", "seq_len", "layer_type"}, params


def test_construction_hook_binds_only_the_module_built_with_that_config():
    """The module found is the one whose `config` *is* the config the init fn got: a call with
    another config object (or outside any constructor) hooks nothing."""
    patched = hf_posext.patch(tiny_model("llama"), "dynamic_yarn", 4.0)
    config = patched.config
    init_fn = __import__("transformers").modeling_rope_utils.ROPE_INIT_FUNCTIONS["dynamic_yarn"]

    class Rotary(torch.nn.Module):
        def __init__(self, own, passed):
            super().__init__()
            self.config, self.rope_type = own, "dynamic_yarn"
            init_fn(passed)

    assert dynamic.is_history_free(Rotary(config, config))
    assert not dynamic.is_history_free(Rotary(config, type(config).from_dict(config.to_dict())))
    assert dynamic.hook_module_under_construction(config) is False      # not in a constructor

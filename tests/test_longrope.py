"""Every static rope-only method as transformers' own `longrope` config (hf_posext/rope/longrope.py),
and Phi-3, whose config accepts nothing else, extended in that form.

The references are transformers' types: a model built by transformers from the longrope dict
(no hf_posext involved in its rope) must give the method's logits, below and above L (where
transformers switches from short_factor to long_factor), in 4.57 and 5.x; Phi-3's frequencies are
held against the papers' formulas (tests/test_methods.py), and its saved checkpoints are reloaded
by plain transformers in a fresh process.
"""

import copy
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import TRAINED, VOCAB, tiny_model
from test_methods import ref_default, ref_ramp_by_parts

import hf_posext
from hf_posext.rope.compat import IS_V5, get_rope_parameters
from hf_posext.rope.longrope import longrope_form
from hf_posext.rope.registry import rotary_modules

pytestmark = pytest.mark.usefixtures("one_thread")

L, BASE, D = TRAINED, 10_000.0, 16  # tiny models: head_dim 16
STATIC = [("linear", {}), ("ntk", {}), ("ntk_by_parts", {}), ("yarn", {}),
          ("yarn", {"beta_fast": 128, "beta_slow": 2, "mscale_coefficient": 0.07})]  # Mistral settings
REPO = Path(__file__).resolve().parents[1]


def _ids(n):
    return (torch.arange(n)[None] * 7) % VOCAB


def _logits(model, n):
    with torch.no_grad():
        return model(_ids(n)).logits


def _transformers_longrope(arch, rope):
    """The tiny model with `rope` set the way each transformers version takes a rope config."""
    if IS_V5:
        return tiny_model(arch, head_dim=D, rope_parameters=rope)
    # 4.57's Mistral config keeps head_dim None unless given, and its rope functions need it
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return tiny_model(arch, head_dim=D, rope_scaling=scaling, rope_theta=rope["rope_theta"])


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("method,knobs", STATIC, ids=["linear", "ntk", "ntk_by_parts", "yarn", "yarn_mistral"])
def test_longrope_form_runs_the_method_in_transformers(arch, method, knobs):
    spec = hf_posext.RopeExtensionConfig(method, 4.0, L, **knobs)
    rope = longrope_form(spec, D, BASE)
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == rope["long_factor"]
    assert len(rope["short_factor"]) == D // 2
    theirs = _transformers_longrope(arch, rope)   # same seed: same weights
    ours = hf_posext.patch(tiny_model(arch, head_dim=D), method, 4.0, **knobs)
    for n in (L // 2, 3 * L):  # short_factor below L, long_factor above
        torch.testing.assert_close(_logits(theirs, n), _logits(ours, n), rtol=1e-5, atol=1e-5)
    assert (_logits(theirs, 3 * L) - _logits(tiny_model(arch), 3 * L)).abs().max() > 1e-3


def test_longrope_factors_are_the_frequency_ratios():
    """f_i = inv_freq_i / inv_freq'_i: s for linear, s^(2i/(d-2)) for NTK, the ramp for YaRN."""
    i = np.arange(D // 2)
    lin = longrope_form(hf_posext.RopeExtensionConfig("linear", 4.0, L), D, BASE)
    np.testing.assert_allclose(lin["short_factor"], 4.0, rtol=1e-6)
    assert lin["attention_factor"] == 1.0
    ntk = longrope_form(hf_posext.RopeExtensionConfig("ntk", 4.0, L), D, BASE)
    np.testing.assert_allclose(ntk["short_factor"], 4.0 ** (2 * i / (D - 2)), rtol=1e-6)
    yarn = longrope_form(hf_posext.RopeExtensionConfig("yarn", 4.0, L), D, BASE)
    np.testing.assert_allclose(yarn["short_factor"],
                               ref_default(D, BASE) / ref_ramp_by_parts(D, BASE, 4.0, L, 32.0, 1.0), rtol=1e-6)
    assert yarn["attention_factor"] == pytest.approx(0.1 * math.log(4.0) + 1)


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_dynamic_methods_have_no_longrope_form(method):
    with pytest.raises(ValueError, match="has no longrope form: its frequencies follow the current length"):
        longrope_form(hf_posext.RopeExtensionConfig(method, 4.0, L), D, BASE)


# --- Phi-3 -------------------------------------------------------------------------------------

def phi3(seed=0):
    config = transformers.Phi3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                     max_position_embeddings=L, original_max_position_embeddings=L,
                                     rope_theta=BASE, attn_implementation="eager", pad_token_id=0)
    torch.manual_seed(seed)
    return transformers.Phi3ForCausalLM(config).eval()


def _frequencies(model):
    (_, _, module), = rotary_modules(model)
    return module.inv_freq.double().numpy(), module.attention_scaling


def _longrope_refused_here(method):
    return not IS_V5 and method != "ntk"


@pytest.mark.parametrize("method", ["linear", "ntk", "ntk_by_parts", "yarn"])
def test_phi3_frequencies_against_the_formulas(method):
    if _longrope_refused_here(method):
        pytest.skip("transformers 4.57 refuses Phi-3's longrope form (test_phi3_on_transformers_4)")
    model = hf_posext.patch(phi3(), method, 4.0)
    rope = get_rope_parameters(model.config)
    assert rope["rope_type"] == ("default" if method == "ntk" else "longrope")
    expected = {"linear": ref_default(D, BASE) / 4.0,
                "ntk": ref_default(D, BASE * 4.0 ** (D / (D - 2))),
                "ntk_by_parts": ref_ramp_by_parts(D, BASE, 4.0, L, 32.0, 1.0),
                "yarn": ref_ramp_by_parts(D, BASE, 4.0, L, 32.0, 1.0)}[method]
    inv, scale = _frequencies(model)
    np.testing.assert_allclose(inv, expected, rtol=2e-6)
    assert scale == pytest.approx(0.1 * math.log(4.0) + 1 if method == "yarn" else 1.0)
    # at a length past L transformers picks long_factor: the same set, so the same logits
    with torch.no_grad():
        model(_ids(3 * L))
    np.testing.assert_allclose(_frequencies(model)[0], expected, rtol=2e-6)


def test_phi3_patch_unpatch():
    model = phi3()
    config_before, before = copy.deepcopy(model.config.to_dict()), _logits(model, 3 * L)
    method = "yarn" if IS_V5 else "ntk"
    hf_posext.patch(model, method, 4.0)
    assert (_logits(model, 3 * L) - before).abs().max() > 1e-4
    assert hf_posext.trained_length(model) == L and model.config.max_position_embeddings == 4 * L
    hf_posext.unpatch(model)
    assert model.config.to_dict() == config_before
    assert torch.equal(_logits(model, 3 * L), before)


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_phi3_dynamic_methods_are_refused_with_the_reason(method):
    model = phi3()
    before = copy.deepcopy(model.config.to_dict())
    with pytest.raises(ValueError, match=f"'{method}' cannot extend model_type 'phi3': .*no longrope form"):
        hf_posext.patch(model, method, 4.0)
    assert model.config.to_dict() == before


@pytest.mark.skipif(IS_V5, reason="transformers 4.57 only")
def test_phi3_on_transformers_4_saves_only_ntk():
    with pytest.raises(ValueError, match="'yarn' cannot extend model_type 'phi3' here: transformers "
                                         "4.57's Phi3Config reloads a longrope config only as"):
        hf_posext.patch(phi3(), "yarn", 4.0)


LOAD_PLAIN = textwrap.dedent("""
    import json, sys, torch, transformers
    out = {}
    for path in sys.argv[2:]:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        ref = torch.load(path + "/expected.pt")
        with torch.no_grad():
            out[path] = (model(ref["ids"]).logits - ref["logits"]).abs().max().item()
    out["hf_posext_imported"] = "hf_posext" in sys.modules
    json.dump(out, open(sys.argv[1], "w"))
""")


def load_plain(python, paths, tmp_path) -> dict:
    """Reload checkpoints in a fresh process that never imports hf_posext; max |Δlogits| each."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("PYTHONPATH", None)
    report = tmp_path / "report.json"
    run = subprocess.run([str(python), "-c", LOAD_PLAIN, str(report), *map(str, paths)],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.slow
def test_phi3_checkpoints_reload_in_plain_transformers(tmp_path):
    paths = []
    for method in ("linear", "ntk", "ntk_by_parts", "yarn"):
        if _longrope_refused_here(method):
            continue
        model = hf_posext.patch(phi3(), method, 4.0)
        model.save_pretrained(tmp_path / method)
        torch.save({"ids": _ids(3 * L), "logits": _logits(model, 3 * L)}, tmp_path / method / "expected.pt")
        paths.append(tmp_path / method)
    report = load_plain(sys.executable, paths, tmp_path)
    assert report.pop("hf_posext_imported") is False
    assert len(report) == len(paths) and max(report.values()) <= 1e-5, report

"""CoPE, clipped RoPE (arXiv 2602.05258): its frequencies against the formula written again here
from the authors' code (github hrlics/CoPE `modeling_cope.py`: a raised-cosine mask
½(1 + cos θ), θ = linspace(0, π, n), multiplying inv_freq of the n lowest-frequency components)
and the clip size of mlx-lm PR #1387 (every component whose period exceeds L); its saved
`longrope` form as plain transformers runs it; check / export / serve on that form."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.rope import methods
from conftest import TRAINED, tiny_model
from hf_posext.portability.exporting import export
from hf_posext.portability.serving import command
from hf_posext.portability.verdicts import check, check_report, load_config
from hf_posext.rope.compat import IS_V5, get_rope_parameters
from hf_posext.rope.registry import compute

pytestmark = pytest.mark.usefixtures("one_thread")
D, BASE = 16, 10_000.0   # the tiny models' rotary dim and base


def ref_cope(d: int, b: float, L: float, hard: bool = False) -> np.ndarray:
    """CoPE's frequencies, float64: components whose period 2π·b^(2i/d) exceeds L are clipped;
    over those n (boundary first) the mask ½(1 + cos(π·j/(n−1))) multiplies the frequency;
    HardClip: 0 for all n."""
    inv = np.array([b ** (-2 * i / d) for i in range(d // 2)])
    clipped = [i for i in range(d // 2) if 2 * math.pi / inv[i] > L]
    n = len(clipped)
    for j, i in enumerate(clipped):
        inv[i] *= 0.0 if hard else 0.5 * (1 + math.cos(math.pi * j / (n - 1)))
    return inv


def rotary(model):
    return model.model.rotary_emb


def ids(n: int) -> torch.Tensor:
    return (torch.arange(n) * 7 % 100)[None]


def logits(model, n=3 * TRAINED):
    with torch.no_grad():
        return model(ids(n)).logits


def test_cope_is_a_method_with_its_knobs():
    assert "cope" in hf_posext.METHODS and "cope" in hf_posext.ROPE_METHODS
    spec = hf_posext.RopeExtensionConfig("cope", 2.0, 4096)
    assert spec.knobs == {"clip_period": 4096, "hard_clip": False}   # default boundary: L
    assert hf_posext.RopeExtensionConfig.from_dict(spec.to_dict()) == spec
    assert hf_posext.RopeExtensionConfig.from_rope_dict(spec.to_rope_dict(BASE)) == spec
    for bad in (0, -5, 2.5, "L"):
        with pytest.raises(ValueError, match="clip_period must be a positive integer"):
            hf_posext.RopeExtensionConfig("cope", 2.0, 4096, clip_period=bad)
    with pytest.raises(ValueError, match="'yarn' does not use 'clip_period'"):
        hf_posext.RopeExtensionConfig("yarn", 2.0, 4096, clip_period=100)


@pytest.mark.parametrize("d,b,L", [(16, 10_000.0, 64), (64, 100_000.0, 8192), (128, 500_000.0, 8192),
                                   (128, 10_000.0, 4096), (64, 10_000_000.0, 262_144)])
@pytest.mark.parametrize("hard", [False, True])
def test_frequencies_against_the_formula(d, b, L, hard):
    inv, scale = compute(hf_posext.RopeExtensionConfig("cope", 2.0, L, hard_clip=hard), d, b)
    np.testing.assert_allclose(inv.double().numpy(), ref_cope(d, b, L, hard), rtol=1e-6, atol=0)
    assert scale == 1.0 and inv[-1].item() == 0.0   # no temperature; the lowest frequency frozen


def test_clip_size_of_the_mlx_reference():
    """mlx-lm PR #1387's own test: rope_theta 10M, 64 rotary dims, native 262,144 clip 10 of 32;
    the boundary component keeps its frequency, so 9 change."""
    inv, _ = compute(hf_posext.RopeExtensionConfig("cope", 2.0, 262_144), 64, 10_000_000.0)
    plain = methods.default_inv_freq(64, 10_000_000.0)
    assert torch.equal(inv[:23], plain[:23]) and (inv[23:] < plain[23:]).all()


def test_patched_model_within_L_components_untouched_and_the_clip_boundary_knob():
    model = tiny_model("llama")
    plain = rotary(model).inv_freq.clone()
    hf_posext.patch(model, "cope", 2.0)
    inv = rotary(model).inv_freq        # what transformers' longrope builds from the saved form
    keep = [i for i in range(D // 2) if 2 * math.pi * BASE ** (2 * i / D) <= TRAINED]
    assert keep == [0, 1, 2]
    assert torch.equal(inv[: len(keep) + 1], plain[: len(keep) + 1])   # + the boundary (w = 1)
    ref = ref_cope(D, BASE, TRAINED)
    np.testing.assert_allclose(inv[:-1].double().numpy(), ref[:-1], rtol=1e-6, atol=0)
    assert 0 < inv[-1].item() <= plain[-1].item() * 1e-30   # the frozen one: units.FROZEN_FACTOR
    # cos/sin of the untouched components are bit for bit the unpatched ones at every position
    x = torch.zeros(1, 3 * TRAINED, 4)
    pos = torch.arange(3 * TRAINED)[None]
    cos, sin = rotary(model)(x, pos)
    hf_posext.unpatch(model)
    cos0, sin0 = rotary(model)(x, pos)
    cols = keep + [k + D // 2 for k in keep]
    assert torch.equal(cos[..., cols], cos0[..., cols]) and torch.equal(sin[..., cols], sin0[..., cols])
    # the boundary moved: clip_period 20 clips from component 1 on (period 19.9 is within)
    hf_posext.patch(model, "cope", 2.0, clip_period=20)
    np.testing.assert_allclose(rotary(model).inv_freq[:-1].double().numpy(), ref_cope(D, BASE, 20)[:-1],
                               rtol=1e-6)


def test_the_frozen_factor_against_an_exact_freeze():
    """The saved form writes the frozen component as factor 1e30 (JSON has no ∞): logits against
    the exact formula (frequency exactly 0) installed in the same model, past L."""
    model = hf_posext.patch(tiny_model("llama"), "cope", 4.0)
    saved_form = logits(model, 4 * TRAINED)
    exact, _ = compute(hf_posext.RopeExtensionConfig("cope", 4.0, TRAINED), D, BASE)
    assert exact[-1].item() == 0.0
    rotary(model).inv_freq.copy_(exact)
    rotary(model).original_inv_freq = exact.clone()
    # identical on transformers 5.x; 4.57's longrope path rounds its float32 cos/sin differently
    # (a 1e30 factor gives 1e-30-scale angles, not exact zeros): within float32 noise there
    gap = (logits(model, 4 * TRAINED) - saved_form).abs().max().item()
    assert gap == 0.0 if IS_V5 else gap < 1e-6, gap


def test_nothing_to_clip_is_an_error_and_leaves_the_model_alone():
    model = tiny_model("llama")
    before = logits(model)
    with pytest.raises(ValueError, match="cope clips nothing here: 1 of the 8 rotary components"):
        hf_posext.patch(model, "cope", 2.0, clip_period=10_000)
    assert torch.equal(logits(model), before) and not hf_posext.is_patched(model)


def test_save_and_reload_without_hf_posext_imports(tmp_path):
    """The saved form is transformers' longrope: plain `from_pretrained` (the type needs no
    registration) runs the same logits; the hf_posext entry reads back as CoPE."""
    model = hf_posext.patch(tiny_model("llama"), "cope", 2.0, hard_clip=True)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    rope = cfg["rope_parameters"]
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == rope["long_factor"]
    assert rope["short_factor"][:3] == [1.0, 1.0, 1.0] and rope["short_factor"][3:] == [1e30] * 5
    assert rope["attention_factor"] == 1.0
    assert cfg["hf_posext"]["method"] == "cope" and cfg["hf_posext"]["hard_clip"] is True
    again = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert torch.equal(logits(again), logits(model))
    assert hf_posext.trained_length(again) == TRAINED
    spec = hf_posext.portability.portable.method_spec(again.config)
    assert spec == hf_posext.RopeExtensionConfig("cope", 2.0, TRAINED, hard_clip=True)
    hf_posext.patch(again, "yarn", 2.0)     # re-patching replaces CoPE, from plain RoPE
    assert get_rope_parameters(again.config)["rope_type"] == "yarn"


def test_check_export_and_serve_treat_it_as_its_longrope(tmp_path):
    model = hf_posext.patch(tiny_model("llama"), "cope", 4.0)
    model.save_pretrained(tmp_path / "cope")
    said = check_report(tmp_path / "cope")
    assert "cope (factor 4.0) saved as transformers' own longrope" in said
    verdicts = {v.reader: v.status for v in check(tmp_path / "cope")}
    assert verdicts["transformers-5"] == verdicts["transformers-4"] == "exact"
    # vLLM ignores attention_factor in longrope: export writes the scale it reads (1.0 here)
    export(tmp_path / "cope", tmp_path / "vllm", "vllm")
    rope = load_config(tmp_path / "vllm")["rope_parameters"]
    assert rope["short_mscale"] == rope["long_mscale"] == 1.0
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "vllm", attn_implementation="eager").eval()
    assert torch.equal(logits(again), logits(model))
    with pytest.raises(ValueError, match="--target vllm"):
        export(tmp_path / "cope", tmp_path / "sglang", "sglang")
    serving = command(tmp_path / "cope", "vllm")
    assert serving.overrides["rope_parameters"]["short_mscale"] == 1.0
    assert serving.length == 4 * TRAINED


def test_serve_extends_a_base_checkpoint_with_cope(tmp_path):
    """`hf-posext serve BASE vllm --method cope --factor 4`: the longrope form patch would save,
    as vLLM reads it, and the length raised to 4·L."""
    tiny_model("llama").save_pretrained(tmp_path / "base")
    serving = command(tmp_path / "base", "vllm", method="cope", factor=4.0)
    want = hf_posext.patch(tiny_model("llama"), "cope", 4.0).config.rope_parameters
    rope = serving.overrides["rope_parameters"]
    assert rope["rope_type"] == "longrope" and rope["long_factor"] == want["long_factor"]
    assert rope["short_mscale"] == rope["long_mscale"] == 1.0
    assert serving.overrides["max_position_embeddings"] == serving.length == 4 * TRAINED
    with pytest.raises(ValueError, match="transformers' own"):
        command(tmp_path / "base", "sglang", method="cope", factor=4.0)

"""Frequencies and attention scales of every method against independent references: the papers'
formulas written again here in float64 numpy, and transformers' own `linear`, `dynamic`, `yarn`."""

import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posext
from hf_posext.rope import methods
from hf_posext.rope.registry import compute
from hf_posext.rope.compat import IS_V5

GRID = [(d, b, s) for d in (16, 64, 128) for b in (10_000.0, 100_000.0, 500_000.0) for s in (1.0, 2.0, 4.0, 16.0)]
L = 4096


def ref_default(d, b):
    return b ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # inv_freq_i = b^(-2i/d)


def ref_ramp_by_parts(d, b, s, L, beta_fast, beta_slow):
    """NTK-by-parts as docs/rope_methods.md describes the YaRN reference code, in float64."""
    inv = ref_default(d, b)
    if s == 1.0:
        return inv

    def dim_of(r):  # dimension at which a frequency makes r rotations over L
        return d * math.log(L / (2 * math.pi * r)) / (2 * math.log(b))

    low = max(math.floor(dim_of(beta_fast)), 0)
    high = min(math.ceil(dim_of(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return (inv / s) * (1 - extrapolation) + inv * extrapolation


def tf_config(d, b, rope: dict, max_pos):
    """A transformers config carrying a rope dict, in the installed version's layout."""
    cfg = LlamaConfig(hidden_size=d * 2, num_attention_heads=2, head_dim=d, num_hidden_layers=1,
                      intermediate_size=8, vocab_size=8, max_position_embeddings=max_pos)
    from hf_posext.rope.compat import set_rope_parameters
    set_rope_parameters(cfg, {"rope_theta": b, **rope})
    return cfg


def close(actual, expected, rtol=2e-6):
    np.testing.assert_allclose(actual.double().numpy(), expected, rtol=rtol, atol=0)


@pytest.mark.parametrize("d,b,s", GRID)
def test_default_linear_ntk_against_formulas(d, b, s):
    close(methods.default_inv_freq(d, b), ref_default(d, b))
    inv, scale = methods.linear(d, b, s)
    close(inv, ref_default(d, b) / s)  # PI: m/s <=> inv_freq/s
    assert scale == 1.0
    inv, scale = methods.ntk(d, b, s)
    close(inv, ref_default(d, b * s ** (d / (d - 2))))
    # the NTK exponent interpolates the lowest frequency by exactly s and keeps the highest
    assert inv[-1].item() == pytest.approx(ref_default(d, b)[-1] / s, rel=2e-6)
    assert inv[0].item() == 1.0


@pytest.mark.parametrize("d,b,s", GRID)
@pytest.mark.parametrize("seq_len", [None, L // 2, L, L + 1, 3 * L, 10 * L])
def test_dynamic_ntk_formula_and_transformers(d, b, s, seq_len):
    inv, _ = methods.dynamic_ntk(d, b, s, L, seq_len)
    if seq_len is None or seq_len <= L:
        expected = ref_default(d, b)
    else:
        expected = ref_default(d, b * ((s * seq_len / L) - (s - 1)) ** (d / (d - 2)))
    close(inv, expected)
    # transformers' `dynamic` reads L from max_position_embeddings
    cfg = tf_config(d, b, {"rope_type": "dynamic", "factor": s}, L)
    tf_inv, tf_scale = ROPE_INIT_FUNCTIONS["dynamic"](cfg, None, seq_len=seq_len)
    torch.testing.assert_close(inv, tf_inv, rtol=2e-6, atol=0)


@pytest.mark.parametrize("d,b,s", GRID)
@pytest.mark.parametrize("betas", [(32.0, 1.0), (128.0, 2.0), (16.0, 4.0)])
def test_ntk_by_parts_and_yarn_against_reference_and_transformers(d, b, s, betas):
    beta_fast, beta_slow = betas
    inv, scale = methods.ntk_by_parts(d, b, s, L, beta_fast, beta_slow)
    close(inv, ref_ramp_by_parts(d, b, s, L, beta_fast, beta_slow))
    assert scale == 1.0
    inv_y, scale_y = methods.yarn(d, b, s, L, beta_fast, beta_slow)
    torch.testing.assert_close(inv_y, inv, rtol=0, atol=0)
    assert scale_y == pytest.approx(1.0 if s == 1 else 0.1 * math.log(s) + 1.0, rel=1e-12)
    cfg = tf_config(d, b, {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L,
                           "beta_fast": beta_fast, "beta_slow": beta_slow}, int(L * s))
    tf_inv, tf_scale = ROPE_INIT_FUNCTIONS["yarn"](cfg, None)
    torch.testing.assert_close(inv_y, tf_inv, rtol=2e-6, atol=0)
    assert scale_y == pytest.approx(tf_scale, rel=1e-12)


@pytest.mark.parametrize("d,b,s", [g for g in GRID if g[2] > 1])
def test_by_parts_keeps_fast_and_interpolates_slow_frequencies(d, b, s):
    """YaRN §3.2 in terms of r = L/λ: r > beta_fast kept exactly, r < beta_slow divided by s."""
    inv, _ = methods.ntk_by_parts(d, b, s, L, 32.0, 1.0)
    base = ref_default(d, b)
    r = L * base / (2 * math.pi)  # rotations over the trained context
    np.testing.assert_allclose(inv.double().numpy()[r > 32], base[r > 32], rtol=2e-6)
    np.testing.assert_allclose(inv.double().numpy()[r < 1], base[r < 1] / s, rtol=2e-6)


def test_yarn_ramp_shape_and_bounds():
    ramp = methods.yarn_ramp(3, 7, 10)
    assert ramp.shape == (10,) and ramp.dtype == torch.float32
    assert ramp[:4].tolist() == [0, 0, 0, 0] and ramp[7:].tolist() == [1, 1, 1]
    assert ramp[5].item() == pytest.approx(0.5)
    collapsed = methods.yarn_ramp(4, 4, 8)  # low == high: the reference adds 0.001
    assert collapsed[3].item() == 0 and collapsed[5].item() == 1


def test_yarn_temperature_and_mistral_settings():
    assert methods.yarn_mscale(16.0) == pytest.approx(0.1 * math.log(16) + 1)
    assert methods.yarn_mscale(8.0, 0.07) == pytest.approx(0.07 * math.log(8) + 1)
    assert methods.yarn_mscale(1.0) == 1.0
    _, scale = methods.yarn(128, 1e6, 8.0, 32768, 128.0, 2.0, mscale_coefficient=0.07)
    assert scale == pytest.approx(0.07 * math.log(8) + 1)
    _, scale = methods.yarn(128, 1e6, 8.0, 32768, attention_factor=1.5)
    assert scale == 1.5


@pytest.mark.parametrize("seq_len", [None, 100, L, L + 1, 3 * L, 7 * L + 5])
def test_dynamic_yarn_is_yarn_at_current_scale(seq_len):
    d, b = 64, 100_000.0
    inv, scale = methods.dynamic_yarn(d, b, L, seq_len)
    s = 1.0 if seq_len is None else max(1.0, seq_len / L)
    close(inv, ref_ramp_by_parts(d, b, s, L, 32.0, 1.0))
    assert scale == pytest.approx(1.0 if s == 1 else 0.1 * math.log(s) + 1)


@pytest.mark.parametrize("method", hf_posext.ROPE_METHODS)
def test_every_method_is_identity_at_factor_one(method):
    spec = hf_posext.RopeExtensionConfig(method, 1.0, L)
    inv, scale = compute(spec, 64, 1e4, seq_len=L)
    assert torch.equal(inv, methods.default_inv_freq(64, 1e4)) and scale == 1.0


def test_compute_dispatch_matches_functions_and_float32():
    spec = hf_posext.RopeExtensionConfig("yarn", 8.0, 2048, beta_fast=64, beta_slow=2)
    inv, scale = compute(spec, 96, 5e5)
    ref_inv, ref_scale = methods.yarn(96, 5e5, 8.0, 2048, 64.0, 2.0)
    assert inv.dtype == torch.float32 and torch.equal(inv, ref_inv) and scale == ref_scale
    # the dynamic update passes seq_len as a 0-d tensor
    spec = hf_posext.RopeExtensionConfig("dynamic_yarn", 4.0, 2048)
    inv, _ = compute(spec, 96, 5e5, seq_len=torch.tensor(5000))
    torch.testing.assert_close(inv, methods.dynamic_yarn(96, 5e5, 2048, 5000)[0])


def test_native_rope_functions_are_not_replaced():
    from transformers import modeling_rope_utils as mru

    for name, fn in (("linear", "_compute_linear_scaling_rope_parameters"),
                     ("dynamic", "_compute_dynamic_ntk_parameters"), ("yarn", "_compute_yarn_parameters")):
        assert ROPE_INIT_FUNCTIONS[name] is getattr(mru, fn)
    for name in ("ntk", "ntk_by_parts", "dynamic_yarn"):
        assert name in ROPE_INIT_FUNCTIONS
    if IS_V5:
        from transformers.configuration_utils import PreTrainedConfig
        assert hasattr(PreTrainedConfig, "_validate_ntk_by_parts_rope_parameters")

"""YaRN's `truncate` and DeepSeek's `mscale` / `mscale_all_dim` as knobs of hf_posext's yarn (and
`truncate` of ntk_by_parts / dynamic_yarn), against transformers' own `_compute_yarn_parameters`
(ROPE_INIT_FUNCTIONS["yarn"]) on a config carrying the same keys; their checks; their saved form."""

import math

import pytest
import torch
from test_methods import tf_config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posext
from hf_posext import RopeExtensionConfig
from hf_posext.portability.portable import saved_rope
from hf_posext.rope.registry import compute

# The families found in transformers' own modules are a 5.x feature: on 4.57 hf_posext supports the
# eleven families tests/test_families.py covers (their rope classes predate the shared pattern there).
from hf_posext.rope.compat import IS_V5 as _IS_V5  # noqa: E402
if not _IS_V5:
    pytest.skip("families found from transformers' modules: transformers 5.x", allow_module_level=True)


L = 4096
CASES = [  # (d, base, s, knobs)
    (64, 150_000.0, 32.0, {"truncate": False}),           # gpt-oss
    (128, 10_000.0, 4.0, {"truncate": False, "beta_fast": 64.0, "beta_slow": 2.0}),
    (64, 10_000.0, 40.0, {"mscale": 1.0, "mscale_all_dim": 1.0}),   # DeepSeek-V3
    (64, 10_000.0, 40.0, {"mscale": 0.707, "mscale_all_dim": 0.707}),  # DeepSeek-V2-Lite
    (64, 10_000.0, 16.0, {"mscale": 0.707, "mscale_all_dim": 1.0}),
    (64, 10_000.0, 16.0, {"mscale_all_dim": 1.0}),          # alone: the 0.1·ln s + 1 scale
    (96, 500_000.0, 8.0, {"truncate": False, "mscale": 1.0, "mscale_all_dim": 0.5}),
]


def transformers_yarn(d, b, s, keys):
    cfg = tf_config(d, b, {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L,
                           **keys}, int(L * s))
    return ROPE_INIT_FUNCTIONS["yarn"](cfg, None)


@pytest.mark.parametrize("d, b, s, knobs", CASES)
def test_yarn_knobs_match_transformers(d, b, s, knobs):
    spec = RopeExtensionConfig("yarn", s, L, **knobs)
    inv, scale = compute(spec, d, b)
    tf_inv, tf_scale = transformers_yarn(d, b, s, knobs)
    torch.testing.assert_close(inv, tf_inv, rtol=2e-6, atol=0)
    assert scale == pytest.approx(tf_scale, rel=1e-12)
    saved = saved_rope(spec, {"rope_type": "default", "rope_theta": b}, d)
    assert {k: saved[k] for k in knobs} == knobs   # written under transformers' keys


def test_truncate_moves_the_ramp():
    on, _ = compute(RopeExtensionConfig("yarn", 8.0, L), 64, 150_000.0)
    off, _ = compute(RopeExtensionConfig("yarn", 8.0, L, truncate=False), 64, 150_000.0)
    assert not torch.equal(on, off)
    assert "truncate" not in RopeExtensionConfig("yarn", 8.0, L).to_rope_dict(1e4)  # absent: true
    assert RopeExtensionConfig("yarn", 8.0, L).knobs.get("truncate") is None   # unset: not shown


@pytest.mark.parametrize("d, b, s", [(64, 150_000.0, 8.0), (128, 10_000.0, 4.0)])
def test_ntk_by_parts_and_dynamic_yarn_take_truncate(d, b, s):
    parts, scale = compute(RopeExtensionConfig("ntk_by_parts", s, L, truncate=False), d, b)
    tf_inv, _ = transformers_yarn(d, b, s, {"truncate": False, "attention_factor": 1.0})
    torch.testing.assert_close(parts, tf_inv, rtol=2e-6, atol=0)
    assert scale == 1.0
    # dynamic YaRN at length s·L is YaRN at s (transformers' default temperature)
    dyn, dyn_scale = compute(RopeExtensionConfig("dynamic_yarn", s, L, truncate=False), d, b,
                             seq_len=int(s * L))
    tf_inv, tf_scale = transformers_yarn(d, b, s, {"truncate": False})
    torch.testing.assert_close(dyn, tf_inv, rtol=2e-6, atol=0)
    assert dyn_scale == pytest.approx(tf_scale, rel=1e-12)


def test_deepseek_scale_is_the_ratio():
    _, scale = compute(RopeExtensionConfig("yarn", 40.0, L, mscale=0.707, mscale_all_dim=1.0), 64, 1e4)
    assert scale == pytest.approx((0.0707 * math.log(40) + 1) / (0.1 * math.log(40) + 1))


@pytest.mark.parametrize("knobs, message", [
    ({"mscale": 1.0}, "mscale needs mscale_all_dim"),
    ({"mscale": 1.0, "mscale_all_dim": 1.0, "attention_factor": 1.2}, "transformers ignores mscale"),
    ({"mscale_all_dim": 1.0, "mscale_coefficient": 0.07}, "two temperature rules"),
    ({"mscale": -1.0, "mscale_all_dim": 1.0}, "mscale must be >= 0"),
    ({"truncate": "no"}, "truncate must be True or False"),
])
def test_bad_knobs_are_refused(knobs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        RopeExtensionConfig("yarn", 4.0, L, **knobs)


def test_knobs_of_other_methods_are_refused():
    with pytest.raises(ValueError, match="'linear' does not use 'truncate'"):
        RopeExtensionConfig("linear", 4.0, L, truncate=False)
    with pytest.raises(ValueError, match="'dynamic_yarn' does not use 'mscale_all_dim'"):
        RopeExtensionConfig("dynamic_yarn", 4.0, L, mscale_all_dim=1.0)


def test_a_native_deepseek_rope_dict_reads_back():
    rope = {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 40.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": L}
    spec = RopeExtensionConfig.from_rope_dict(rope)
    assert (spec.mscale, spec.mscale_all_dim, spec.trained_length) == (1.0, 1.0, L)
    assert spec.to_rope_dict(10_000.0) == {**rope, "factor": 40.0}
    assert "mscale" in hf_posext.rope.config.KNOBS

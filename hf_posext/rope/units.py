"""One unit per rope method: everything hf_posext knows about a method, in one entry of `UNITS`.

A unit holds the method's math (a plain function of `methods.py`, called with the config's
knobs), its knobs (`knobs.Knob` specs: type, default, check, help; a knob shared by several
methods is declared once here), its check of the knobs together, the rope type its logical config uses, whether that type
is one hf_posext registers with transformers, the form it is *saved* in (the most portable exact
one, docs/portability.md), and the base it runs at when it extends by raising the base. Every
table of the package is derived from `UNITS`: `RopeExtensionConfig`'s validation and rope dicts,
`registry`'s rope-init functions and registered types, `portable.saved_rope`, the engine forms
of `export` (which read the saved form, not method names), the CLI's `--methods` choices and the
knob lists of `loading`, `patcher` and `evaluation.shared.inputs`, the CLI's `--knobs` help and the docs'
knob tables (`catalog.knob_table`). transformers' own `llama3` and `longrope` are units too, without
math of ours (`compute=None`: passed through, their required knobs named by the patcher, their
TRAINED_LENGTH's check and the unit's `check_rotary` applied by it). Adding a
method, with new knobs, is one entry here (tests/test_units.py adds a toy method and its knob by
editing only this file).

Function arguments: `c` the validated `RopeExtensionConfig`, `d` the rotary dim, `b` the base
(rope_theta), `n` the current length (None: the table is built without one), `dev` the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from . import methods
from .knobs import NATIVE_TRAINED_KEY, REQUIRED, TRAINED_LENGTH, Knob, flag, number, positive, switch, tokens

# YaRN paper defaults for Llama (§3.2): alpha = beta_slow = 1, beta = beta_fast = 32; mscale
# coefficient 0.1 (eq. 22). The YaRN authors' Mistral runs used 128, 2 and 0.07.
BETA_FAST = positive("beta_fast", "YaRN's upper ramp bound in rotations over L (Mistral runs: 128)", 32.0)
BETA_SLOW = positive("beta_slow", "YaRN's lower ramp bound in rotations over L (Mistral runs: 2)", 1.0)
MSCALE = positive("mscale_coefficient", "YaRN temperature mscale = c·ln(s) + 1 (Mistral runs: 0.07)", 0.1)
ATTENTION_FACTOR = positive("attention_factor", "yarn: a fixed cos/sin scale replacing the mscale "
                            "formula; longrope: transformers' own", None)
FINETUNED = flag("finetuned", "dynamic_yarn: the YaRN reference code's fine-tuned mode (static YaRN "
                 "at factor up to factor·L, dynamic beyond)")
# transformers' `yarn` keys beyond the paper's (modeling_rope_utils `_compute_yarn_parameters`),
# with transformers' meaning: `truncate` (gpt-oss saves false) floors/ceils the ramp's bounds;
# DeepSeek's `mscale` / `mscale_all_dim` set the cos/sin scale to get_mscale(s, mscale) /
# get_mscale(s, mscale_all_dim) when both are set, and DeepSeek-family attention multiplies its
# softmax scale by get_mscale(s, mscale_all_dim)² (`DeepseekV3Attention`, `yarn_apply_mscale`).
# default None: transformers' default (true), written nowhere, so configs and reports of methods
# that do not set it stay as they were
TRUNCATE = Knob("truncate", bool, None, lambda v, L: switch("truncate", v),
                "YaRN ramp: floor/ceil its correction range (transformers' `truncate`, true when "
                "unset; gpt-oss: false)")


def _mscale_check(name: str) -> Callable[[Any, int | None], Any]:
    # 0 is transformers' "not set" (it tests the keys' truth), so it is accepted as such
    return lambda v, L: number(name, v, minimum=0.0)


DS_MSCALE = Knob("mscale", float, None, _mscale_check("mscale"),
                 "yarn: DeepSeek's m, cos/sin scale get_mscale(s, m)/get_mscale(s, mscale_all_dim) "
                 "(needs mscale_all_dim)")
DS_MSCALE_ALL_DIM = Knob("mscale_all_dim", float, None, _mscale_check("mscale_all_dim"),
                         "yarn: DeepSeek's mscale_all_dim; DeepSeek-family attention also scales "
                         "its softmax by get_mscale(s, mscale_all_dim)²")
_RAMP = (BETA_FAST, BETA_SLOW, TRUNCATE)


def _given(name: str, kind: type, help: str,
           check: Callable[[Any, int | None], Any] = lambda v, L: v) -> Knob:
    """A knob of transformers' own llama3 / longrope: required (the patcher names it when it is
    missing), checked by `check` where hf_posext checks it and then by transformers itself."""
    return Knob(name, kind, REQUIRED, check, help)


def _positive_factors(name: str) -> Callable[[Any, int | None], Any]:
    """longrope's factor list: each factor finite and > 0 (its length needs the rotary dim:
    `_longrope_lengths` checks it first)."""
    def check(values: Any, L: int | None) -> Any:
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))
               or not math.isfinite(v) or v <= 0]
        if bad:
            raise ValueError(f"longrope {name} must hold finite numbers > 0, got {bad[0]!r}.")
        return values
    return check


@dataclass(frozen=True)
class RopeMethod:
    """A rope method. `rope_keys(c)`: the method's keys of its logical rope dict beyond
    rope_type / rope_theta / factor (what `from_rope_dict` reads back). `saved(c, theta, d)`:
    the rope dict written into config.json when it differs from the logical one (None: the
    logical one is saved). `raised_base(c, theta, d, T)`: the base it runs at length T, for
    methods that extend by raising the base (config_audit's decay bound)."""

    name: str
    rope_type: str
    compute: Callable[..., methods.Freqs] | None   # None: transformers' own math (llama3, longrope)
    knobs: tuple[Knob, ...] = ()
    check: Callable[[Any], None] | None = None      # the validated config -> raise (knobs together)
    # transformers' own types: (their rope dict, rotary dim) -> raise (checks needing the head dim)
    check_rotary: Callable[[dict[str, Any], int], None] | None = None
    rope_keys: Callable[[Any], dict[str, Any]] = lambda c: {}
    dynamic: bool = False
    registered: bool = False
    needs_trained_length: bool = True
    trained_length_from: Callable[[int, float], int] = lambda max_pos, s: max_pos
    saved: Callable[[Any, float, int], dict[str, Any]] | None = None
    raised_base: Callable[[Any, float, int, int], float] | None = None
    # saved as its exact `longrope` form (rope/longrope.py), the form engines read
    saved_as_longrope: bool = False
    # its longrope factors f_i in closed form, (c, d, b) -> [d/2] (None: f_i = inv_freq_i / inv'_i
    # from its frequencies, `longrope.factors_of`)
    longrope_factors: Callable[[Any, int, float], list[float]] | None = None


def _ramp_check(c) -> None:
    if c.beta_fast <= c.beta_slow:
        raise ValueError(f"beta_fast must be greater than beta_slow (rotations over the trained "
                         f"length: fast > slow), got beta_fast={c.beta_fast}, "
                         f"beta_slow={c.beta_slow}. The paper's Llama values are 32 and 1.")


def _yarn_check(c) -> None:
    """DeepSeek's keys as transformers reads them: `mscale` only in the ratio with
    `mscale_all_dim`, neither when `attention_factor` is given; never with a second temperature
    rule (mscale_coefficient)."""
    _ramp_check(c)
    if c.mscale and not c.mscale_all_dim:
        raise ValueError("mscale needs mscale_all_dim: transformers' yarn uses mscale only in the "
                         "ratio get_mscale(s, mscale) / get_mscale(s, mscale_all_dim) and ignores it "
                         "alone. Pass both (DeepSeek-V3: 1.0 and 1.0).")
    if c.mscale and c.attention_factor is not None:
        raise ValueError("mscale and attention_factor both set the cos/sin scale, and transformers "
                         "ignores mscale when attention_factor is given; pass one.")
    if (c.mscale or c.mscale_all_dim) and c.mscale_coefficient != MSCALE.default:
        raise ValueError("mscale / mscale_all_dim (DeepSeek's temperature) and mscale_coefficient "
                         "(YaRN's 0.1·ln s + 1 with another coefficient) are two temperature rules; "
                         "pass one.")


def _ramp_keys(c) -> dict[str, Any]:
    return {NATIVE_TRAINED_KEY: c.trained_length,
            "beta_fast": c.beta_fast, "beta_slow": c.beta_slow,
            **({"truncate": False} if c.truncate is False else {})}   # absent means true


def _yarn_keys(c) -> dict[str, Any]:
    keys = _ramp_keys(c)
    keys.update({k: float(getattr(c, k)) for k in ("mscale", "mscale_all_dim")
                 if getattr(c, k) is not None})
    # transformers' yarn knows no mscale coefficient: write the resulting cos/sin scale
    # explicitly unless it is transformers' own default (0.1·ln s + 1).
    if c.attention_factor is not None:
        keys["attention_factor"] = float(c.attention_factor)
    elif c.mscale_coefficient != MSCALE.default:
        keys["attention_factor"] = float(methods.yarn_mscale(c.factor, c.mscale_coefficient))
    return keys


def _dynamic_yarn_keys(c) -> dict[str, Any]:
    return {**_ramp_keys(c), "mscale_coefficient": c.mscale_coefficient,
            **({"finetuned": True} if c.finetuned else {})}


LINEAR = RopeMethod(
    "linear", "linear",
    compute=lambda c, d, b, n, dev: methods.linear(d, b, c.factor, dev),
    needs_trained_length=False,
    # the patcher raised max_position_embeddings to s·L
    trained_length_from=lambda max_pos, s: round(max_pos / s))

NTK = RopeMethod(
    "ntk", "ntk", registered=True,
    compute=lambda c, d, b, n, dev: methods.ntk(d, b, c.factor, dev),
    rope_keys=lambda c: ({NATIVE_TRAINED_KEY: c.trained_length} if c.trained_length is not None else {}),
    needs_trained_length=False,
    # NTK-aware is plain RoPE on the raised base (methods.ntk computes exactly this)
    saved=lambda c, theta, d: {"rope_type": "default", "rope_theta": methods.ntk_base(d, theta, c.factor)},
    raised_base=lambda c, theta, d, T: methods.ntk_base(d, theta, c.factor))

DYNAMIC_NTK = RopeMethod(
    # transformers' `dynamic` reads L from config.max_position_embeddings, which the patcher
    # therefore leaves at the trained length
    "dynamic_ntk", "dynamic", dynamic=True,
    compute=lambda c, d, b, n, dev: methods.dynamic_ntk(
        d, b, c.factor, c.trained_length, n, dev),
    raised_base=lambda c, theta, d, T: methods.dynamic_ntk_base(
        d, theta, c.factor, c.trained_length, T))

NTK_BY_PARTS = RopeMethod(
    "ntk_by_parts", "ntk_by_parts", registered=True, knobs=_RAMP, check=_ramp_check,
    compute=lambda c, d, b, n, dev: methods.ntk_by_parts(
        d, b, c.factor, c.trained_length, c.beta_fast, c.beta_slow, dev, c.truncate is not False),
    rope_keys=_ramp_keys,
    # transformers' yarn (truncate=True: floor/ceil of the correction range, as
    # methods.correction_range) with the temperature fixed to 1 is NTK-by-parts
    saved=lambda c, theta, d: {"rope_type": "yarn", "rope_theta": theta, "factor": c.factor,
                               **_ramp_keys(c), "attention_factor": 1.0})

YARN = RopeMethod(
    "yarn", "yarn",
    knobs=(*_RAMP, MSCALE, ATTENTION_FACTOR, DS_MSCALE, DS_MSCALE_ALL_DIM), check=_yarn_check,
    compute=lambda c, d, b, n, dev: methods.yarn(
        d, b, c.factor, c.trained_length, c.beta_fast, c.beta_slow,
        c.mscale_coefficient, c.attention_factor, dev, c.truncate is not False, c.mscale, c.mscale_all_dim),
    rope_keys=_yarn_keys)

DYNAMIC_YARN = RopeMethod(
    "dynamic_yarn", "dynamic_yarn", dynamic=True, registered=True,
    knobs=(*_RAMP, MSCALE, FINETUNED), check=_ramp_check,
    compute=lambda c, d, b, n, dev: methods.dynamic_yarn(
        d, b, c.trained_length, n, c.beta_fast, c.beta_slow,
        c.mscale_coefficient, c.factor if c.finetuned else 1.0, dev, c.truncate is not False),
    rope_keys=_dynamic_yarn_keys)

# transformers' own types, passed through untouched (no math of ours): their knobs are required
# (transformers has no default for them; its validators would raise deep inside `patch`, the
# patcher names them first), `factor` and L (TRAINED_LENGTH: the input trained_length, written
# into their rope dict under transformers' key NATIVE_TRAINED_KEY by the patcher) optional.
LLAMA3 = RopeMethod("llama3", "llama3", compute=None, knobs=(
    _given("low_freq_factor", float, "llama3: wavelengths above L/low_freq_factor are interpolated (Llama 3.1: 1.0)"),
    _given("high_freq_factor", float, "llama3: wavelengths below L/high_freq_factor are kept (Llama 3.1: 4.0)"),
    TRAINED_LENGTH))
_LONGROPE_FACTORS = (
    _given("short_factor", list, "longrope: one rescale factor per rotary frequency, up to L",
           _positive_factors("short_factor")),
    _given("long_factor", list, "longrope: one rescale factor per rotary frequency, beyond L",
           _positive_factors("long_factor")))


def _longrope_lengths(rope: dict[str, Any], dim: int) -> None:
    """transformers' longrope divides the inverse frequencies (dim/2 of them, dim = head_dim ×
    partial_rotary_factor: compat.rotary_dim, as modeling_rope_utils `_compute_longrope_parameters`)
    by short_factor / long_factor elementwise: another length ends in a raw broadcast error. Each
    list of the right length then gets its knob's own check."""
    for knob in _LONGROPE_FACTORS:
        values = rope.get(knob.name)
        if not isinstance(values, (list, tuple)) or len(values) != dim // 2:
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else repr(values)
            raise ValueError(f"longrope {knob.name} must be a list of {dim // 2} numbers (one per "
                             f"rotary frequency: rotary dim {dim} / 2), got {got}.")
        knob.check(values, rope.get(NATIVE_TRAINED_KEY))


LONGROPE = RopeMethod("longrope", "longrope", compute=None, check_rotary=_longrope_lengths,
                      knobs=(*_LONGROPE_FACTORS, ATTENTION_FACTOR, TRAINED_LENGTH))

# CoPE (arXiv 2602.05258; methods.cope_weights names the code it follows): a taper w_i on the
# frequencies of the components whose period exceeds the clip boundary, nothing else.
CLIP_PERIOD = Knob("clip_period", int, lambda L: L, lambda v, L: tokens("clip_period", v),
                   "cope: components whose period 2π/θ_i exceeds this many tokens are clipped "
                   "(default: the trained length L)")
HARD_CLIP = flag("hard_clip", "cope: freeze every clipped component instead of the Hann taper "
                 "(the paper's HardClip ablation)")
# A frozen component (w_i = 0) is f_i = 1/w_i = ∞ in longrope, which JSON cannot write (Python
# writes `Infinity`, which strict readers refuse; config_audit calls it an error). Written as
# this finite factor instead: transformers' float32 1/(f·b^(2i/d)) <= 1e-30, so the component
# turns at most 2^31·1e-30 ≈ 2e-21 rad by any int32 position (cos rounds to exactly 1 in float32;
# tests/test_cope.py measures the logits against the exact freeze), and f·b^(2i/d) stays finite
# in float32 for any base below 3e8 (above, it overflows to ∞ and the frequency is exactly 0).
FROZEN_FACTOR = 1e30


def _cope_factors(c, d: int, b: float) -> list[float]:
    """CoPE's longrope factors: f_i = 1/w_i, exactly 1.0 for the components it leaves alone (so
    transformers' 1/(1.0·b^(2i/d)) is the default frequency bit for bit), FROZEN_FACTOR for w = 0."""
    if c.factor == 1.0:
        return [1.0] * (d // 2)
    weights = methods.cope_weights(d, b, c.clip_period, c.hard_clip).tolist()
    return [1.0 / w if w > 0 else FROZEN_FACTOR for w in weights]


COPE = RopeMethod(
    "cope", "cope", registered=True, knobs=(CLIP_PERIOD, HARD_CLIP), saved_as_longrope=True,
    compute=lambda c, d, b, n, dev: methods.cope(d, b, c.factor, c.clip_period, c.hard_clip, dev),
    rope_keys=lambda c: {NATIVE_TRAINED_KEY: c.trained_length,
                         "clip_period": c.clip_period, "hard_clip": c.hard_clip},
    longrope_factors=_cope_factors)

ALL_UNITS: dict[str, RopeMethod] = {u.name: u for u in (LINEAR, NTK, DYNAMIC_NTK, NTK_BY_PARTS, YARN,
                                                         DYNAMIC_YARN, COPE, LLAMA3, LONGROPE)}
# hf_posext's own methods (its math); the others are transformers' own, passed through.
UNITS: dict[str, RopeMethod] = {n: u for n, u in ALL_UNITS.items() if u.compute is not None}
PASSTHROUGH_UNITS: dict[str, RopeMethod] = {n: u for n, u in ALL_UNITS.items() if u.compute is None}
ROPE_METHODS: tuple[str, ...] = tuple(UNITS)
STATIC_METHODS: tuple[str, ...] = tuple(n for n, u in UNITS.items() if not u.dynamic)
# The rope types hf_posext adds to transformers (the others are transformers' own).
REGISTERED_ROPE_TYPES: tuple[str, ...] = tuple(u.rope_type for u in UNITS.values() if u.registered)

"""What each reader of a checkpoint computes from its config.json: re-derived from the reader's
own source, without installing it (docs/portability.md, "Readers", names each file and version).

Every reader is a function `config dict -> Reading`: `Reading.freqs(seq_len)` gives the
`(inv_freq, attention_scale)` the reader runs at that length (float64, shape [d/2]; the scale
multiplies cos and sin), or the reader refuses (raises at load) / is not meant for this type.
`hf_posext.check` compares these with what the checkpoint means (`hf_posext.rope.methods`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..rope.compat import head_size

Freqs = Callable[[int | None], tuple[torch.Tensor, float]]


@dataclass(frozen=True)
class Reading:
    """A reader's interpretation of one config: `freqs`, or `refused` with the reason; `broken`
    says why the reader crashes or computes NaN past some length although it loads."""
    freqs: Freqs | None = None
    refused: str | None = None
    note: str = ""
    broken: str | None = None


class NotApplicable(Exception):
    """The rope type is transformers' own (llama3, longrope): not an hf_posext method to check."""


# ---- the formulas every reader shares (each names where it differs) -----------------------

def plain(d: int, base: float) -> torch.Tensor:
    """RoPE: inv_freq_i = b^(-2i/d)."""
    return 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)


def yarn_inv_freq(d: int, base: float, s: float, L: int, beta_fast: float, beta_slow: float,
                  truncate: bool = True, ext: float = 1.0) -> torch.Tensor:
    """NTK-by-parts frequencies as the YaRN reference code, transformers, vLLM, SGLang, TGI and
    ggml write them: correction dims floor/ceil'd (unless truncate is off), clamped to [0, d-1],
    a linear ramp over pair index, mixed with weight `ext` (extrapolation_factor)."""
    def dim_of(rot: float) -> float:
        return d * math.log(L / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
    keep = (1 - ramp) * ext
    extrap = plain(d, base)
    return extrap / s * (1 - keep) + extrap * keep


def mscale(s: float, coefficient: float = 1.0) -> float:
    """YaRN's get_mscale as transformers, vLLM, SGLang and TGI write it: 0.1·m·ln s + 1 (s > 1)."""
    return 1.0 if s <= 1 else 0.1 * coefficient * math.log(s) + 1.0


def dynamic_ntk_freqs(d: int, base: float, s: float, L: int) -> Freqs:
    """transformers' `dynamic` (and TGI's): b·((s·l/L) − (s−1))^(d/(d−2)) at l = max(l, L)."""
    def freqs(seq_len):
        l = L if seq_len is None else max(seq_len, L)
        return plain(d, base * ((s * l / L) - (s - 1)) ** (d / (d - 2))), 1.0
    return freqs


def static(inv_freq: torch.Tensor, scale: float = 1.0) -> Freqs:
    return lambda seq_len: (inv_freq, scale)


# ---- reading a config.json --------------------------------------------------------------------

def read_rotary_dim(cfg: dict[str, Any], rope: dict[str, Any]) -> int:
    """head_dim × partial_rotary_factor: from the reader's rope dict, else the top-level key,
    else 5.x's rope dict. The last is for readers of the 4.x layout (transformers 4.57, TGI)
    on a config 5.x saved, where the factor lives in `rope_parameters` only: they take their
    config class's default, which is the family's own factor (PhiConfig 0.5, StableLmConfig
    0.25), the value 5.x wrote there unless it was changed."""
    head = head_size(cfg.get("head_dim"), cfg.get("hidden_size"), cfg.get("num_attention_heads"))
    nested = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    nested = nested.get("full_attention", nested) if isinstance(nested.get("full_attention"), dict) \
        else nested
    return int(head * (rope.get("partial_rotary_factor") or cfg.get("partial_rotary_factor")
                       or nested.get("partial_rotary_factor") or 1.0))


def _read_rope(rope: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """What a 5.x-style reader does with the dict it picked: the global entry of a per-layer-type
    dict (Gemma 3), rope_theta from the dict else the top-level key, the old `type` key renamed."""
    if isinstance(rope.get("full_attention"), dict):  # per-layer-type (Gemma 3): the global one
        rope = dict(rope["full_attention"])
    rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rope.setdefault("rope_type", rope.pop("type", "default"))
    return rope


def v5_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope dict transformers 5.x builds from config.json (`convert_rope_params_to_dict`,
    configuration_utils/modeling_rope_utils 5.23): `rope_scaling` wins over `rope_parameters`;
    rope_theta from the dict, else the top-level key, else 10000."""
    return _read_rope(dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}), cfg)


def converter_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's converter (conversion/base.py `TextModel.__init__`, llama-cpp-python 0.3.36's
    vendored llama.cpp): `hparams.get("rope_parameters", hparams.get("rope_scaling"))`, i.e.
    `rope_parameters` first, the opposite of transformers 5.x; rope_theta from the dict, else
    the top-level key."""
    return _read_rope(dict(cfg.get("rope_parameters", cfg.get("rope_scaling")) or {}), cfg)


def v4_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """transformers 4.57: `rope_scaling` + top-level `rope_theta` only; `rope_parameters` unread."""
    rope = dict(cfg.get("rope_scaling") or {"rope_type": "default"})
    rope["rope_theta"] = cfg.get("rope_theta", 10000.0)
    rope.setdefault("rope_type", rope.pop("type", "default"))
    return rope


def transformers_reading(rope: dict[str, Any], d: int, max_pos: int) -> Reading:
    """transformers' ROPE_INIT_FUNCTIONS (modeling_rope_utils.py, 5.23 and 4.57.6 identical for
    these types but for yarn's L: 5.x requires original_max_position_embeddings (its
    standardisation fills in max_position_embeddings), 4.57 falls back to it)."""
    kind, base = rope["rope_type"], float(rope["rope_theta"])
    if kind == "default":
        return Reading(static(plain(d, base)))
    if kind == "linear":
        return Reading(static(plain(d, base) / rope["factor"]))
    if kind == "dynamic":
        return Reading(dynamic_ntk_freqs(d, base, rope["factor"], max_pos))
    if kind == "yarn":
        s, L = rope["factor"], rope.get("original_max_position_embeddings") or max_pos
        scale = rope.get("attention_factor")
        if scale is None:
            m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
            scale = mscale(s, m) / mscale(s, m_all) if m and m_all else mscale(s)
        freqs = yarn_inv_freq(d, base, s, L, rope.get("beta_fast") or 32, rope.get("beta_slow") or 1,
                              rope.get("truncate", True))
        return Reading(static(freqs, scale))
    if kind in ("llama3", "longrope"):
        raise NotApplicable(kind)
    return Reading(refused=f"KeyError {kind!r}: not a transformers rope type (hf_posext's own: "
                           "loads only after `import hf_posext`)")


def transformers_v5(cfg: dict[str, Any]) -> Reading:
    rope = v5_rope(cfg)
    return transformers_reading(rope, read_rotary_dim(cfg, rope), cfg["max_position_embeddings"])


def transformers_v4(cfg: dict[str, Any]) -> Reading:
    rope = v4_rope(cfg)
    return transformers_reading(rope, read_rotary_dim(cfg, rope), cfg["max_position_embeddings"])


def _vllm(cfg: dict[str, Any], current: bool) -> Reading:
    """vLLM `get_rope` (vllm/model_executor/layers/rotary_embedding/__init__.py) and its classes
    ntk_scaling_rope.py, dynamic_ntk_scaling_rope.py, yarn_scaling_rope.py, at two commits of
    main whose YaRN reading differs (docs/portability.md, "Readers"):
    07b12f1b passes yarn only extrapolation_factor, attn_factor, beta_fast, beta_slow, truncate,
    so `attention_factor` / `mscale` are not read and the scale is attn_factor × (0.1·ln s + 1);
    0cd5784 passes beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate and
    computes the scale as transformers does (attn_factor no longer read)."""
    rope = v5_rope(cfg)
    kind, base, d = rope["rope_type"], float(rope["rope_theta"]), read_rotary_dim(cfg, rope)
    max_pos = cfg["max_position_embeddings"]
    if kind == "default":
        return Reading(static(plain(d, base)))
    if kind == "linear":
        return Reading(static(plain(d, base) / rope["factor"]))
    if kind == "ntk":  # its own NTK: base·s, then every frequency divided by s^(2/d)
        s = rope["factor"]
        return Reading(static(plain(d, base * s) / s ** (2 / d)),
                       note="vLLM's own `ntk` formula, not static NTK-aware")
    if kind == "dynamic":
        if "factor" not in rope:
            return Reading(refused="ValueError: dynamic needs 'alpha' or 'factor'")
        s = rope["factor"]
        # one table, built at a fixed length: 07b12f1b at max_len = s·L with multiplier
        # (s·L/L) − (s−1) = 1; 0cd5784 at max_position with L = max_trained_positions
        # (default max_position), again multiplier 1 unless max_trained_positions is set
        trained = rope.get("max_trained_positions", max_pos) if current else max_pos
        built_at = max_pos if current else max_pos * s
        factor = (s * built_at / trained - (s - 1)) if current else 1.0
        # Measured (docs/portability.md, "Real engines"): vLLM 0.29.0 and 0.32.0 build this table
        # with max_position_embeddings rows but derive max_model_len = max_position_embeddings·s
        # (config/model.py `_get_and_verify_max_len`), so positions past it index out of range.
        broken = (f"its dynamic cos/sin table has max_position_embeddings = {max_pos} rows but it "
                  f"accepts {round(max_pos * s)} tokens: NaN logprobs past {max_pos} (eager), "
                  "index-out-of-bounds abort (compiled); measured on vLLM 0.29.0 and 0.32.0"
                  ) if s > 1 else None
        return Reading(static(plain(d, base * factor ** (d / (d - 2)))),
                       note="vLLM builds `dynamic` once, at a fixed length", broken=broken)
    if kind == "yarn":
        s = rope["factor"]
        if current:
            scale = rope.get("attention_factor")
            if scale is None:
                m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
                scale = mscale(s, m) / mscale(s, m_all) if m and m_all else mscale(s)
            ext = 1.0
        else:
            scale, ext = mscale(s) * rope.get("attn_factor", 1), rope.get("extrapolation_factor", 1)
        freqs = yarn_inv_freq(d, base, s, rope["original_max_position_embeddings"],
                              rope.get("beta_fast", 32), rope.get("beta_slow", 1),
                              rope.get("truncate", True), ext)
        return Reading(static(freqs, scale))
    if kind in ("llama3", "longrope"):
        raise NotApplicable(kind)
    return Reading(refused=f"ValueError: Unknown RoPE scaling type {kind}")


def vllm_older(cfg: dict[str, Any]) -> Reading:
    return _vllm(cfg, current=False)


def vllm_current(cfg: dict[str, Any]) -> Reading:
    return _vllm(cfg, current=True)


def sglang(cfg: dict[str, Any]) -> Reading:
    """SGLang `get_rope` (python/sglang/srt/layers/rotary_embedding/factory.py at commit
    108c36c0, yarn.py and rope_variant.py at 0b1fd02d, main): `dynamic` is built once at
    max_len = s·L with base·((s·max_len/L) − (s−1))^(d/(d−2)), a static NTK at s² − s + 1;
    yarn's scale is get_mscale(s, mscale)/get_mscale(s, mscale_all_dim) when both are given
    (else 0.1·ln s + 1), times attn_factor; `attention_factor` is not read."""
    rope = v5_rope(cfg)
    kind, base, d = rope["rope_type"], float(rope["rope_theta"]), read_rotary_dim(cfg, rope)
    if kind == "default":
        return Reading(static(plain(d, base)))
    if kind == "linear":
        return Reading(static(plain(d, base) / rope.get("factor", 1.0)))
    if kind == "dynamic":
        s = rope.get("factor", 1.0)
        return Reading(static(plain(d, base * (s * s - (s - 1)) ** (d / (d - 2)))),
                       note="SGLang builds `dynamic` once, as static NTK at s² − s + 1")
    if kind == "yarn":
        s = rope.get("factor", 1.0)
        m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
        scale = mscale(s, m) / mscale(s, m_all) if m is not None and m_all is not None else mscale(s)
        freqs = yarn_inv_freq(d, base, s, rope.get("original_max_position_embeddings",
                                                   cfg["max_position_embeddings"]),
                              rope.get("beta_fast", 32), rope.get("beta_slow", 1),
                              rope.get("truncate", True), rope.get("extrapolation_factor", 1))
        return Reading(static(freqs, scale * rope.get("attn_factor", 1)))
    if kind in ("llama3", "longrope"):
        raise NotApplicable(kind)
    return Reading(refused=f"ValueError: Unknown RoPE scaling type {kind}")


def tgi(cfg: dict[str, Any]) -> Reading:
    """TGI `PositionRotaryEmbedding.static` (server/text_generation_server/layers/rotary.py,
    main at commit 06663162; TGI reads config.rope_scaling + rope_theta, the 4.x layout):
    `linear` leaves scaling_factor None, so positions are not divided (plain RoPE); yarn fixes
    beta_fast=32, beta_slow=1, attn_factor=1 and takes the scale from mscale (1.0) /
    mscale_all_dim (0.0); `dynamic` recomputes transformers' formula at the sequence length."""
    rope = v4_rope(cfg)
    kind, base, d = rope["rope_type"], float(rope["rope_theta"]), read_rotary_dim(cfg, rope)
    if kind in ("default", "linear"):
        return Reading(static(plain(d, base)),
                       note="TGI's static() ignores linear's factor" if kind == "linear" else "")
    if kind == "dynamic":
        return Reading(dynamic_ntk_freqs(d, base, rope["factor"], cfg["max_position_embeddings"]))
    if kind == "yarn":
        s = rope["factor"]
        scale = mscale(s, rope.get("mscale", 1.0)) / mscale(s, rope.get("mscale_all_dim", 0.0))
        freqs = yarn_inv_freq(d, base, s, rope["original_max_position_embeddings"], 32, 1)
        return Reading(static(freqs, scale), note="TGI fixes beta_fast=32, beta_slow=1")
    if kind in ("llama3", "longrope"):
        raise NotApplicable(kind)
    return Reading(refused=f"NotImplementedError: rope scaling type {kind} is not implemented")


def llama_cpp(cfg: dict[str, Any]) -> Reading:
    """llama.cpp = its converter + its runtime (llama-cpp-python 0.3.36's vendored llama.cpp).
    Converter (conversion/base.py `TextModel.set_gguf_parameters`): reads `rope_parameters`
    first; writes LINEAR (factor) and YARN (factor, original context, and `attention_factor` /
    `attn_factor` as `rope.scaling.yarn_attn_factor`, betas as `yarn_beta_fast/slow`,
    `extrapolation_factor` as `yarn_ext_factor`); `dynamic` and unknown types become no scaling.
    Runtime (src/llama-model.cpp `load_hparams`): for Llama it reads `rope.scaling.attn_factor`
    only; the `yarn_*` keys are read for grok (betas also mistral3), so a converted Llama runs
    hparams' defaults: betas 32/1, ext factor 1, and the YaRN scale (llama-context.cpp: ggml's
    built-in 1 + 0.1·ln s, times `attn_factor`, absent = 1) is 0.1·ln s + 1 whatever the config
    says. Correction dims always floor/ceil'd. (`gguf_reading` is the runtime on a GGUF
    `hf_posext.export --target gguf` wrote, which does carry `attn_factor`.)"""
    rope = converter_rope(cfg)
    kind, base, d = rope["rope_type"], float(rope["rope_theta"]), read_rotary_dim(cfg, rope)
    s = rope.get("factor")
    if "PhiForCausalLM" in (cfg.get("architectures") or ()) and kind != "default":
        # conversion/phi.py `Phi2Model.set_gguf_parameters` writes its own keys and never calls
        # TextModel's, so no rope scaling reaches the GGUF (measured: YaRN runs as plain RoPE)
        return Reading(static(plain(d, base)), note=f"converted as plain RoPE (llama.cpp's Phi "
                       f"converter writes no rope scaling; {kind!r} is dropped)")
    if kind == "linear" and s is not None:
        return Reading(static(plain(d, base) / s))
    if kind == "yarn" and s is not None:
        return gguf_reading(d, base, s, rope["original_max_position_embeddings"])
    if kind in ("llama3", "longrope"):
        raise NotApplicable(kind)
    note = "" if kind == "default" else f"converted as plain RoPE ({kind!r} is not converted)"
    return Reading(static(plain(d, base)), note=note)


def gguf_reading(d: int, base: float, s: float, L: int, attn_factor: float = 1.0,
                 beta_fast: float = 32.0, beta_slow: float = 1.0) -> Reading:
    """llama.cpp's runtime on a Llama GGUF with rope.scaling.type yarn: `attn_factor` from the
    GGUF key `rope.scaling.attn_factor`, betas from the run-time flags (`--yarn-beta-fast/slow`;
    default 32/1), ext factor 1; scale (0.1·ln s + 1)·attn_factor."""
    freqs = yarn_inv_freq(d, base, s, L, beta_fast, beta_slow, True, 1.0)
    note = "" if (beta_fast, beta_slow, attn_factor) != (32.0, 1.0, 1.0) else \
        "llama.cpp's runtime reads yarn_attn_factor / yarn_beta_* only for grok, mistral3: runs betas 32/1, scale 0.1·ln s + 1"
    return Reading(static(freqs, mscale(s) * attn_factor), note=note)


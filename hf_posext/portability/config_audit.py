"""What `hf-posext check` reports about a config.json besides the per-reader verdicts
(docs/portability.md, "What check also reports").

- `problems(cfg)`: the config contradicts itself. Both rope layouts present and different
  (transformers 5.x, vLLM and SGLang read `rope_scaling` first; 4.x and TGI read only
  `rope_scaling` + `rope_theta`; llama.cpp's converter reads `rope_parameters` first, so the
  same file runs two different ropes), a `hf_posext` entry that no longer describes the rope a
  reader reads (edited by hand), non-finite numbers (JSON allows NaN / Infinity), a longrope
  config with two factor sets that transformers 4.x and 5.x switch between at different lengths.
- `warnings(cfg, meaning, folder)`: what users trip over. The context length each engine derives
  from the config and whether it is the extension's target s·L; a RoPE base too small for the
  target length (Men et al. 2024, "Base of RoPE Bounds Context Length", arXiv 2405.14591:
  base >= 0.0424·T^1.628); weights stored as pickles, or code a loader would run.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from . import engines, portable
from ..rope.units import UNITS

# reader -> how it reads the rope layouts (engines.v5_rope / v4_rope / converter_rope)
LAYOUTS = (("transformers 5.x, vLLM, SGLang (rope_scaling first)", engines.v5_rope),
            ("transformers 4.x, TGI (rope_scaling + rope_theta only)", engines.v4_rope),
            ("llama.cpp's converter (rope_parameters first)", engines.converter_rope))
# Each serving target (the `serve --engine` / `export --target` names) -> its printed name, the
# setting its context length is derived into, and the flag that sets it (vLLM `vllm serve`, SGLang
# `sglang.launch_server`, llama.cpp `llama-server` (its slot context defaults to the trained one),
# TGI's launcher; transformers enforces no length).
LENGTH_SETTING = {"transformers": ("transformers", "max_position_embeddings", None),
                  "vllm": ("vLLM", "max_model_len", "--max-model-len"),
                  "sglang": ("SGLang", "context_length", "--context-length"),
                  "llama.cpp": ("llama.cpp", "n_ctx_train", "-c"),
                  "tgi": ("TGI", None, "--max-total-tokens")}
MAX_LENGTH_FLAG = {target: flag for target, (_, _, flag) in LENGTH_SETTING.items() if flag}


def engine_name(target: str) -> str:
    return LENGTH_SETTING[target][0]


def length_label(target: str) -> str:
    """How a derived length is printed: "vLLM (max_model_len)"."""
    name, key, _ = LENGTH_SETTING[target]
    return f"{name} ({key})"


def serve_flags(length: int, targets=None) -> str:
    """ "vLLM --max-model-len 16384, SGLang --context-length 16384, ..." (every engine by default)."""
    return ", ".join(f"{engine_name(t)} {flag} {length}" for t, flag in MAX_LENGTH_FLAG.items()
                     if targets is None or t in targets)
# arXiv 2405.14591, eq. (the fitted lower bound of the base for a context length T)
BOUND_COEFFICIENT, BOUND_EXPONENT = 0.0424, 1.628


def describe_rope(rope: dict[str, Any]) -> str:
    keys = ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool)
                     else f"{k} {v}" for k, v in sorted(rope.items()) if k != "rope_type")
    return f"{rope.get('rope_type')} ({keys})"


def _non_finite(value: Any, path: str) -> list[str]:
    if isinstance(value, float) and not math.isfinite(value):
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, f"{path}.{k}")]
    return []


def problems(cfg: dict[str, Any]) -> list[str]:
    """One line per contradiction in the config (empty when it is consistent)."""
    out = []
    bad = [p for key in ("rope_parameters", "rope_scaling", "rope_theta", "max_position_embeddings",
                         portable.ENTRY, "hf_posext_attention") for p in _non_finite(cfg.get(key), key)]
    if bad:
        out.append(f"error: non-finite values in config.json: {', '.join(bad)} (NaN logits in "
                   "every reader that uses them); restore them from the checkpoint you saved")
    readings = {}
    for who, read in LAYOUTS:
        rope = {k: v for k, v in read(cfg).items() if k != "partial_rotary_factor"}
        readings.setdefault(repr(sorted(rope.items(), key=str)), (rope, []))[1].append(who)
    if len(readings) > 1:
        out.append("error: the rope layouts disagree, so readers run different ropes: "
                   + "; ".join(f"{' and '.join(who)} read {describe_rope(rope)}"
                               for rope, who in readings.values())
                   + ". Make rope_parameters and rope_scaling (+ rope_theta) say the same")
    if not bad:
        out += _longrope_switch(cfg)
    if isinstance(cfg.get(portable.ENTRY), dict) and not bad:
        for rope, who in readings.values():
            try:
                view = SimpleNamespace(**{portable.ENTRY: cfg[portable.ENTRY]},
                                       max_position_embeddings=cfg["max_position_embeddings"])
                portable.logical_rope(view, {**rope}, engines.read_rotary_dim(cfg, rope))
            except (ValueError, TypeError, KeyError) as err:
                out.append(f"error: for {' and '.join(who)}: {err}")
    return out


def two_factor_sets(cfg: dict[str, Any]) -> bool:
    """A longrope config whose short_factor and long_factor differ (transformers picks one by
    length; with one set the choice changes nothing)."""
    rope = engines.v5_rope(cfg)
    return rope.get("rope_type") == "longrope" and rope.get("short_factor") != rope.get("long_factor")


def _longrope_switch(cfg: dict[str, Any]) -> list[str]:
    """A longrope config with two factor sets: where each transformers major switches from
    `short_factor` to `long_factor` (modeling_rope_utils `longrope_frequency_update`). 5.x:
    above the top-level `original_max_position_embeddings` if there is one (its
    `standardize_rope_params` copies it into the dict), else the dict's; 4.57: above the
    top-level one, else above `max_position_embeddings`."""
    if not two_factor_sets(cfg):
        return []
    rope = engines.v5_rope(cfg)
    top, max_pos = cfg.get("original_max_position_embeddings"), cfg.get("max_position_embeddings")
    v5 = top or rope.get("original_max_position_embeddings") or max_pos
    v4 = top or max_pos
    if v4 == v5:
        return []
    return [f"error: longrope switches from short_factor to long_factor above {v5} tokens in "
            f"transformers 5.x (the rope dict's original_max_position_embeddings) but above {v4} "
            "in 4.x (max_position_embeddings: 4.x reads only a top-level "
            f"original_max_position_embeddings); add \"original_max_position_embeddings\": {v5} at "
            "the top level of config.json"]


def _two_sets_in_engines(cfg: dict[str, Any]) -> list[str]:
    """A longrope config with two factor sets: what the engines do with a prompt <= L."""
    if not two_factor_sets(cfg):
        return []
    return ["warning: two longrope factor sets: transformers runs short_factor for sequences up to "
            "L and long_factor beyond; vLLM 0.29 / 0.32 run long_factor at every position whenever "
            "max_model_len > L (measured: benchmarks/results/engine_short_factors.md), and llama.cpp, "
            "where its converter writes both sets (Phi-3), picks one from the context size "
            "(llama-model.cpp get_rope_factors), so a short prompt served there does not get "
            "short_factor; one set (hf-posext search --short-factors same) reads the same everywhere"]


def derived_lengths(cfg: dict[str, Any]) -> dict[str, int]:
    """The context length each engine derives from config.json (before any user override), keyed
    by serving target ("transformers", "vllm", "sglang", "llama.cpp"); `length_label` prints one."""
    M = cfg.get("max_position_embeddings")
    if not isinstance(M, (int, float)):
        return {}
    v5 = engines.v5_rope(cfg)
    factor = v5.get("factor") if isinstance(v5.get("factor"), (int, float)) else 1.0
    kind = v5["rope_type"]
    scaled = kind not in ("default", "su", "longrope", "llama3")
    # vLLM config/model.py `_get_and_verify_max_len`: the smallest length key, times the factor
    # (yarn: original_max_position_embeddings × factor); not for su/longrope/llama3.
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
            "model_max_length", "max_sequence_length", "max_seq_length", "seq_len")
    vllm = min(cfg[k] for k in keys if isinstance(cfg.get(k), (int, float)))
    # ... except for Gemma 3, whose max_position_embeddings is already the scaled length
    # (vllm/config/model.py: `if rope_scaling is not None and "gemma3" not in model_type`)
    if scaled and "gemma3" not in str(cfg.get("model_type", "")):
        vllm = (v5.get("original_max_position_embeddings") or vllm) * factor if kind == "yarn" \
            else vllm * factor
    # SGLang hf_transformers_utils.get_context_length: the first length key, times the factor
    # unless rope_scaling has original_max_position_embeddings or is llama3.
    first = next(cfg[k] for k in ("max_sequence_length", "seq_length", "max_seq_len",
                                  "model_max_length", "max_position_embeddings")
                 if isinstance(cfg.get(k), (int, float)))
    sglang = first * (factor if scaled and "original_max_position_embeddings" not in v5 else 1)
    # llama.cpp's converter writes context_length = max_position_embeddings (n_ctx_train); the
    # runtime's default n_ctx (0) is n_ctx_train.
    return {"transformers": int(M), "vllm": int(vllm), "sglang": int(sglang), "llama.cpp": int(M)}


def base_bound(target_length: int) -> float:
    """The smallest base that keeps retrieval at `target_length` (arXiv 2405.14591)."""
    return BOUND_COEFFICIENT * target_length ** BOUND_EXPONENT


def warnings(cfg: dict[str, Any], target, folder: Path | None = None) -> list[str]:
    """Warnings for a consistent config; `target` is verdicts.Meaning (None: unknown)."""
    out = []
    spec = getattr(target, "spec", None)
    if spec is not None:
        L = spec.trained_length or cfg["max_position_embeddings"]
        T = round(L * spec.factor)
    else:
        attention = getattr(target, "attention", None) or {}
        L = attention.get("trained_length")
        T = cfg.get("max_position_embeddings") if L else None
    out += _two_sets_in_engines(cfg)
    lengths = derived_lengths(cfg)
    if T and lengths:
        # transformers enforces no length: only the engines' limits can be "not the target"
        off = {k: v for k, v in lengths.items() if v != T and k != "transformers"}
        short = [engine_name(k) for k, v in off.items() if v < T]
        long = [engine_name(k) for k, v in off.items() if v > T]
        said = ([f"{', '.join(short)} stop{'s' if len(short) == 1 else ''} at the derived "
                 "length unless told"] if short else []) \
            + ([f"{', '.join(long)} accept{'s' if len(long) == 1 else ''} prompts past the target"]
               if long else [])
        out.append(f"context length: the extension targets {T} tokens (s·L); engines derive "
                   + ", ".join(f"{length_label(k)} {v}" for k, v in lengths.items())
                   + (f" — not the target in {', '.join(engine_name(k) for k in off)} "
                      f"({'; '.join(said)})" if off else "")
                   + f". Serve {T} with " + serve_flags(T)
                   + " (hf-posext serve PATH --engine E prints the whole command)")
    if T and target is not None:
        base = _effective_base(cfg, target, T)
        if base is not None and base < base_bound(T):
            reach = (base / BOUND_COEFFICIENT) ** (1 / BOUND_EXPONENT)
            out.append(f"warning: RoPE base {base:.4g} is below 0.0424·T^1.628 = {base_bound(T):.3g} "
                       f"for T = {T} (\"Base of RoPE Bounds Context Length\", arXiv 2405.14591): "
                       f"retrieval may fail past ~{reach:.0f} tokens even where perplexity looks "
                       "fine")
    if folder is not None:
        out += _unsafe_files(cfg, folder)
    return out


def _effective_base(cfg: dict[str, Any], target, T: int) -> float | None:
    """The base the rope runs at T, for the methods that extend by changing the base (NTK: the
    raised base; dynamic NTK: its base at T). The bound comes from the long-range decay of
    Σ cos(m·θ_i) up to m = T; interpolating methods (linear, ntk_by_parts, yarn, dynamic_yarn)
    divide the low frequencies by s, which maps m <= T back into the trained range, and
    attention-level methods keep relative positions trained: no base to compare (None)."""
    spec, theta, d = target.spec, target.theta, target.dim
    unit = UNITS[spec.method] if spec is not None else None
    if unit is None or unit.raised_base is None:
        return None
    if spec.trained_length is None:
        spec = dataclasses.replace(spec, trained_length=cfg["max_position_embeddings"])
    return unit.raised_base(spec, theta, d, T)


def _unsafe_files(cfg: dict[str, Any], folder: Path) -> list[str]:
    """check and export never unpickle weights nor import code from a checkpoint; say where a
    loader would."""
    out = []
    pickles = sorted(p.name for p in folder.iterdir()
                     if p.suffix in (".bin", ".pt", ".pth", ".pkl", ".ckpt"))
    if pickles:
        out.append(f"warning: {', '.join(pickles[:3])}{' …' if len(pickles) > 3 else ''} are "
                   "pickles: loading them runs any code stored in them (torch.load without "
                   "weights_only); hf_posext did not open them. Prefer safetensors")
    if cfg.get("auto_map"):
        out.append("warning: config.json has auto_map: loading it with trust_remote_code=True "
                   "runs the checkpoint's own Python code; hf_posext did not import it")
    return out

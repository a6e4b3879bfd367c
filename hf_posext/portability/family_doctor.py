"""The doctor's family findings (docs/check.md, "Doctor"): engine bugs in the rope of the families
people extend now, found in a config.json. Each finding names one reader (and the releases it
means), how far off that reader is — re-derived with engines.py's formulas from the reader's
source; where the release boundary is not modelled here the `off` text says so — and the fix.

- per-layer rope (Gemma 3, OLMo 3: the long-context rope entry belongs to the full-attention layers):
  `sliding-scaled`, `per-layer-flat`, `sliding-releases` (vllm #29111; sglang #21537;
  transformers #41934, #45945 for OLMo 3);
- DeepSeek-style YaRN on MLA (deepseek_v2/v3, kimi_k2): `mla-yarn-scale` (attention_factor
  dropped: vllm #48351, #46280; sglang #22711; llama.cpp #17945 `yarn_log_multiplier`);
- gpt-oss's `truncate: false`: `truncate-releases` (transformers #42189, vllm #28244,
  sglang #14270; the readers modelled here that still round, TGI and llama.cpp, are doctor.py's
  `yarn-frequencies`);
- partial rotary: `longrope-factors` (lists not rotary_dim / 2 long; apache/tvm #18102);
- NoPE layers (SmolLM3, Llama 4): `nope-layers` (llama.cpp's fixed every-4th-layer step)."""

from __future__ import annotations

import json
import math
from typing import Any

from . import engines, readers
from .finding import Finding, _g, _label, _num
from .readers import LLAMACPP, SGLANG, TRANSFORMERS_5, VLLM_07B12F1, VLLM_0CD5784
from .meaning import TOLERANCE
from ..rope.compat import head_size

# architectures whose engines run their own YaRN code (DeepSeek's MLA applies mscale_all_dim to
# the softmax scale: vLLM deepseek_yarn, SGLang DeepseekScalingRotaryEmbedding, llama.cpp
# deepseek2): doctor.py's Llama-family scale model does not describe them, _mla below does
OWN_YARN = ("deepseek_v2", "deepseek_v3", "kimi_k2")
# rope_parameters keyed by layer type, rope_scaling into full_attention only (transformers 5.24
# configuration_gemma3.py / configuration_olmo3.py `convert_rope_params_to_dict`; 4.57's
# modeling runs the sliding layers unscaled too). EXAONE 4 and Cohere 2 are not among them:
# their rope runs on the sliding layers only (modeling_exaone4.py, modeling_cohere2.py: the
# full-attention layers are NoPE), so their one rope entry is meant for the sliding layers.
PER_LAYER = {"gemma3": "Gemma 3", "gemma3_text": "Gemma 3", "olmo3": "OLMo 3"}
# the releases, before a fix, that scaled the sliding layers too when the config's rope entry is not
# keyed by layer type (OLMo 3 in transformers: one Olmo3Config dict for every layer; vLLM's
# olmo3.py then takes rope_parameters.get(layer type, the whole dict))
SLIDING_RELEASES = {
    "Gemma 3": (("vLLM", "#29111", ""), ("SGLang", "#21537", "; SGLang's fix took gemma-3-4b from 54 % to 72 %")),
    "OLMo 3": (("transformers 5", "#41934, #45945", ""), ("vLLM", "#29111", "")),
}
# where each reader learned gpt-oss's `truncate` (before: floor/ceil of the correction range)
TRUNCATE_FIXES = (("transformers", "#42189"), ("vLLM", "#28244"), ("SGLang", "#14270"))
# SmolLM3 / Llama 4: llama.cpp skips rope on layer il when (il + 1) % 4 == 0, a constant
# (`n_no_rope_layer_step = 4`, src/llama-model.cpp; no GGUF key carries the config's list)
NOPE = {"smollm3": "SmolLM3", "llama4_text": "Llama 4", "llama4": "Llama 4"}
LLAMA_CPP_NOPE_STEP = 4
UNMODELLED = "re-derived; the exact release boundary is not modelled here"


def _scaled(rope: Any) -> bool:
    return isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) != "default"


def _keyed(rope: Any) -> bool:
    return isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict)


def _describe(rope: dict[str, Any]) -> str:
    kind = rope.get("rope_type", rope.get("type"))
    return f"{kind} factor {_g(rope['factor'])}" if _num(rope.get("factor")) else str(kind)


def _sliding_theta(cfg: dict[str, Any], entry: Any = None) -> float:
    """θ of the sliding layers: their entry's, else Gemma 3's rope_local_base_freq (transformers'
    default 10000, configuration_gemma3.py `default_theta["local"]`), else OLMo 3's one θ."""
    if isinstance(entry, dict) and _num(entry.get("rope_theta")):
        return float(entry["rope_theta"])
    if str(cfg.get("model_type")).startswith("gemma3"):
        return float(cfg.get("rope_local_base_freq", 10000.0))
    return float(engines.v5_rope(cfg)["rope_theta"])


def _sliding_off(cfg: dict[str, Any], rope: dict[str, Any], theta: float) -> str:
    """What the sliding-window layers run with `rope` at θ `theta`, against the plain RoPE they
    were trained with (transformers' own formulas, engines.transformers_reading)."""
    rope = {**{k: v for k, v in rope.items() if k != "type"}, "rope_theta": theta,
            "rope_type": rope.get("rope_type", rope.get("type"))}
    d = engines.read_rotary_dim(cfg, rope)
    window = f"{cfg['sliding_window']}-token window" if cfg.get("sliding_window") else "window"
    where = f"inside their {window}, which never leaves the trained range"
    try:
        reading = engines.transformers_reading(rope, d, cfg["max_position_embeddings"])
    except (engines.NotApplicable, KeyError, TypeError):
        reading = None
    if reading is None or reading.freqs is None:
        return f"the sliding-window layers run {_describe(rope)} instead of plain RoPE, {where}"
    inv, scale = reading.freqs(None)
    slow = (engines.plain(d, theta) / inv).max().item()
    return (f"the sliding-window layers run {_describe(rope)} at θ {_g(theta)}: rotary frequencies "
            f"up to {slow:.3g}× slower than trained" + (f", cos/sin × {scale:.4g}" if abs(scale - 1) > TOLERANCE
                                                        else "") + f", {where}")


def _nest(full: dict[str, Any], theta: float) -> str:
    return json.dumps({"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": theta}})


def _per_layer(stated: dict[str, Any], cfg: dict[str, Any]) -> list[Finding]:
    """The first that applies: the config keyed by layer type scales its sliding entry; one flat
    rope_parameters entry; else (the 4.x layout, rope_scaling) the releases that copied the
    entry onto the sliding layers (one finding per engine)."""
    family = PER_LAYER.get(str(cfg.get("model_type")))
    params, legacy = stated.get("rope_parameters"), stated.get("rope_scaling")
    if family is None:
        return []
    if _keyed(params) and _scaled(params.get("sliding_attention")):
        entry = params["sliding_attention"]
        theta = _sliding_theta(cfg, entry)
        return [Finding(
            "sliding-scaled", "error", f"rope_parameters' sliding_attention entry carries "
            f"{_describe(entry)}: {family} scales only its full-attention layers (transformers puts "
            "rope_scaling into full_attention alone); a hand edit, or a save by a transformers 5 "
            "release that copied the entry into every layer type",
            (TRANSFORMERS_5.name, "vLLM"),
            _sliding_off(cfg, entry, theta) + " (transformers 5.x and vLLM's gemma3.py / olmo3.py read "
            "each layer type's entry" + ("; SGLang's gemma3_causal.py builds the sliding layers' rope "
                                         "plain, so it and transformers now disagree)" if family == "Gemma 3" else ")"),
            f"set \"sliding_attention\": {json.dumps({'rope_type': 'default', 'rope_theta': theta})} "
            "in rope_parameters")]
    if isinstance(params, dict) and not _keyed(params) and _scaled(params):
        theta = _sliding_theta(cfg)
        # transformers 5.24's convert_rope_params_to_dict: a flat rope_parameters gets default
        # full_attention / sliding_attention entries added; rope_scaling beside it is then
        # .update()d into a full_attention entry that is not there yet
        runs = ("refuses to load it (KeyError 'full_attention': rope_scaling beside a flat "
                "rope_parameters)" if legacy else "runs the full-attention layers with plain RoPE, θ "
                f"{_g(params.get('rope_theta', cfg.get('rope_theta', 10000.0)))}: the long-context extension is lost")
        return [Finding(
            "per-layer-flat", "error", f"rope_parameters holds one {_describe(params)} entry, not "
            f"one per layer type: transformers 5 keys {family}'s rope by layer type and finds no "
            "full_attention entry in it", (TRANSFORMERS_5.name, "vLLM", SGLANG.name),
            f"transformers 5.24 (and vLLM / SGLang, which load config.json through it) {runs}; "
            "transformers 5 releases before the per-layer conversion, and vLLM on them, instead "
            f"scale every layer, the sliding ones included ({UNMODELLED})",
            f"key it by layer type: \"rope_parameters\": {_nest(params, theta)}")]
    full = engines.v5_rope(cfg)
    if _keyed(params) or not _scaled(legacy) or not _scaled(full):
        return []
    off = _sliding_off(cfg, full, _sliding_theta(cfg))
    return [Finding(
        "sliding-releases", "warning", f"{family}'s {_describe(full)} entry is for the "
        f"full-attention layers only; {engine} releases without the fix of {num} scaled the "
        "sliding-window layers too", (f"{engine} before the fix of {num}",),
        f"in those releases {off}{note} ({UNMODELLED}; transformers 5.24 and the vLLM and SGLang "
        "model code read here keep the sliding layers plain)", f"run {engine} with the fix of {num} or later")
        for engine, num, note in SLIDING_RELEASES[family]]


def _mla_transformers(rope: dict[str, Any], s: float) -> float:
    """transformers' yarn (modeling_rope_utils.py): attention_factor, else the mscale pair when
    both are non-zero, else 0.1·ln s + 1."""
    a, m, m_all = _num(rope.get("attention_factor")), rope.get("mscale"), rope.get("mscale_all_dim")
    if a is not None:
        return a
    return engines.mscale(s, m) / engines.mscale(s, m_all) if m and m_all else engines.mscale(s)


def _mla_deepseek_yarn(rope: dict[str, Any], s: float) -> float:
    """vLLM's and SGLang's DeepseekScalingRotaryEmbedding (get_rope's deepseek_yarn keys:
    extrapolation_factor, attn_factor, betas, mscale, mscale_all_dim — no attention_factor):
    get_mscale(s, mscale = 1) / get_mscale(s, mscale_all_dim = 0) × attn_factor."""
    m, m_all, attn = (_num(rope.get(k)) for k in ("mscale", "mscale_all_dim", "attn_factor"))
    return engines.mscale(s, 1.0 if m is None else m) / engines.mscale(s, m_all or 0.0) * (1.0 if attn is None else attn)


def _mla_llama_cpp(rope: dict[str, Any], s: float) -> float:
    """llama.cpp: the converter writes only yarn_log_multiplier (0.1·mscale_all_dim);
    src/llama-context.cpp "assume[s] mscale == 1.0f" and, for deepseek2, takes mscale =
    mscale_all_dim, so cos/sin run 1 whenever mscale_all_dim is set, else 0.1·ln s + 1."""
    return 1.0 if rope.get("mscale_all_dim") else engines.mscale(s)


# (engine, its MLA scale, the readers it affects: ids, or a label for a reader not modelled)
MLA_READERS = ((VLLM_07B12F1.engine, _mla_deepseek_yarn, (VLLM_07B12F1.id, VLLM_0CD5784.id)),
               (SGLANG.engine, _mla_deepseek_yarn, (SGLANG.id,)),
               (LLAMACPP.engine, _mla_llama_cpp, (f"{LLAMACPP.name} (main's llama-context.cpp)",)))


def _mla_fix(rope: dict[str, Any], s: float, want: float, name: str, reads) -> str:
    """The mscale edit under which transformers and vLLM / SGLang both run `want`, checked by
    re-deriving both; llama.cpp reaches no scale but 1 (mscale = mscale_all_dim)."""
    if reads is _mla_llama_cpp:
        m_all = _num(rope.get("mscale_all_dim")) or 1.0
        return (f"no config key gives llama.cpp {want:.6g}; set \"mscale\": {_g(m_all)}, \"mscale_all_dim\": "
                f"{_g(m_all)} and drop attention_factor to make every reader run 1.0")
    m_all = _num(rope.get("mscale_all_dim")) or 0.0
    m = (want * engines.mscale(s, m_all) - 1) / (0.1 * math.log(s))
    edit = {"mscale": round(m, 6), **({"attn_factor": 1.0} if "attn_factor" in rope else {})}
    new = {**rope, **edit}
    ok = abs(_mla_transformers(new, s) - want) <= 1e-5 * want and abs(_mla_deepseek_yarn(new, s) - want) <= 1e-5 * want
    # DeepSeek's reference modeling code reads the pair with defaults mscale 1, mscale_all_dim 0
    # (as vLLM and SGLang do); stating the missing ones makes transformers read it that way too
    stated = {k: v for k, v in (("mscale", 1.0), ("mscale_all_dim", 0.0)) if k not in rope}
    reference = (f"add {', '.join(f'{json.dumps(k)}: {_g(v)}' for k, v in stated.items())}"
                 if stated else "drop attention_factor" if "attention_factor" in rope else "")
    return ((f"set {', '.join(f'{json.dumps(k)}: {_g(v)}' for k, v in edit.items())} (then transformers and "
             f"{name} both run {want:.6g})" if ok else "no single mscale edit gives both transformers' scale")
            + (f"; or, if DeepSeek's reference reading ({name}'s) was meant, {reference}" if reference else ""))


def _mla(cfg: dict[str, Any]) -> list[Finding]:
    rope = engines.v5_rope(cfg)
    s = _num(rope.get("factor"))
    if str(cfg.get("model_type")) not in OWN_YARN or rope["rope_type"] != "yarn" or not s or s <= 1:
        return []
    want = _mla_transformers(rope, s)
    keys = {k: rope[k] for k in ("attention_factor", "attn_factor", "mscale", "mscale_all_dim") if k in rope}
    out = []
    for name, reads, labels in MLA_READERS:
        got = reads(rope, s)
        if abs(got - want) <= TOLERANCE * want:
            continue
        out.append(Finding(
            "mla-yarn-scale", "error", f"DeepSeek-style YaRN keys {json.dumps(keys)} read differently: "
            f"transformers scales cos/sin by {want:.6g}, {name}'s MLA rope by {got:.6g} "
            "(vllm #48351, #46280; sglang #22711; llama.cpp #17945)",
            tuple(_label(r) if r in readers.IDS else r for r in labels),
            f"{name} {got:.6g} ({abs(got - want) / want:.1%} off; the rope part of every attention logit "
            f"{(got / want) ** 2:.4g}×); the softmax factor get_mscale(s, mscale_all_dim)² is the same in all"
            + (" (re-derived from llama.cpp main; llama-cpp-python 0.3.36 not checked)" if reads is _mla_llama_cpp else ""),
            _mla_fix(rope, s, want, name, reads)))
    return out


def _truncate(cfg: dict[str, Any]) -> list[Finding]:
    rope = engines.v5_rope(cfg)
    if rope["rope_type"] != "yarn" or rope.get("truncate", True) is not False \
            or str(cfg.get("model_type")) in OWN_YARN or not _num(rope.get("factor")):
        return []
    d, base, s = engines.read_rotary_dim(cfg, rope), float(rope["rope_theta"]), float(rope["factor"])
    L = rope.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
    bf, bs = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1
    exact, rounded = (engines.yarn_inv_freq(d, base, s, L, bf, bs, t) for t in (False, True))
    err = ((rounded - exact).abs() / exact).max().item()
    if err <= TOLERANCE:
        return []
    return [Finding(
        "truncate-releases", "warning", "\"truncate\": false (gpt-oss: the YaRN correction range "
        f"is used unrounded); {engine} releases before {num} ignore the key and floor/ceil the range",
        (f"{engine} before {num}",),
        f"inv_freq up to {err:.1%} off ({UNMODELLED}; the transformers, vLLM and SGLang code "
        "modelled here reads truncate)", f"run {engine} with {num} or later")
        for engine, num in TRUNCATE_FIXES]


def _longrope(cfg: dict[str, Any]) -> list[Finding]:
    rope = engines.v5_rope(cfg)
    if rope["rope_type"] not in ("longrope", "su"):
        return []
    d = engines.read_rotary_dim(cfg, rope)
    bad = {k: len(v) for k in ("long_factor", "short_factor")
           if isinstance(v := rope.get(k), list) and len(v) != d // 2}
    if not bad:
        return []
    head = head_size(cfg.get("head_dim"), cfg.get("hidden_size"), cfg.get("num_attention_heads"))
    to_head = head != d and all(n == head // 2 for n in bad.values())
    return [Finding(
        "longrope-factors", "error", f"LongRoPE {' and '.join(f'{k} has {n} values' for k, n in bad.items())}"
        f", but the rotary dim is {d} (head dim {head}"
        + (f" × partial_rotary_factor {_g(d / head)}" if head != d else "") + f"): every reader "
        f"multiplies its {d // 2} rotary frequencies by the list one to one"
        + (" — it was sized to head_dim / 2, not the rotary dim (apache/tvm #18102)" if to_head else ""),
        ("every reader",),
        "none loads it: transformers warns at load, then fails building the rope (RuntimeError: "
        "size mismatch); vLLM and SGLang fail the same way in Phi3LongRoPEScaledRotaryEmbedding; "
        "llama.cpp's converter refuses (ValueError: the factor lists must be rope_dims / 2)",
        f"give long_factor and short_factor {d // 2} values each, one per rotary frequency "
        f"b^(-2i/{d}): factors found for other frequencies do not carry over, so rerun the LongRoPE "
        f"search over the {d} rotary dims")]


def _layers(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:12])) + (f", … ({len(ids)} layers)" if len(ids) > 12 else "")


def _nope(cfg: dict[str, Any]) -> list[Finding]:
    """transformers' configuration_smollm3.py / configuration_llama4.py: `no_rope_layers` (1 = rope)
    when given, else NoPE on every no_rope_layer_interval-th layer."""
    family = NOPE.get(str(cfg.get("model_type")))
    if family is None:
        return []
    listed, n = cfg.get("no_rope_layers"), cfg.get("num_hidden_layers")
    interval = int(cfg.get("no_rope_layer_interval") or LLAMA_CPP_NOPE_STEP)
    if not listed and not isinstance(n, int):   # no depth: the patterns agree when the steps do
        if interval == LLAMA_CPP_NOPE_STEP:
            return []
        nope_text = f"every {interval}th layer (no_rope_layer_interval {interval})"
        off = f"llama.cpp runs NoPE on every 4th layer instead of every {interval}th"
        nope: list[int] = []
    else:
        n = len(listed) if listed else n
        nope = [i for i, uses in enumerate(listed) if not uses] if listed else \
            [i for i in range(n) if (i + 1) % interval == 0]
        cpp = [i for i in range(n) if (i + 1) % LLAMA_CPP_NOPE_STEP == 0]
        if nope == cpp:
            return []
        nope_text = _layers(nope)
        off = (f"llama.cpp rotates NoPE layers {_layers([i for i in nope if i not in cpp]) or 'none'} "
               f"and leaves rope layers {_layers([i for i in cpp if i not in nope]) or 'none'} unrotated")
    rope = engines.v5_rope(cfg)
    untouched = (f"; the {_describe(rope)} entry scales only the rope layers, not these NoPE layers"
                 if _scaled(rope) else "")
    return [Finding(
        "nope-layers", "error", f"{family}'s NoPE layers per config.json are {nope_text}"
        + untouched + "; llama.cpp skips rope on every 4th layer whatever config.json says "
        "(n_no_rope_layer_step = 4 in src/llama-model.cpp; no GGUF key carries the list)", (_label(LLAMACPP.id),),
        off + " (re-derived from llama.cpp's source)",
        "no config key or flag reaches llama.cpp's step; serve it where no_rope_layers is read "
        "(transformers, vLLM)")]


def diagnose_family(stated: dict[str, Any], cfg: dict[str, Any]) -> list[Finding]:
    """The family findings for a config.json: `stated` as it says it (a multimodal text_config
    merged in), `cfg` with the class defaults transformers fills in (doctor.diagnose)."""
    return _per_layer(stated, cfg) + _mla(cfg) + _truncate(cfg) + _longrope(cfg) + _nope(cfg)

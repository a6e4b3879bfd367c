"""`hf-posext check`'s doctor: what is wrong with any RoPE config.json, hf_posext's or not
(docs/check.md, "Doctor"). Each `Finding` names the readers it affects, how far off
they are — re-derived with `check`'s own reader models (`engines.v5_rope` / `v4_rope` /
`converter_rope`: which keys each reads; `readers.READERS`: the inv_freq and cos/sin scale each
runs; `config_audit.derived_lengths`: the length each derives) — and the fix (config edit, flag or
`hf-posext export` command). The problems are those users report: θ lost when transformers 5
moved it into `rope_parameters` (unsloth #7028), two layouts saying different things, a factor
that disagrees with the two lengths (transformers #38224, vllm #56446), no
`original_max_position_embeddings`, YaRN keys each engine reads differently
(vllm #46280, #48351, #48621, #48623), static scaling that costs short prompts (vllm #18728), a
rope entry beside a multimodal `text_config` that nothing reads; family_doctor.py adds the engine
bugs in the rope of the families people extend now (per-layer rope, DeepSeek-style YaRN, gpt-oss's
`truncate`, LongRoPE lists, NoPE layers), gguf_doctor.py a GGUF's keys (llama.cpp #13331)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from . import config_audit, engines, family_doctor, portable, readers
from .readers import LLAMACPP, SGLANG, TGI, TRANSFORMERS_4, TRANSFORMERS_5, VLLM_07B12F1, VLLM_0CD5784
from .family_doctor import OWN_YARN
from .finding import Finding, _g, _label, _num
from .meaning import TOLERANCE
from .verdicts import class_defaults, load_config, with_class_defaults
from ..rope.compat import v4_scaling

ROPE_KEYS = ("rope_scaling", "rope_parameters", "rope_theta")
FALLBACK_THETA = 10000.0   # every reader's θ when it reads none (engines.v5_rope etc.)
# llama.cpp runs its own YaRN temperature for these (src/models/mistral3.cpp, grok.cpp)
LLAMA_CPP_OWN_YARN = ("mistral3", "ministral3", "grok")


def merged(raw: dict[str, Any]) -> dict[str, Any]:
    """What the decoder's readers see: a multimodal wrapper's text_config over the top level
    (as verdicts.load_config and llama.cpp's converter merge it); no class defaults filled in."""
    return {**raw, **raw["text_config"]} if isinstance(raw.get("text_config"), dict) else raw


def _stated_thetas(cfg: dict[str, Any]) -> set[float]:
    found = {_num(cfg.get("rope_theta"))}
    for key in ("rope_scaling", "rope_parameters"):
        rope = cfg.get(key)
        if isinstance(rope, dict):
            found.add(_num(rope.get("rope_theta")))
            found |= {_num(v.get("rope_theta")) for v in rope.values() if isinstance(v, dict)}
    return {t for t in found if t is not None}


def _slowest(d: int, used: float, meant: float) -> str:
    """How far the slowest rotary component b^(-(d-2)/d) is off when run with base `used`."""
    ratio = (meant / used) ** ((d - 2) / d)
    return f"slowest rotary component {max(ratio, 1 / ratio):.3g}× too {'fast' if ratio > 1 else 'slow'}"


def _theta(cfg: dict[str, Any]) -> list[Finding]:
    """`cfg`: as config.json states it (no class defaults filled in)."""
    stated = _stated_thetas(cfg)
    d = engines.read_rotary_dim(with_class_defaults(cfg), engines.v5_rope(cfg))
    family = _num(class_defaults(cfg.get("model_type")).get("rope_theta")) if "model_type" in cfg else None
    if not stated and family not in (None, FALLBACK_THETA):
        return []   # the model class carries its family's θ (Gemma 3: 1e6), which its readers load
    if not stated:
        return [Finding(
            "theta-missing", "warning", "rope_theta is stated nowhere in config.json (neither at "
            "the top level nor in rope_parameters / rope_scaling)", ("every reader",),
            f"every reader falls back to θ {FALLBACK_THETA:g} (the engines' default and this "
            "model class's): for a model trained with θ 500000 (Llama 3) the "
            f"{_slowest(d, FALLBACK_THETA, 5e5)} (d = {d})",
            "add the θ the model was trained with to the top level (4.x, TGI) and to "
            "rope_parameters (5.x), e.g. \"rope_theta\": 500000.0")]
    if len(stated) > 1:
        return []   # two stated values: layouts-disagree says which reader reads which
    meant = stated.pop()
    lost = [(who, read(cfg)["rope_theta"]) for who, read in config_audit.LAYOUTS
            if _num(read(cfg)["rope_theta"]) not in (meant,)
            and not (v5_only(cfg) and read is engines.v4_rope)]   # v5-only says that
    if not lost:
        return []
    where = [k for k in ("rope_theta", "rope_scaling", "rope_parameters")
             if k == "rope_theta" and "rope_theta" not in cfg
             or isinstance(cfg.get(k), dict) and "rope_theta" not in cfg[k]]
    return [Finding(
        "theta-dropped", "error", f"θ = {_g(meant)} is stated only where some readers do not look; "
        "they fall back to the default (unsloth #7028: a θ lost this way turned perplexity 10 "
        "into 11,316)", tuple(w for w, _ in lost),
        "; ".join(f"{who} run θ {_g(t)} ({_slowest(d, float(t), meant)})" for who, t in lost),
        f"add \"rope_theta\": {_g(meant)} to "
        + " and to ".join("the top level" if k == "rope_theta" else k for k in where))]


def _reading_key(rope: dict[str, Any], stated: set[float]) -> str:
    """A reader's rope without a θ it fell back to (theta-dropped reports those)."""
    keep = {k: v for k, v in rope.items() if k not in ("partial_rotary_factor", "type")
            and not (k == "rope_theta" and _num(v) not in stated)}
    return json.dumps(keep, sort_keys=True, default=str)


def v5_only(cfg: dict[str, Any]) -> bool:
    """Only the transformers 5 layout: rope_parameters, no rope_scaling, no top-level θ."""
    return isinstance(cfg.get("rope_parameters"), dict) and not cfg.get("rope_scaling") \
        and "rope_theta" not in cfg


def _v5_only(cfg: dict[str, Any]) -> list[Finding]:
    rope = engines.v5_rope(cfg)
    if rope["rope_type"] == "default" and _num(rope["rope_theta"]) == FALLBACK_THETA:
        return []
    d = engines.read_rotary_dim(cfg, rope)
    scaling = v4_scaling({k: v for k, v in rope.items() if k != "type"})
    return [Finding(
        "v5-only", "warning", "only transformers 5's rope_parameters: readers of the 4.x layout "
        "(rope_scaling + top-level rope_theta) run plain RoPE with θ 10000 (moot where "
        "transformers 4.x has no such model type)", (TRANSFORMERS_4.name, TGI.name),
        f"they run plain RoPE, θ {FALLBACK_THETA:g} instead of {config_audit.describe_rope(rope)} "
        f"({_slowest(d, FALLBACK_THETA, float(rope['rope_theta']))})",
        f"add \"rope_theta\": {_g(rope['rope_theta'])}"
        + (f" and \"rope_scaling\": {json.dumps(scaling)}" if scaling else "")
        + " at the top level (hf_posext's save_pretrained writes both layouts)")]


def _layouts(cfg: dict[str, Any], as_stated: dict[str, Any]) -> list[Finding]:
    if v5_only(as_stated):   # as config.json states it: a class default θ is not a 4.x key
        return _v5_only(cfg)
    stated = _stated_thetas(cfg)
    groups: dict[str, tuple[dict, list[str]]] = {}
    for who, read in config_audit.LAYOUTS:
        groups.setdefault(_reading_key(read(cfg), stated), (read(cfg), []))[1].append(who)
    if len(groups) < 2:
        return []
    five = engines.v5_rope(cfg)
    return [Finding(
        "layouts-disagree", "error", "rope_scaling and rope_parameters say different things, so "
        "readers run different ropes", tuple(w for _, ws in groups.values() for w in ws),
        "; ".join(f"{' and '.join(ws)} read {config_audit.describe_rope(r)}" for r, ws in groups.values()),
        "make both say the same; transformers 5.x, vLLM and SGLang run rope_scaling, so e.g. set "
        f"\"rope_parameters\": {json.dumps({k: v for k, v in five.items() if k != 'type'})} "
        "(or delete one of the two entries)")]


def _lengths(cfg: dict[str, Any]) -> list[Finding]:
    rope = engines.v5_rope(cfg)
    kind, s = rope["rope_type"], _num(rope.get("factor"))
    M = _num(cfg.get("max_position_embeddings"))
    L = _num(rope.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings"))
    derived = config_audit.derived_lengths(cfg)
    said = ", ".join(f"{config_audit.length_label(k)} {v}" for k, v in derived.items())
    if kind not in ("linear", "yarn") or not s or s <= 1 or M is None:
        return []
    if L is not None and M != round(s * L):
        T = round(s * L)
        return [Finding(
            "factor-length", "warning", f"factor {s:g} × original_max_position_embeddings {L:g} = "
            f"{T}, but max_position_embeddings is {M:g}: the engines each derive their own limit "
            "(transformers 5.24 only warns; transformers #38224)",
            tuple(config_audit.engine_name(k) for k, v in derived.items()
                  if v != T and k != "transformers") or ("transformers",),
            f"{said} (target {T})",
            f"set \"max_position_embeddings\": {T} (then every engine derives {T}), or serve "
            "with " + config_audit.serve_flags(T))]
    T = round(M) if L is None else round(s * L)
    off = {k: v for k, v in derived.items() if v != T and k != "transformers"}
    if not off:
        return []
    return [Finding(
        "engine-length", "warning", f"the config declares {T} tokens, but "
        + ", ".join(f"{config_audit.length_label(k)} derives {v} ({v / T:g}×)" for k, v in off.items())
        + " (vllm #56446: the factor applied to an already extended length)",
        tuple(config_audit.engine_name(k) for k in off), said,
        f"serve {T} explicitly: " + config_audit.serve_flags(T, off)
        + (f"; or add \"original_max_position_embeddings\": {round(M / s)} to the rope dict"
           if L is None and kind == "yarn" else ""))]


def _original(cfg: dict[str, Any]) -> list[Finding]:
    rope = engines.v5_rope(cfg)
    s, M = _num(rope.get("factor")), _num(cfg.get("max_position_embeddings"))
    if rope["rope_type"] != "yarn" or "original_max_position_embeddings" in rope \
            or "original_max_position_embeddings" in cfg or not s or M is None:
        return []
    d, base = engines.read_rotary_dim(cfg, rope), float(rope["rope_theta"])
    meant, as_is = (engines.yarn_inv_freq(d, base, s, round(L), 32, 1) for L in (M / s, M))
    err = ((as_is - meant).abs() / meant).max().item()
    refuse = [r.name for r in (VLLM_07B12F1, VLLM_0CD5784, TGI, LLAMACPP) if r.id not in _readings(cfg)]
    return [Finding(
        "original-missing", "error", "yarn without original_max_position_embeddings: transformers "
        f"(4.57 and 5.x) and SGLang take L = max_position_embeddings = {M:g}, which is the trained "
        "length only if the factor was not already applied to it",
        (TRANSFORMERS_5.name, TRANSFORMERS_4.name, SGLANG.name, *refuse),
        f"if max_position_embeddings is the extended length, L should be {M / s:g}: the YaRN ramp "
        f"then differs by up to {err:.0%} in inv_freq; "
        + (f"{', '.join(refuse)} refuse the config (KeyError)" if refuse else ""),
        f"add \"original_max_position_embeddings\": <trained length> to the rope dict: {M / s:g} if "
        f"{M:g} is the extended length, {M:g} if it is the trained one")]


def _readings(cfg: dict[str, Any], kind: str | None = None) -> dict[str, tuple]:
    """reader id -> (inv_freq, scale) it runs for this config (re-derived); `kind`: only readers
    whose layout (readers.Reader.layout) reads that rope type (the others are the layout
    findings' business)."""
    out = {}
    for reader in readers.READERS:
        if kind is not None and reader.layout(cfg)["rope_type"] != kind:
            continue
        try:
            reading = reader.read(cfg)
        except (engines.NotApplicable, KeyError, TypeError, ValueError):
            continue
        if reading.freqs is not None:
            out[reader.id] = reading.freqs(None)
    if str(cfg.get("model_type")) in LLAMA_CPP_OWN_YARN:
        out.pop(LLAMACPP.id, None)
    return out


def scales(cfg: dict[str, Any], kind: str | None = None) -> dict[str, float]:
    """reader id -> the cos/sin scale it applies to this config (re-derived)."""
    return {name: float(scale) for name, (_, scale) in _readings(cfg, kind).items()}


def _scale_fix(cfg: dict[str, Any], reader: str, want: float) -> str:
    """The smallest edit of the rope dict that makes `reader` (an id) apply `want`, keeping transformers
    5.x at `want` — checked by re-deriving both on the edited config."""
    rope = engines.v5_rope(cfg)
    s = float(rope["factor"])
    got = scales(cfg)[reader]
    tries = [{"attention_factor": want}, {"attn_factor": want / got * float(rope.get("attn_factor", 1))},
             {"mscale": (want - 1) / (0.1 * math.log(s)), "mscale_all_dim": 0.0}]
    key = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    def right(table: dict[str, float], name: str) -> bool:
        return abs(table.get(name, 0) - want) <= TOLERANCE * want

    before = scales(cfg)
    for edit in tries:
        after = scales({**cfg, key: {**cfg[key], **edit}})
        if right(after, reader) and all(right(after, r) for r in before if right(before, r)):
            return "set " + ", ".join(f"\"{k}\": {v:.6g}" for k, v in edit.items())
    for edit in tries:   # no shared edit: one that fixes this reader alone, for its own copy
        if right(scales({**cfg, key: {**cfg[key], **edit}}), reader):
            return ("no edit keeps the others right; serve it from a copy of the checkpoint "
                    "with " + ", ".join(f"\"{k}\": {v:.6g}" for k, v in edit.items()))
    return ""


def _yarn_scale(cfg: dict[str, Any]) -> list[Finding]:
    rope = engines.v5_rope(cfg)
    if rope["rope_type"] != "yarn" or str(cfg.get("model_type")) in OWN_YARN \
            or not _num(rope.get("factor")):
        return []
    per_reader = scales(cfg, "yarn")
    want = per_reader.get(TRANSFORMERS_5.id)
    if want is None:
        return []
    off = {r: v for r, v in per_reader.items() if abs(v - want) > TOLERANCE * want}
    if not off:
        return []
    keys = [k for k in ("attention_factor", "attn_factor", "mscale", "mscale_all_dim") if k in rope]
    fixes = []
    for reader in off:
        if reader == LLAMACPP.id:
            g = engines.mscale(float(rope["factor"]))
            fixes.append(f"llama.cpp: run with --yarn-attn-factor {want / g:.6g} (its runtime reads "
                         "no YaRN temperature from a Llama GGUF; hf-posext export PATH OUT.gguf "
                         "--target gguf --gguf CONVERTED.gguf writes it)")
        elif (edit := _scale_fix(cfg, reader, want)):
            fixes.append(f"{_label(reader)}: {edit}")
    return [Finding(
        "yarn-attention-keys", "error", f"YaRN temperature keys ({', '.join(keys) or 'none'}) read "
        "differently: transformers applies "
        f"{want:.6g}, other readers another scale to every cos/sin (vllm #46280, #48351, #48621, #48623)",
        tuple(_label(r) for r in off),
        "; ".join(f"{_label(r)} {v:.6g} ({abs(v - want) / want:.1%} off)" for r, v in off.items()),
        "; ".join(fixes) + " (these make each reader run transformers' scale; the config alone "
        "cannot say which one its author meant); for an hf_posext checkpoint, hf-posext export "
        "PATH OUT --target vllm|sglang|tgi writes and checks each engine's form")]


def _yarn_frequencies(cfg: dict[str, Any]) -> list[Finding]:
    """YaRN knobs some readers do not read (TGI fixes the betas at 32/1 and always floor/ceils
    the correction range; llama.cpp's runtime reads no betas for Llama and always floor/ceils:
    gpt-oss's `truncate: false`), re-derived as each reader's inv_freq against transformers'."""
    rope = engines.v5_rope(cfg)
    if rope["rope_type"] != "yarn" or str(cfg.get("model_type")) in OWN_YARN:
        return []
    freqs = {name: inv for name, (inv, _) in _readings(cfg, "yarn").items()}
    ref = freqs.get(TRANSFORMERS_5.id)
    if ref is None:
        return []
    off = {r: ((f - ref).abs() / ref).max().item() for r, f in freqs.items()}
    off = {r: e for r, e in off.items() if e > TOLERANCE}
    if not off:
        return []
    keys = {k: rope[k] for k in ("beta_fast", "beta_slow", "truncate", "extrapolation_factor") if k in rope}
    return [Finding(
        "yarn-frequencies", "error", f"YaRN settings {json.dumps(keys)} are not read by every "
        "reader: they run other frequencies than transformers", tuple(_label(r) for r in off),
        "; ".join(f"{_label(r)} inv_freq up to {e:.1%} off" for r, e in off.items()),
        "no config key reaches them: TGI cannot run these settings; llama.cpp takes the betas as "
        "--yarn-beta-fast / --yarn-beta-slow and always floor/ceils the ramp; serve them where the "
        "check above says exact")]


def _static(cfg: dict[str, Any]) -> list[Finding]:
    rope = engines.v5_rope(cfg)
    s, M = _num(rope.get("factor")), _num(cfg.get("max_position_embeddings"))
    L = _num(rope.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings"))
    if rope["rope_type"] not in ("yarn", "linear") or not s or s <= 1 or M is None:
        return []
    added = portable.ENTRY in cfg or (L is not None and M < s * L)
    if not added:   # the config declares s·L: trained with the scaling (gpt-oss, DeepSeek-V3)
        return []
    short = round(L) if L else round(M)
    return [Finding(
        "static-short", "warning", f"static {rope['rope_type']} (factor {s:g}) added for long "
        f"inputs applies at every length: prompts under {short} tokens also run the interpolated "
        "rope (vllm #18728: Qwen3-32B −15–20 % on short agentic prompts)",
        ("transformers", "vLLM", "SGLang", "TGI", "llama.cpp"),
        f"below {short} tokens the low frequencies run {s:g}× slower than trained"
        + (f" and cos/sin is scaled by {engines.mscale(s):.4g}" if rope["rope_type"] == "yarn" else ""),
        "add rope scaling only where inputs exceed L (the Qwen model cards say so), or in "
        "transformers use hf_posext's dynamic_yarn (patch(model, \"dynamic_yarn\", factor=...): "
        "s = max(1, length/L), the trained rope below L) with hf_posext.generate, which holds one "
        "scale for prompt + new tokens")]


def _nested(raw: dict[str, Any]) -> list[Finding]:
    text = raw.get("text_config")
    if not isinstance(text, dict):
        return []
    stray = [k for k in ROPE_KEYS if raw.get(k) is not None and raw.get(k) != text.get(k)]
    if not stray:
        return []
    return [Finding(
        "nested-rope", "error", f"top-level {', '.join(stray)} beside a text_config that "
        "differs: transformers, vLLM and SGLang build the decoder from text_config only (a "
        "top-level yarn entry even stops transformers 5.24 loading the wrapper)",
        ("transformers", "vLLM", "SGLang", "llama.cpp"),
        "; ".join(f"{k}: decoder runs {json.dumps(text.get(k))}, top level says {json.dumps(raw[k])}"
                  for k in stray)
        + "; llama.cpp's converter merges text_config over the top level, so where text_config "
          "has no such key it reads the top-level one",
        f"move {', '.join(stray)} into text_config (or delete the top-level copy)")]


def diagnose(raw: dict[str, Any]) -> list[Finding]:
    """Every finding for a config.json (`raw`, as parsed; gguf_doctor.compare adds a GGUF's)."""
    stated = merged(raw)
    cfg = with_class_defaults(stated)
    return _theta(stated) + _layouts(cfg, stated) + _lengths(cfg) + _original(cfg) + _yarn_scale(cfg) \
        + _yarn_frequencies(cfg) + _static(cfg) + _nested(raw) + family_doctor.diagnose_family(stated, cfg)


def raw_config(path) -> dict[str, Any]:
    """config.json of a folder or file as parsed, after `check`'s own validation of it."""
    load_config(path)
    return json.loads((Path(path) / "config.json" if Path(path).is_dir() else Path(path)).read_text())


def text(findings: list[Finding]) -> str:
    if not findings:
        return "  doctor: no findings"
    lines = [f"  doctor: {len(findings)} finding{'s' if len(findings) > 1 else ''}"]
    return "\n".join(lines + ["  " + line for f in findings for line in f.lines()])

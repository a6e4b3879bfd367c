"""The doctor's GGUF findings: rope keys of a GGUF that disagree with the config.json it was
converted from (llama.cpp #13331: YaRN is baked into a GGUF at conversion, so a GGUF made from a
config with a YaRN entry added for long inputs keeps it, and an edited config does not reach it).

`read_metadata` takes a GGUF file (through the `gguf` package) or the JSON `gguf-dump --json`
prints; `compare` re-derives what llama.cpp runs from the GGUF (its runtime reads
`{arch}.rope.freq_base`, `rope.scaling.type/factor/original_context_length/attn_factor`:
src/llama-model.cpp `load_hparams`; the scale is (0.1·ln s + 1)·attn_factor, `engines.gguf_reading`)
against what the config means to transformers, and names the llama.cpp flags that override each
key (llama-cli / llama-server `--rope-scaling`, `--rope-scale`, `--rope-freq-base`,
`--yarn-orig-ctx`, `--yarn-attn-factor`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import engines
from .readers import LLAMACPP
from .finding import Finding, _num
from .gguf_export import _field_value, _gguf

_CONVERTED = {"linear": "linear", "yarn": "yarn"}   # the types the converter writes; others: none


def read_metadata(path) -> dict[str, Any]:
    """{key: value} of a GGUF file, or of `gguf-dump --json` output ({"metadata": {key: {"value"}}})
    or a flat {key: value} JSON."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--gguf {path}: no such file; pass a .gguf or gguf-dump --json output.")
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        meta = data.get("metadata", data) if isinstance(data, dict) else None
        if not isinstance(meta, dict):
            raise ValueError(f"--gguf {path}: not GGUF metadata (expected gguf-dump --json output).")
        return {k: v.get("value") if isinstance(v, dict) and "value" in v else v for k, v in meta.items()}
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as err:
        raise ValueError(f"--gguf {path} is not a readable GGUF file ({err}).") from None
    return {name: _field_value(field, gguf)[0] for name, field in reader.fields.items()}


def compare(cfg: dict[str, Any], meta: dict[str, Any], meant_scale: float | None) -> list[Finding]:
    """One finding listing every rope key of the GGUF that disagrees with `cfg`."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("the GGUF metadata has no general.architecture: not a model GGUF.")
    rope = engines.converter_rope(cfg)
    kind = _CONVERTED.get(rope["rope_type"], "none")
    s = _num(rope.get("factor")) or 1.0
    want = {"rope.freq_base": (float(rope["rope_theta"]), "--rope-freq-base"),
            "context_length": (_num(cfg.get("max_position_embeddings")), "-c"),
            "rope.scaling.type": (kind, "--rope-scaling")}
    if kind != "none":
        want["rope.scaling.factor"] = (s, "--rope-scale")
    if kind == "yarn":
        want["rope.scaling.original_context_length"] = (
            _num(rope.get("original_max_position_embeddings")), "--yarn-orig-ctx")
    got = {k: meta.get(f"{arch}.{k}") for k in want}
    got["rope.scaling.type"] = got["rope.scaling.type"] or "none"
    bad = {k: (got[k], w, flag) for k, (w, flag) in want.items() if w is not None and not _same(got[k], w)}
    g_kind, g_s = got["rope.scaling.type"], _num(meta.get(f"{arch}.rope.scaling.factor")) or 1.0
    runs = (engines.mscale(g_s) * (_num(meta.get(f"{arch}.rope.scaling.attn_factor")) or 1.0)
            if g_kind == "yarn" else 1.0)
    if meant_scale is not None and abs(runs - meant_scale) > 1e-5 * meant_scale \
            and (kind == "yarn" or g_kind == kind):   # else --rope-scaling already fixes it
        bad["cos/sin scale"] = (round(runs, 6), round(meant_scale, 6), "--yarn-attn-factor")
    if not bad:
        return []
    flags = [f"{flag} {_flag_value(k, w, meant_scale, s)}" for k, (_, w, flag) in bad.items()]
    return [Finding(
        "gguf-mismatch", "error", f"the GGUF's rope keys ({arch}) disagree with config.json: "
        "llama.cpp runs the GGUF's (llama.cpp #13331: rope scaling is baked in at conversion)",
        (LLAMACPP.name,), "; ".join(f"{k}: GGUF {g!r}, config {w!r}" for k, (g, w, _) in bad.items()),
        "run llama.cpp with " + " ".join(flags) + "; or reconvert the GGUF from this config "
        "(convert_hf_to_gguf.py), or for an hf_posext checkpoint: hf-posext export PATH OUT.gguf "
        "--target gguf --gguf THIS.gguf")]


def _same(got, want) -> bool:
    if isinstance(want, str):
        return str(got) == want
    g = _num(got)
    return g is not None and abs(g - want) <= 1e-6 * abs(want)


def _flag_value(key: str, want, scale: float | None, s: float) -> str:
    if key == "cos/sin scale":   # llama.cpp multiplies its own 0.1·ln s + 1 by the flag
        return f"{(scale or 1.0) / engines.mscale(s):.6g}"
    return want if isinstance(want, str) else f"{want:.10g}"

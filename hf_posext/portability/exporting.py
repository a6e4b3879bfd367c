"""`hf_posext.export(model_or_path, out, target=...)`: write the rope a named reader runs exactly.

Readers differ in which keys they read (docs/portability.md, "Readers"): older vLLM
multiplies its own YaRN scale 0.1·ln s + 1 by `attn_factor`; SGLang and TGI take the scale from
`mscale` / `mscale_all_dim`; transformers and current vLLM read `attention_factor`, else `mscale`
/ `mscale_all_dim`; llama.cpp's runtime reads none of what its converter writes from them (only
a GGUF key, hence `--target gguf`). So a YaRN temperature other than
0.1·ln s + 1 (NTK-by-parts: 1; the YaRN authors' Mistral runs: 0.07·ln s + 1) has one form per
reader family, each also exact in transformers 4.x and 5.x. Every candidate form is checked with
`hf_posext.check` before it is written; when none is exact for the target, export refuses and
says what the reader does instead (e.g. dynamic methods in a reader that builds its table once).
Attention-level methods (the `hf_posext_attention` entry) are refused for every target: no
reader but hf_posext runs them. `--target gguf` rewrites a GGUF llama.cpp's converter made of
the checkpoint with the keys llama.cpp's runtime reads (gguf_export.py).

Nothing from the checkpoint is executed: config.json is read as JSON and the other files are
copied byte for byte (weights are never unpickled, no remote code imported). The output is
written into a temporary sibling and renamed into place, so a failure leaves nothing.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from . import portable, readers
from .atomic import atomic_output
from . import dual_chunk
from .gguf_export import export_gguf
from .verdicts import check, load_config, meaning, verdict
from ..rope.compat import v4_scaling
from .engines import NotApplicable, v5_rope
from ..rope.methods import yarn_mscale

# the readers' targets (readers.py), and `gguf`: a converted GGUF rewritten for llama.cpp's runtime
TARGETS: tuple[str, ...] = readers.targets() + ("gguf",)


def _forms(spec, theta: float, dim: int, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Candidate rope dicts (5.x flat layout), the portable default first."""
    forms = [portable.saved_rope(spec, {"rope_type": "default", "rope_theta": theta, **extra}, dim)]
    if forms[0]["rope_type"] == "yarn":  # a YaRN-family saved form (yarn, ntk_by_parts)
        s = spec.factor
        t = portable.yarn_temperature(forms[0])
        g = yarn_mscale(s)  # the readers' own 0.1·ln s + 1
        m = (t * g - 1) / (0.1 * math.log(s))  # mscale(s, m) / mscale(s, 1) = t
        if m > 0:  # transformers reads mscale / mscale_all_dim only when both are non-zero
            base = {k: v for k, v in forms[0].items() if k != "attention_factor"}
            forms.append({**base, "mscale": m, "mscale_all_dim": 1.0, "attn_factor": t / g})
            forms.append({**base, "mscale": m, "mscale_all_dim": 1.0})
    return forms


def longrope_for_vllm(cfg: dict[str, Any]) -> dict[str, Any]:
    """A `longrope` config (what `hf-posext search` saves) as vLLM runs it exactly: vLLM's
    longrope (`Phi3LongRoPEScaledRotaryEmbedding`, 0.29 and 0.32) ignores `attention_factor`
    and scales cos/sin by `short_mscale` / `long_mscale`, defaulting both to
    sqrt(1 + ln(max_position / L) / ln L) (measured: up to 0.4 nats off). Writing both equal to
    `attention_factor` gives transformers' scale; transformers ignores the two keys (with a
    warning about unrecognised keys on load)."""
    rope = v5_rope(cfg)
    scale = rope.get("attention_factor")
    if scale is None:
        raise ValueError("export refused: this longrope config has no attention_factor, so "
                         "transformers uses its default scale sqrt(1 + ln factor / ln L) while "
                         "vLLM uses sqrt(1 + ln(max_position_embeddings / L) / ln L); write the "
                         "attention_factor you mean into rope_parameters first.")
    rope = {**rope, "short_mscale": float(scale), "long_mscale": float(scale)}
    return {**cfg, "rope_parameters": rope, "rope_scaling": v4_scaling(rope),
            "rope_theta": rope["rope_theta"]}


def _with_rope(cfg: dict[str, Any], rope: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    return {**cfg, "rope_parameters": rope, "rope_scaling": v4_scaling(rope),
            "rope_theta": rope["rope_theta"], portable.ENTRY: entry}


def export(model_or_path, out, target: str, gguf=None):
    """Write the checkpoint (weights untouched) to `out` with the rope config `target` reads
    exactly; return the check of the written checkpoint. Raises ValueError, naming the reason,
    when `target` cannot express the method; OSError (one line) when `out` cannot be written.

    `target="gguf"`: `gguf` is the GGUF llama.cpp's convert_hf_to_gguf.py wrote of this
    checkpoint, `out` the GGUF file to write; returns the llama.cpp run-time flags still needed
    (gguf_export.export_gguf)."""
    key = str(target).lower()
    if key not in TARGETS:
        raise ValueError(f"Unknown export target {target!r}; use one of {', '.join(TARGETS)}.")
    out = Path(out)
    cfg = load_config(model_or_path)
    _check_output(model_or_path, out, file=key == "gguf")
    try:
        target_meaning = meaning(cfg)
    except NotApplicable as err:
        if key == "vllm" and v5_rope(cfg).get("rope_type") == "longrope":
            chosen = longrope_for_vllm(cfg)
            with atomic_output(out) as tmp:
                _write(model_or_path, tmp, chosen)
            return check(out)
        raise ValueError(f"rope_type {err} is transformers' own, not an hf_posext method: "
                         "nothing to export"
                         + (" (a longrope config has one: --target vllm)." if "longrope" in str(err)
                            else ".")) from None
    sglang_dca = key == "sglang" and (target_meaning.attention or {}).get("method") == "dual_chunk"
    if target_meaning.attention is not None and not sglang_dca:
        raise ValueError(f"export refused: the checkpoint uses the attention-level method "
                         f"{target_meaning.attention.get('method')!r} (config.hf_posext_attention), "
                         f"which {target} does not run: it reads no attention method from "
                         "config.json and would run plain attention. Only transformers with "
                         "`import hf_posext` runs it; for an engine, save a rope method instead.")
    if key == "gguf":
        return export_gguf(cfg, target_meaning, gguf, out)
    if sglang_dca:
        chosen = dual_chunk.sglang_config(cfg, target_meaning)  # refuses with the reason
    else:
        chosen = choose_form(cfg, key, target_meaning)
    with atomic_output(out) as tmp:
        _write(model_or_path, tmp, chosen)
    return check(out)


def choose_form(cfg: dict[str, Any], key: str, target_meaning) -> dict[str, Any] | None:
    """The config (with both rope layouts and the hf_posext entry) that every reader of target
    `key` and transformers run exactly as `target_meaning`: None for plain RoPE (every reader
    runs it as written); ValueError naming each reader's verdict when no form hf_posext knows is
    exact. Used by `export` and by `serve` (hf_posext/portability/serving.py)."""
    spec, theta, dim = target_meaning.spec, target_meaning.theta, target_meaning.dim
    if spec is None:
        return None
    extra = {k: v for k, v in cfg.get("rope_parameters", {}).items() if k == "partial_rotary_factor"}
    entry = portable.entry(spec, theta)
    ids = readers.of_target(key) + readers.of_target("transformers")
    first = None
    forms = _forms(spec, theta, dim, extra)
    for form in forms:
        candidate = _with_rope(cfg, form, entry)
        results = [verdict(r, candidate, target_meaning) for r in ids]
        first = first or results
        if all(v.status == "exact" for v in results):
            return candidate
    # name the target's own reading first; transformers' only when the target is fine
    blame = [v for v in first if v.reader in readers.of_target(key) and v.status != "exact"] or \
        [v for v in first if v.status != "exact"]
    why = "; ".join(f"{v.name} {v.cell()}" + (f" ({v.detail})" if v.detail else "")
                    for v in blame)
    hint = (" llama.cpp reads no YaRN temperature or betas from the converter's keys: "
            "use --target gguf on the converter's GGUF instead."
            if key == "llama.cpp" and forms[0]["rope_type"] == "yarn" else "")
    raise ValueError(f"export refused: {key} cannot run {target_meaning.label} "
                     f"exactly in any form hf_posext knows: {why}.{hint}")


def _check_output(model_or_path, out: Path, file: bool) -> None:
    """Refuse, before any work, an output that cannot be written or would overwrite something."""
    if isinstance(model_or_path, (str, Path)) and not file:  # a folder copy would copy itself
        src = Path(model_or_path)
        src = (src if src.is_dir() else src.parent).resolve()
        if out.resolve() == src or src in out.resolve().parents:
            raise ValueError(f"{out} is inside the checkpoint {src} it would copy; pass a folder "
                             "outside it.")
    if out.is_file() and not file:
        raise FileExistsError(f"{out} is a file; pass a new folder for the exported checkpoint.")
    if out.is_dir() and (file or any(out.iterdir())):
        raise FileExistsError(f"{out} exists{'' if file else ' and is not empty'}; pass a new "
                              f"{'file name' if file else 'folder'}.")
    if file and out.exists():
        raise FileExistsError(f"{out} exists; pass a new file name.")
    if not out.resolve().parent.is_dir():
        raise FileNotFoundError(f"{out.parent} does not exist; create it or pass another output.")


def _write(model_or_path, out: Path, cfg: dict[str, Any] | None) -> None:
    if isinstance(model_or_path, (str, Path)):
        src = Path(model_or_path)
        shutil.copytree(src if src.is_dir() else src.parent, out, dirs_exist_ok=True)
    elif hasattr(model_or_path, "save_pretrained"):
        model_or_path.save_pretrained(out)
    else:
        raise TypeError(f"export takes a model, or a checkpoint folder; got {type(model_or_path).__name__}")
    if cfg is not None:
        saved = json.loads((out / "config.json").read_text())
        saved.update({k: cfg[k] for k in ("rope_parameters", "rope_scaling", "rope_theta", portable.ENTRY,
                                          dual_chunk.CONFIG_KEY) if k in cfg})
        (out / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")

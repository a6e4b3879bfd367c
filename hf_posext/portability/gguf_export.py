"""`hf-posext export CKPT OUT.gguf --target gguf --gguf CONVERTED.gguf`: a GGUF llama.cpp runs
exactly (docs/portability.md, "llama.cpp").

llama.cpp's converter writes a YaRN config's temperature as `rope.scaling.yarn_attn_factor` and
its betas as `rope.scaling.yarn_beta_fast/slow`, but the runtime (src/llama-model.cpp
`load_hparams`, llama-cpp-python 0.3.36) reads for every architecture only
`{arch}.rope.scaling.attn_factor`; the `yarn_*` keys only in src/models/grok.cpp (betas also
mistral3.cpp). So a converted NTK-by-parts or YaRN-with-Mistral-settings Llama runs as plain
YaRN. This module copies the converter's GGUF (every tensor and key, through the `gguf`
package: the tensors are the converter's own) and sets the rope keys the runtime reads:
`rope.scaling.type`, `factor`, `original_context_length`, `attn_factor` (= t / (0.1·ln s + 1):
llama-context.cpp multiplies ggml's built-in 1 + 0.1·ln s by it), `rope.freq_base`; it drops the
`yarn_*` keys the runtime does not read. Betas other than 32/1 have no key llama.cpp reads for
these architectures: they are returned as run-time flags (`--yarn-beta-fast`, `--yarn-beta-slow`;
llama-cpp-python: `yarn_beta_fast=`, `yarn_beta_slow=`). The result is checked with
`engines.gguf_reading` (the runtime's formula) before it is written.

`gguf` is an optional dependency (`pip install hf_posext[gguf]`), imported here only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import engines, portable
from .atomic import atomic_output
from .meaning import TOLERANCE, errors
from ..rope.units import STATIC_METHODS

_READS_YARN_KEYS = ("grok", "mistral3")  # architectures whose runtime reads the yarn_* keys
_UNREAD = ("yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_ext_factor",
           "yarn_log_multiplier")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ImportError("export --target gguf needs the `gguf` package: pip install "
                          "'hf_posext[gguf]' (or pip install gguf).") from None
    return gguf


def rope_keys(target) -> tuple[dict[str, Any], dict[str, float]]:
    """(rope keys without the `{arch}.` prefix, run-time flags) that make llama.cpp's runtime
    run `target` (verdicts.Meaning) exactly; ValueError naming why when none do."""
    spec, theta, d = target.spec, target.theta, target.dim
    if spec is None:
        return {"rope.freq_base": theta, "rope.scaling.type": "none"}, {}
    if spec.is_dynamic:
        raise ValueError(f"export refused: llama.cpp builds one rope table, so {spec.method!r} "
                         "(a length-dependent method) cannot run in it; choose a static method "
                         f"({', '.join(STATIC_METHODS)}) for the length you serve.")
    # What llama.cpp runs is told by the method's saved form (portable.saved_rope), not its name.
    saved = portable.saved_rope(spec, {"rope_type": "default", "rope_theta": theta}, d)
    kind, base = saved["rope_type"], float(saved["rope_theta"])
    if kind == "default":  # e.g. NTK-aware: plain RoPE on the raised base
        keys, flags = {"rope.freq_base": base, "rope.scaling.type": "none"}, {}
        reading = engines.Reading(engines.static(engines.plain(d, base)))
    elif kind == "linear":
        keys, flags = {"rope.freq_base": base, "rope.scaling.type": "linear",
                       "rope.scaling.factor": spec.factor}, {}
        reading = engines.Reading(engines.static(engines.plain(d, base) / spec.factor))
    elif kind == "yarn":
        L, s = saved["original_max_position_embeddings"], spec.factor
        attn = portable.yarn_temperature(saved) / engines.mscale(s)
        keys = {"rope.freq_base": base, "rope.scaling.type": "yarn", "rope.scaling.factor": s,
                "rope.scaling.original_context_length": L, "rope.scaling.attn_factor": attn}
        flags = {k: v for k, v, default in (("yarn_beta_fast", saved["beta_fast"], 32.0),
                                            ("yarn_beta_slow", saved["beta_slow"], 1.0)) if v != default}
        reading = engines.gguf_reading(d, base, s, L, attn, saved["beta_fast"], saved["beta_slow"])
    else:
        raise ValueError(f"export refused: {spec.method!r} is saved as rope_type {kind!r}, which "
                         "llama.cpp's GGUF keys cannot express.")
    freq_err, scale_err = errors(reading, target)
    if max(freq_err, scale_err) > TOLERANCE:  # a guard on the formulas above, not a user error
        raise ValueError(f"export refused: the GGUF keys would run {target.label} with relative "
                         f"errors inv_freq {freq_err:.2%}, scale {scale_err:.2%}.")
    return keys, flags


def flags_text(flags: dict[str, float]) -> str:
    """The flags as llama.cpp's CLI and llama-cpp-python take them."""
    if not flags:
        return "no run-time flags needed"
    cli = " ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in flags.items())
    py = ", ".join(f"{k}={v:g}" for k, v in flags.items())
    return f"run with: llama-cli/llama-server {cli}; llama-cpp-python Llama(..., {py})"


def _field_value(field, gguf):
    kind = field.types[0]
    sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
    return field.contents(), kind, sub


def _matches(cfg: dict[str, Any], fields: dict[str, Any], arch: str) -> list[str]:
    """Hyperparameters of the GGUF that contradict the checkpoint (a GGUF of another model)."""
    pairs = (("block_count", "num_hidden_layers"), ("embedding_length", "hidden_size"),
             ("attention.head_count", "num_attention_heads"))
    return [f"{arch}.{key} = {fields[f'{arch}.{key}']} but config.json {name} = {cfg.get(name)}"
            for key, name in pairs if f"{arch}.{key}" in fields and cfg.get(name) is not None
            and fields[f"{arch}.{key}"] != cfg[name]]


def export_gguf(cfg: dict[str, Any], target, source, out: Path) -> dict[str, float]:
    """Write `out`: the GGUF `source` with the rope keys for `target`; return the run-time flags."""
    keys, flags = rope_keys(target)  # refuse before opening anything
    if source is None:
        raise ValueError("export --target gguf rewrites the GGUF llama.cpp's converter made of "
                         "this checkpoint: pass it with --gguf (python convert_hf_to_gguf.py "
                         "CKPT --outfile converted.gguf).")
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"--gguf {source}: no such file; pass the GGUF "
                                "convert_hf_to_gguf.py wrote of this checkpoint.")
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(source)
    except (ValueError, OSError) as err:
        raise ValueError(f"--gguf {source} is not a readable GGUF file ({err}).") from None
    values = {name: _field_value(f, gguf) for name, f in reader.fields.items()}
    arch = values.get("general.architecture", (None,))[0]
    if arch is None:
        raise ValueError(f"--gguf {source} has no general.architecture: not a model GGUF.")
    if arch in _READS_YARN_KEYS:
        raise ValueError(f"export refused: architecture {arch!r} reads its own yarn_* keys in "
                         "llama.cpp; hf_posext writes GGUFs for the architectures that do not.")
    wrong = _matches(cfg, {k: v[0] for k, v in values.items()}, arch)
    if wrong:
        raise ValueError(f"--gguf {source} was not converted from this checkpoint: "
                         + "; ".join(wrong) + ".")
    keys = {f"{arch}.{k}": v for k, v in keys.items()}
    dropped = {f"{arch}.rope.scaling.{k}" for k in _UNREAD} | set(keys)
    with atomic_output(out) as tmp:
        writer = gguf.GGUFWriter(tmp, arch, endianess=reader.endianess)
        for name, (value, kind, sub) in values.items():
            if name == "general.architecture" or name.startswith("GGUF.") or name in dropped:
                continue
            writer.add_key_value(name, value, kind, sub_type=sub)
        _add_rope(writer, keys, gguf)
        for tensor in reader.tensors:
            writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype,
                                   tensor.data.nbytes, tensor.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in reader.tensors:
            writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
        writer.close()
    return flags


def _add_rope(writer, keys: dict[str, Any], gguf) -> None:
    """The keys with the types llama.cpp's loader expects (GGUFWriter's add_rope_* use these)."""
    for name, value in keys.items():
        if isinstance(value, str):
            writer.add_key_value(name, value, gguf.GGUFValueType.STRING)
        elif name.endswith("original_context_length"):
            writer.add_key_value(name, int(value), gguf.GGUFValueType.UINT32)
        else:
            if not math.isfinite(value):
                raise ValueError(f"{name} = {value}: not a finite number.")
            writer.add_key_value(name, float(value), gguf.GGUFValueType.FLOAT32)

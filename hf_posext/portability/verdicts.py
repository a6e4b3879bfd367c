"""`hf_posext.check` / `hf-posext check PATH`: does each reader run the checkpoint's rope as it means?
(docs/portability.md, "Verdicts")

What a checkpoint *means* is its hf_posext method (the `config.hf_posext` entry, or the rope
config read as an hf_posext method), computed by `hf_posext.rope.methods`. What each reader *runs*
is re-derived from its source in `hf_posext.portability.engines`. Compared at the trained length L, midway
and at s·L (dynamic methods change with length), each reader gets one verdict:

- exact: inv_freq and scale equal to float noise (relative error <= 1e-5);
- ignored: the reader runs plain RoPE with the original base (the extension is lost);
- different: anything else, with the max relative inv_freq error and scale error;
- refused: the reader raises on load (unknown rope type);
- broken: the reader loads it but computes NaN or crashes (vLLM's `dynamic` table past L, a
  non-finite value in the config);
- lost: an attention-level method (`hf_posext_attention` entry, `attn_implementation:
  hf_posext`): the reader runs plain attention, whatever its rope verdict;
- n/a: transformers' own llama3 / longrope, not an hf_posext method, in an engine not measured
  (transformers itself reads them exactly).

`export` (hf_posext/portability/exporting.py) writes the form a named reader runs exactly, or refuses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from . import config_audit, dual_chunk, engines, portable, readers
from .meaning import TOLERANCE, Meaning, errors, meaning_of
from ..attention.interface import CONFIG_KEY as ATTENTION_KEY, IMPLEMENTATION
from ..rope.config import RopeExtensionConfig


@dataclass(frozen=True)
class Verdict:
    reader: str  # the reader's id (readers.py): "vllm-07b12f1"
    status: str  # exact | different | ignored | refused | broken | lost | n/a
    freq_error: float | None = None
    scale_error: float | None = None
    detail: str = ""

    def cell(self) -> str:
        if self.status == "different":
            parts = [f"{name} {err:.2%}" for name, err in (("inv_freq", self.freq_error),
                                                           ("scale", self.scale_error))
                     if err > TOLERANCE]
            return f"different ({', '.join(parts)})"
        return self.status

    @property
    def name(self) -> str:
        """What the CLI and the tables print for the reader (readers.py)."""
        return readers.name(self.reader)

    def line(self) -> str:
        return f"{self.name:<17} {self.cell()}" + (f" — {self.detail}" if self.detail else "")


def load_config(model_or_path) -> dict[str, Any]:
    """config.json of a checkpoint folder or file, or the config of a model / config object."""
    if isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"{model_or_path}: no config.json there; pass a checkpoint "
                                    "folder (as written by save_pretrained) or its config.json.")
        try:
            cfg = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path} is not valid JSON ({err}); restore it from the checkpoint "
                             "you saved.") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{path} holds a {type(cfg).__name__}, not a config object.")
    else:
        config = getattr(model_or_path, "config", model_or_path)
        cfg = config.to_dict()
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers: the decoder's settings
        cfg = {**cfg, **cfg["text_config"]}
    cfg = with_class_defaults(cfg)
    if not isinstance(cfg.get("max_position_embeddings"), (int, float)) \
            or isinstance(cfg.get("max_position_embeddings"), bool):
        raise ValueError(f"config has no numeric max_position_embeddings (got "
                         f"{cfg.get('max_position_embeddings')!r}); check reads RoPE decoder "
                         "configs as transformers saves them.")
    return cfg


_DEFAULTED = ("max_position_embeddings", "head_dim")


def class_defaults(model_type) -> dict[str, Any]:
    """The defaults transformers' own config class for `model_type` fills in (no Hub access):
    max_position_embeddings, `rope_theta` (its global θ; per-layer-type Gemma 3: the
    full-attention one) and head_dim where it is a constant of the family (Gemma 3: 256), not
    hidden_size / heads of the default sizes (Llama). {} when transformers does not know the type."""
    from transformers import AutoConfig
    try:
        data = AutoConfig.for_model(str(model_type)).to_dict()
    except (ValueError, KeyError, TypeError):
        return {}
    rope = data.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope) if isinstance(rope.get("full_attention"), dict) else rope
    out = {"max_position_embeddings": data.get("max_position_embeddings"),
           "rope_theta": data.get("rope_theta") or rope.get("rope_theta")}
    hidden, heads = data.get("hidden_size"), data.get("num_attention_heads")
    if data.get("head_dim") and not (hidden and heads and data["head_dim"] == hidden // heads):
        out["head_dim"] = data["head_dim"]
    return {k: v for k, v in out.items() if v is not None}


def with_class_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """`cfg` with what its transformers config class fills in for keys config.json leaves out
    (Gemma 3's released text_config states neither max_position_embeddings nor rope_theta):
    what transformers, and vLLM / SGLang / llama.cpp's converter, which load config.json through
    it, run."""
    stated_theta = "rope_theta" in cfg or any(
        isinstance(cfg.get(k), dict) and "rope_theta" in cfg[k] for k in ("rope_scaling", "rope_parameters"))
    missing = [k for k in _DEFAULTED if k not in cfg] + ([] if stated_theta else ["rope_theta"])
    if not missing or "model_type" not in cfg:
        return cfg
    defaults = class_defaults(cfg["model_type"])
    return {**cfg, **{k: defaults[k] for k in missing if k in defaults}}


def attention_entry(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The attention-level method a checkpoint carries (attention/install.py writes the entry and
    `attn_implementation: hf_posext`); either one alone counts, so a half-edited config is not
    taken for plain attention."""
    entry = cfg.get(ATTENTION_KEY)
    if isinstance(entry, dict):
        return entry
    if cfg.get("attn_implementation") == IMPLEMENTATION or entry is not None:
        return {"method": f"unreadable ({ATTENTION_KEY} = {entry!r})"}
    return None


def meaning(cfg: dict[str, Any]) -> Meaning:
    """The checkpoint's intended rope (and attention method). Raises engines.NotApplicable for
    llama3 / longrope."""
    found = _rope_meaning(cfg)
    return replace(found, attention=attention_entry(cfg))


def _rope_meaning(cfg: dict[str, Any]) -> Meaning:
    rope = engines.v5_rope(cfg)
    dim, max_pos = engines.read_rotary_dim(cfg, rope), cfg["max_position_embeddings"]
    if rope["rope_type"] in ("llama3", "longrope"):
        # transformers' own types, whatever wrote them: a method saved as longrope (CoPE, any
        # static method on Phi-3, `search`) is read by each engine's longrope code, which the
        # engine measurements cover (measured.case_of), not an hf_posext formula to re-derive
        raise engines.NotApplicable(rope["rope_type"])
    if cfg.get(portable.ENTRY) is not None:
        spec, theta = portable.spec_of_entry(cfg[portable.ENTRY])
    elif rope["rope_type"] == "default":
        return Meaning(None, float(rope["rope_theta"]), dim, (max_pos,))
    else:
        try:
            spec = RopeExtensionConfig.from_rope_dict(rope, max_pos)
        except ValueError as err:  # e.g. yarn with DeepSeek's mscale keys: not one of ours
            raise engines.NotApplicable(f"{rope['rope_type']} ({err})") from None
        theta = float(rope["rope_theta"])
    return meaning_of(spec, theta, dim, max_pos)


def verdict(reader: str, cfg: dict[str, Any], target: Meaning) -> Verdict:
    """The rope verdict; an attention-level method then makes it "lost" in every reader that
    runs plain attention (all of them without hf_posext)."""
    rope = _rope_verdict(reader, cfg, target)
    if target.attention is None or rope.status in ("refused", "broken", "n/a"):
        return rope
    method = target.attention.get("method")
    if reader == readers.SGLANG.id and method == "dual_chunk":  # SGLang's own DCA (portability/dual_chunk.py)
        status, detail = dual_chunk.sglang_reading(cfg, target)
        return Verdict(reader, status, rope.freq_error, rope.scale_error, detail)
    if reader == readers.TRANSFORMERS_5.id:  # config.json's attn_implementation is read on load
        return Verdict(reader, "refused", rope.freq_error, rope.scale_error,
                       f"without hf_posext: 'Specified attn_implementation=\"hf_posext\" is not "
                       f"supported'; loading with attn_implementation='sdpa' runs plain "
                       f"attention ({method!r} lost)")
    why = ("4.57 drops attn_implementation on load" if reader == readers.TRANSFORMERS_4.id
           else "reads no attention method from config.json")
    return Verdict(reader, "lost", rope.freq_error, rope.scale_error,
                   f"{why}: runs plain attention, {method!r} is lost (rope: {rope.cell()})")


def _finite(reading: engines.Reading, lengths) -> bool:
    for length in lengths:
        inv, scale = reading.freqs(length)
        if not (torch.isfinite(inv).all() and math.isfinite(scale)):
            return False
    return True


def _rope_verdict(reader: str, cfg: dict[str, Any], target: Meaning) -> Verdict:
    try:
        reading = readers.get(reader).read(cfg)
    except engines.NotApplicable as err:
        return Verdict(reader, "n/a", detail=f"transformers' own {err}")
    except KeyError as err:
        return Verdict(reader, "refused", detail=f"KeyError: missing {err}")
    except (TypeError, ValueError) as err:  # e.g. a factor "4" or null edited into the config
        return Verdict(reader, "broken", detail=f"cannot compute its rope from the config: {err}")
    if reading.refused:
        return Verdict(reader, "refused", detail=reading.refused)
    if not _finite(reading, target.lengths):
        return Verdict(reader, "broken", detail="non-finite frequencies or scale from the config's "
                                                "rope (NaN logits)")
    rotated = 2 * len(reading.freqs(target.lengths[0])[0])
    if rotated != target.dim:   # a partial rotary factor read otherwise: no frequency compares
        return Verdict(reader, "different", math.inf, 0.0,
                       f"rotates {rotated} dims of each head where the checkpoint means {target.dim}")
    freq_err, scale_err = errors(reading, target)
    if reading.broken:
        return Verdict(reader, "broken", freq_err, scale_err, reading.broken)
    if freq_err <= TOLERANCE and scale_err <= TOLERANCE:
        return Verdict(reader, "exact", freq_err, scale_err)
    plain = Meaning(None, target.theta, target.dim, target.lengths)
    if max(errors(reading, plain)) <= TOLERANCE:
        return Verdict(reader, "ignored", freq_err, scale_err,
                       reading.note or "runs plain RoPE: the extension is lost")
    return Verdict(reader, "different", freq_err, scale_err, reading.note)


def check(model_or_path, ids=None) -> list[Verdict]:
    """One verdict per reader id (all of `readers.IDS` by default) for a checkpoint."""
    cfg = load_config(model_or_path)
    try:
        target = meaning(cfg)
    except engines.NotApplicable as err:
        # transformers' own types (llama3, longrope): transformers defines what they mean, so
        # it reads them exactly; for the engines there is nothing to re-derive against (the
        # measured releases replace this with what they did: `measured.overlay`)
        return [Verdict(r, "exact", detail=f"transformers' own {err}, read natively")
                if readers.is_transformers(r) else Verdict(r, "n/a", detail=f"transformers' own {err}")
                for r in ids or readers.IDS]
    return [verdict(r, cfg, target) for r in ids or readers.IDS]


def check_report(model_or_path, view=None) -> str:
    """The text `hf-posext check` prints: the meaning, contradictions in config.json, one
    verdict per reader, then warnings (config_audit). `view(cfg, verdicts)` may replace verdicts
    (the CLI passes `measured.overlay`: measured engine releases in place of their
    re-derivations)."""
    cfg = load_config(model_or_path)
    found = config_audit.problems(cfg)
    if any("non-finite" in line for line in found):  # no verdict means anything then
        raise ValueError("; ".join(line.removeprefix("error: ") for line in found))
    try:
        target = meaning(cfg)
        label = target.label
    except engines.NotApplicable as err:
        target, label = None, f"transformers' own {err}"
        entry = cfg.get(portable.ENTRY)
        if isinstance(entry, dict) and "method" in entry:   # e.g. cope, saved as longrope
            label = f"{entry['method']} (factor {entry.get('factor')}) saved as {label}"
    except (ValueError, TypeError) as err:
        raise ValueError("; ".join(found + [f"cannot read what the checkpoint means: {err}"])) from None
    verdicts = check(model_or_path)
    verdicts = view(cfg, verdicts) if view else verdicts
    folder = Path(model_or_path) if isinstance(model_or_path, (str, Path)) else None
    folder = folder if folder is None or folder.is_dir() else folder.parent
    rows = [f"{model_or_path}: {label}"] + ["  " + line for line in found]
    rows += ["  " + v.line() for v in verdicts]
    if any(v.status in ("different", "ignored") for v in verdicts):
        rows.append("  (hf-posext export PATH OUT --target READER writes the exact form a reader "
                    "runs, or says why it cannot)")
    if not found:
        rows += ["  " + line for line in config_audit.warnings(cfg, target, folder)]
    return "\n".join(rows)

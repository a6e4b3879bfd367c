"""`hf_posext.check` / `hf-posext check PATH`: does each reader run the checkpoint's rope as it means?
(docs/portability.md, "Verdicts")

What a checkpoint *means* is its hf_posext method (the `config.hf_posext` block, or the rope
config read as an hf_posext method), computed by `hf_posext.methods`. What each reader *runs*
is re-derived from its source in `hf_posext.engines`. Compared at the trained length L, midway
and at s·L (dynamic methods change with length), each reader gets one verdict:

- exact: inv_freq and scale equal to float noise (relative error <= 1e-5);
- ignored: the reader runs plain RoPE with the original base (the extension is lost);
- different: anything else, with the max relative inv_freq error and scale error;
- refused: the reader raises on load (unknown rope type);
- n/a: transformers' own llama3 / longrope, not an hf_posext method.

`export` (hf_posext/exporting.py) writes the form a named reader runs exactly, or refuses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import engines, portable
from .config import RopeExtensionConfig
from .registry import compute

TOLERANCE = 1e-5


@dataclass(frozen=True)
class Verdict:
    reader: str
    status: str  # exact | different | ignored | refused | n/a
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

    def line(self) -> str:
        return f"{self.reader:<17} {self.cell()}" + (f" — {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Meaning:
    """What a checkpoint means: its method (None: plain RoPE), original base, dim, lengths."""
    spec: RopeExtensionConfig | None
    theta: float
    dim: int
    lengths: tuple[int, ...]

    def freqs(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        if self.spec is None:
            return engines.plain(self.dim, self.theta), 1.0
        inv, scale = compute(self.spec, self.dim, self.theta, seq_len)
        return inv.double(), float(scale)

    @property
    def label(self) -> str:
        if self.spec is None:
            return "plain RoPE"
        knobs = ", ".join(f"{k}={v:g}" for k, v in self.spec.knobs.items())
        return f"{self.spec.method} (factor {self.spec.factor:g}{', ' + knobs if knobs else ''})"


def load_config(model_or_path) -> dict[str, Any]:
    """config.json of a checkpoint folder or file, or the config of a model / config object."""
    if isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"{model_or_path}: no config.json there; pass a checkpoint "
                                    "folder (as written by save_pretrained) or its config.json.")
        cfg = json.loads(path.read_text())
    else:
        config = getattr(model_or_path, "config", model_or_path)
        cfg = config.to_dict()
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers: the decoder's settings
        cfg = {**cfg, **cfg["text_config"]}
    return cfg


def meaning(cfg: dict[str, Any]) -> Meaning:
    """The checkpoint's intended rope. Raises engines.NotApplicable for llama3 / longrope."""
    rope = engines.v5_rope(cfg)
    dim, max_pos = engines.rotary_dim(cfg, rope), cfg["max_position_embeddings"]
    if cfg.get(portable.BLOCK) is not None:
        spec, theta = portable.spec_of_block(cfg[portable.BLOCK])
    elif rope["rope_type"] == "default":
        return Meaning(None, float(rope["rope_theta"]), dim, (max_pos,))
    elif rope["rope_type"] in ("llama3", "longrope"):
        raise engines.NotApplicable(rope["rope_type"])
    else:
        try:
            spec = RopeExtensionConfig.from_rope_dict(rope, max_pos)
        except ValueError as err:  # e.g. yarn with DeepSeek's mscale keys: not one of ours
            raise engines.NotApplicable(f"{rope['rope_type']} ({err})") from None
        theta = float(rope["rope_theta"])
    return meaning_of(spec, theta, dim, max_pos)


def meaning_of(spec: RopeExtensionConfig, theta: float, dim: int, max_pos: int) -> Meaning:
    """`spec` on base `theta`, compared at L, midway and s·L (where dynamic methods differ)."""
    if spec.factor == 1.0:
        return Meaning(None, theta, dim, (max_pos,))
    L = spec.original_max_position_embeddings or max_pos
    return Meaning(spec, theta, dim, tuple(sorted({L, round(L * (1 + spec.factor) / 2),
                                                   round(L * spec.factor)})))


def errors(reading: engines.Reading, target: Meaning) -> tuple[float, float]:
    """Max relative inv_freq error and scale error of `reading` against `target` over its lengths."""
    freq_err = scale_err = 0.0
    for length in target.lengths:
        inv, scale = reading.freqs(length)
        ref, ref_scale = target.freqs(length)
        freq_err = max(freq_err, ((inv.double() - ref).abs() / ref).max().item())
        scale_err = max(scale_err, abs(scale - ref_scale) / ref_scale)
    return freq_err, scale_err


def verdict(reader: str, cfg: dict[str, Any], target: Meaning) -> Verdict:
    try:
        reading = engines.READERS[reader](cfg)
    except engines.NotApplicable as err:
        return Verdict(reader, "n/a", detail=f"transformers' own {err}")
    except KeyError as err:
        return Verdict(reader, "refused", detail=f"KeyError: missing {err}")
    if reading.refused:
        return Verdict(reader, "refused", detail=reading.refused)
    freq_err, scale_err = errors(reading, target)
    if freq_err <= TOLERANCE and scale_err <= TOLERANCE:
        return Verdict(reader, "exact", freq_err, scale_err)
    plain = Meaning(None, target.theta, target.dim, target.lengths)
    if max(errors(reading, plain)) <= TOLERANCE:
        return Verdict(reader, "ignored", freq_err, scale_err,
                       reading.note or "runs plain RoPE: the extension is lost")
    return Verdict(reader, "different", freq_err, scale_err, reading.note)


def check(model_or_path, readers=None) -> list[Verdict]:
    """One verdict per reader (all of `engines.READERS` by default) for a checkpoint."""
    cfg = load_config(model_or_path)
    try:
        target = meaning(cfg)
    except engines.NotApplicable as err:
        return [Verdict(r, "n/a", detail=f"transformers' own {err}") for r in readers or engines.READERS]
    return [verdict(r, cfg, target) for r in readers or engines.READERS]


def report(model_or_path, view=None) -> str:
    """The text `hf-posext check` prints; `view(cfg, verdicts)` may replace verdicts (the CLI
    passes `measured.overlay`: measured engine releases in place of their re-derivations)."""
    cfg = load_config(model_or_path)
    try:
        label = meaning(cfg).label
    except engines.NotApplicable as err:
        label = f"transformers' own {err}"
    verdicts = check(model_or_path)
    verdicts = view(cfg, verdicts) if view else verdicts
    rows = [f"{model_or_path}: {label}"] + ["  " + v.line() for v in verdicts]
    if any(v.status in ("different", "ignored") for v in verdicts):
        rows.append("  (hf-posext export PATH OUT --target READER writes the exact form a reader "
                    "runs, or says why it cannot)")
    return "\n".join(rows)

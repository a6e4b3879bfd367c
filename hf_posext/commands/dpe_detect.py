"""`hf-posext dpe-detect`: DPE's detection on your model (hf_posext/search/dpe.py): each dimension
group's best position scale by a 4-needle probe at the target length, and with --top-dims the key
dimensions by their q·k 2-norm contribution. Writes a JSON file the method reads:

    hf-posext dpe-detect --target-length 16k --out dpe-16k.json
    hf-posext eval --methods dpe --knobs dpe:group_scales=@dpe-16k.json ...

Each probe is logged beside --out (`<out>.log.jsonl`) as it finishes; rerun the same command to
resume. Every option is checked, and the tuning text tokenised, before the model loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from ..portability.atomic import atomic_write
from ..data.documents import TextSource, load_documents
from ..data.embedded import DEFAULT_MODEL
from ..evaluation.shared.data import TokenCache, select_documents
from ..evaluation.shared.inputs import InputError, check_device, check_model_arg, parse_length
from ..rope.compat import rotary_dim, text_config
from ..search.dpe import GROUPS, component_norms, detect, select_key_dims
from . import session
from .auto_dtype import auto_inputs, fast_dtype
from .model_args import ModelSpec, load_model_from, load_tokenizer_from

DEFAULT_TUNING = "embedded:shakespeare/king-lear"
DEFAULT_OUT = "hf_posext_results/dpe-detect.json"   # beside the other commands' hf_posext_results/COMMAND


def add_subcommand(sub) -> None:
    p = sub.add_parser("dpe-detect", help="DPE's per-group scales (and key dimensions) for your model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"Hub id, local folder, or {DEFAULT_MODEL} (default)")
    p.add_argument("--gguf-file", default=None, help="GGUF file name inside --model")
    p.add_argument("--dataset", default=DEFAULT_TUNING,
                   help=f"the probe's text (default {DEFAULT_TUNING}); never the text you evaluate on")
    session.add_source_args(p)
    p.add_argument("--max-docs", type=int, default=1, help="probe documents (default 1)")
    session.add_target_length_arg(p)
    p.add_argument("--window", type=int, default=None,
                   help="DPE's local window (default min(1024, L/2), the authors' 1024)")
    p.add_argument("--groups", type=int, default=GROUPS, help=f"dimension groups (default {GROUPS})")
    p.add_argument("--shortest", default=None,
                   help="probe scales T/l for l = T, T/2, ... down to this (default: the window)")
    p.add_argument("--top-dims", type=int, default=None,
                   help="also select this many key dimensions per head by q·k 2-norm (the authors: "
                        "48 of 64); default: every dimension")
    p.add_argument("--out", default=None,
                   help="the JSON file to write (default hf_posext_results/dpe-detect.json)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    session.add_dtype_arg(p)
    p.set_defaults(run=run)


def _checked(args) -> tuple[int, int | None, int]:
    check_device(args.device)
    out = Path(args.out or DEFAULT_OUT)
    if out.is_dir() or out.suffix != ".json":
        raise InputError(f"--out {out} must name a .json file.")
    for flag, value in (("--max-docs", args.max_docs), ("--groups", args.groups),
                        ("--window", args.window), ("--top-dims", args.top_dims)):
        if value is not None and value <= 0:
            raise InputError(f"{flag} must be a positive integer, got {value}.")
    length = session.target_length_flag(args)
    shortest = parse_length(args.shortest, "--shortest") if args.shortest else None
    # the model's config only (no weights): its trained length L
    config = check_model_arg(args.model, args.gguf_file, DEFAULT_MODEL, read_default=True)
    L = int(config.max_position_embeddings)
    window = args.window or min(1024, L // 2)
    if window >= L or length <= L:
        raise InputError(f"dpe-detect needs --window below the trained length {L} and --target-length "
                         f"above it, got window {window}, length {length}.")
    half = rotary_dim(text_config(config)) // 2
    if half % args.groups:
        raise InputError(f"--groups {args.groups} cannot split the model's {half} rotary frequencies "
                         f"evenly; use a divisor of {half} (the authors use 8).")
    if args.top_dims is not None and args.top_dims > half:
        raise InputError(f"--top-dims {args.top_dims} is more than the model's {half} rotary "
                         "frequencies per head (the authors keep 48 of 64).")
    return length, shortest, window


def run(args) -> int:
    length, shortest, window = _checked(args)
    source = TextSource(args.dataset, args.dataset_config, args.split, args.column)
    documents = load_documents(source, streaming=True)
    spec = ModelSpec.from_args(args)
    tokenizer = load_tokenizer_from(spec)
    docs = select_documents(documents, TokenCache(tokenizer), length + 1, args.max_docs)
    if spec.dtype == "auto":   # measured before the weights load, as the grid commands do
        spec = dataclasses.replace(spec, dtype=fast_dtype(spec.device, **auto_inputs(spec.model, spec.gguf_file)))
    model = load_model_from(spec)
    L = int(model.config.max_position_embeddings)
    key_dims = None
    if args.top_dims is not None:   # the reference samples at lengths up to L: one L-token text
        ids = docs.docs[0][:L]
        key_dims = select_key_dims(component_norms(model, torch.as_tensor(ids, dtype=torch.long)),
                                   args.top_dims)
    out = Path(args.out or DEFAULT_OUT)
    try:
        result = detect(model, tokenizer, docs.docs, length, window=window, groups=args.groups,
                        key_dims=key_dims, shortest=shortest,
                        log_path=out.with_suffix(".log.jsonl"),
                        progress=lambda line: print(line, file=sys.stderr))
    except ValueError as err:
        raise InputError(str(err)) from None
    result["data"] = source.label
    result["dtype"] = spec.dtype
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(result, indent=1) + "\n")
    print(f"dpe group_scales {result['group_scales']} (window {window}, target {length}); "
          f"written to {out}")
    return 0

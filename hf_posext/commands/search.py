"""`hf-posext search`: find a portable `longrope` config for a target length (hf_posext/search/).

    hf-posext search --dataset embedded:shakespeare/king-lear --target-length 16k --out lear-16k \\
        --budget 30m --proxy-length 4k
    hf-posext search --dataset embedded:shakespeare/king-lear --dataset reference.txt ...  # two kinds

Every option is checked, and the tuning text tokenised, before the model loads. The checkpoint
(config + weights + tokenizer) goes to --out, the search log to --out/search_log.jsonl; rerun
the same command to resume from the log.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys

from ..data.documents import TextSource, load_documents
from ..evaluation.shared.data import TokenCache, TokenizedDocs, select_documents
from ..evaluation.shared.inputs import InputError, parse_length, parse_wall_time
from ..search import SHORT_FACTORS, Evolution, Gradient, SearchOptions, run_search, save_best
from ..search.needle import OBJECTIVES, needles
from . import session
from .model_args import ModelSpec, load_model_from, load_tokenizer_from

LOG_NAME = "search_log.jsonl"
DEFAULT_TUNING = "embedded:shakespeare/king-lear"


def add_subcommand(sub) -> None:
    p = sub.add_parser("search", help="search per-frequency rope factors (a portable longrope config)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    session.add_model_args(p)
    p.add_argument("--dataset", action="append", default=None,
                   help="tuning text, the sources of `eval` (default embedded:shakespeare/king-lear); "
                        "repeat it to tune on several kinds of text at once (--max-docs from each); "
                        "never the text you evaluate on")
    session.add_source_args(p)
    p.add_argument("--max-docs", type=int, default=1,
                   help="tuning documents from each --dataset (default 1, as LongRoPE: few)")
    session.add_target_length_arg(p)
    p.add_argument("--proxy-length", default=None,
                   help="tokens per gradient step: spans at their true positions spread over the "
                        "target length (default: the whole target length)")
    p.add_argument("--objective", choices=OBJECTIVES, default="perplexity",
                   help="what the search minimises: perplexity (next-token NLL over the proxy spans, "
                        "default) or needle (LongRoPE2's needle-driven loss: the answer tokens only "
                        "of needle documents built from the tuning text, one per document and depth "
                        "0, 0.5, 1; the final check stays plain perplexity)")
    p.add_argument("--budget", default="60m",
                   help="wall time for the whole run, baseline included: 30m, 2h, 90s (default 60m)")
    session.add_renamed_arg(p, "--budget-minutes", "--budget with a unit, e.g. --budget 30m")
    p.add_argument("--max-steps", type=int, default=None,
                   help="stop after this many steps (evolution: generations)")
    p.add_argument("--lr", type=float, default=0.05, help="gradient: Adam step size on the log-factors (default 0.05)")
    p.add_argument("--algorithm", choices=("gradient", "evolution"), default="gradient",
                   help="gradient: Adam on the factors, one backward per step (default); evolution: "
                        "LongRoPE's evolutionary search, one forward per candidate")
    p.add_argument("--population", type=int, default=8, help="evolution: candidates per generation (default 8)")
    p.add_argument("--parents", type=int, default=3, help="evolution: best candidates bred from (default 3)")
    p.add_argument("--sigma", type=float, default=0.05,
                   help="evolution: std of a mutation step on a log-factor (default 0.05)")
    session.add_seed_arg(p, "evolution")
    p.add_argument("--short-factors", choices=SHORT_FACTORS, default="same",
                   help="factors for contexts <= the trained length: same (the searched ones at "
                        "every length, default) or identity (LongRoPE's separate short set as plain "
                        "RoPE: no change within the trained length but the attention factor; "
                        "transformers switches sets by length, so generate with hf_posext.generate)")
    p.add_argument("--out", default=None,
                   help="output folder: checkpoint + search_log.jsonl (default hf_posext_results/search)")
    p.add_argument("--no-final-check", action="store_true",
                   help="do not score the best config over the whole target length at the end "
                        "(saves one target-length forward; the printed figures are then the proxy's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def _checked(args) -> tuple[int, int | None, list[str], float]:
    session.check_model(args)
    session.seed_flag(args)
    length = session.target_length_flag(args)
    proxy = parse_length(args.proxy_length, "--proxy-length") if args.proxy_length else None
    if proxy is not None and proxy > length:
        raise InputError(f"--proxy-length {proxy} is longer than --target-length {length}; use at most {length}.")
    if proxy is not None and proxy < 64:
        raise InputError(f"--proxy-length {proxy} is too short to score anything; use e.g. 4k.")
    minutes = parse_wall_time(args.budget) / 60
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise InputError(f"--lr must be a positive number, got {args.lr}.")
    if args.population < 2:
        raise InputError(f"--population must be at least 2, got {args.population}.")
    if not 1 <= args.parents <= args.population:
        raise InputError(f"--parents must be between 1 and --population ({args.population}), "
                         f"got {args.parents}.")
    if not (args.sigma > 0 and math.isfinite(args.sigma)):
        raise InputError(f"--sigma must be a positive number, got {args.sigma}.")
    for flag, value in (("--max-docs", args.max_docs), ("--max-steps", args.max_steps)):
        if value is not None and value <= 0:
            raise InputError(f"{flag} must be a positive integer, got {value}.")
    names = args.dataset or [DEFAULT_TUNING]
    if len(set(names)) < len(names):
        raise InputError(f"--dataset names a source twice ({', '.join(names)}); name each once.")
    out = session.results_dir(args)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; name a folder.")
    if out.is_dir() and any(out.iterdir()) and not (out / LOG_NAME).is_file():
        raise InputError(f"--out {out} is a non-empty folder without a {LOG_NAME}; choose an empty "
                         "or new folder (an existing search folder resumes).")
    return length, proxy, names, minutes


def combined(selected: list[TokenizedDocs]) -> TokenizedDocs:
    """The documents of several sources as one set; one source keeps its own fingerprint (so a
    search log written before --dataset could repeat still resumes)."""
    if len(selected) == 1:
        return selected[0]
    key = hashlib.sha256(",".join(t.fingerprint for t in selected).encode()).hexdigest()[:12]
    return TokenizedDocs([d for t in selected for d in t.docs], sum(t.seen for t in selected), key,
                         [n for t in selected for n in t.names])


def run(args) -> int:
    # every error reaches cli.main: one line, exit 2 for bad input (before the model loads)
    length, proxy, names, minutes = _checked(args)
    sources = [TextSource(name, args.dataset_config, args.split, args.column) for name in names]
    documents = [load_documents(source, streaming=True) for source in sources]  # each checked now
    spec = ModelSpec.from_args(args)
    tokenizer = load_tokenizer_from(spec)
    cache = TokenCache(tokenizer)
    docs = combined([select_documents(d, cache, length + 1, args.max_docs) for d in documents])
    print(f"data: {'; '.join(s.label for s in sources)}: {len(docs.docs)} document(s) of >= "
          f"{length + 1} tokens", file=sys.stderr)
    # built before the model loads: a proxy too short for a needle is an input error
    try:
        needle_docs = needles(docs.docs, tokenizer, length, proxy) if args.objective == "needle" else []
    except ValueError as err:
        raise InputError(str(err)) from None
    model = load_model_from(spec)
    out = session.results_dir(args)
    options = SearchOptions(length, proxy, minutes, docs.fingerprint,
                            final_check=not args.no_final_check, progress=not args.no_progress,
                            objective=args.objective, needles=needle_docs)
    if args.algorithm == "evolution":
        strategy = Evolution(args.population, args.parents, args.sigma, seed=session.seed_flag(args),
                             max_generations=args.max_steps)
    else:
        strategy = Gradient(args.lr, args.max_steps)
    result = run_search(model, docs.docs, out / LOG_NAME, options, strategy)
    rope = save_best(model, tokenizer, result, out, length, short_factors=args.short_factors)
    print(f"best: {result.source} after {result.steps} {strategy.kind}(s); saved as rope_type "
          f"{rope['rope_type']!r} in {out}")
    base = f"unpatched sliding-window baseline {math.exp(result.baseline_nll):.4f}"
    if result.checked:
        print(f"tuning text at {length}: perplexity {result.perplexity:.4f}; {base}; ratio "
              f"{result.ratio:.4f}")
    elif args.objective == "needle":   # the objective is not a perplexity of the text
        print(f"needle documents: answer-token loss {result.proxy_nll:.4f} (--no-final-check: no "
              f"perplexity); {base} at {length}")
    else:  # a proxy figure is not comparable with the full-length baseline: no ratio
        print(f"tuning text, {proxy}-token proxy: perplexity {result.perplexity:.4f} "
              f"(--no-final-check: no full-length figure, no ratio); {base} at {length}")
    return 0

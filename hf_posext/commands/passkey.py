"""`hf-posext passkey`: passkey retrieval accuracy by method, length and depth — the retrieval
suite's single_needle task on RULER's noise haystack (hf_posext/evaluation/passkey.py; the
whole suite: `hf-posext retrieval`)."""

from __future__ import annotations

import argparse

from ..evaluation.shared.distributed import Ranks
from ..evaluation.shared.inputs import InputError
from ..evaluation.passkey import build_prompt, evaluate_passkey, passkey_for_seed
from ..evaluation.shared.results import plot_passkey_heatmap, print_table
from ..evaluation.retrieval.settings import DEFAULT_TRIALS, RetrievalGrid
from . import session
from .model_args import load_tokenizer_from


def add_subcommand(sub) -> None:
    pk = sub.add_parser("passkey", help="passkey retrieval accuracy",
                        description="A five-digit key hidden at each depth of filler text, greedy "
                                    "decoding, accuracy over seeds per (method, length, depth).")
    session.add_run_args(pk)
    g = pk.add_argument_group("passkey")
    session.add_depths_arg(g)
    session.add_trials_args(g, DEFAULT_TRIALS)
    g.add_argument("--seeds", default=None, help=argparse.SUPPRESS)   # the old flag: refused with the fix
    pk.set_defaults(run=run)


def run(args) -> int:
    ranks = Ranks()
    methods, lengths, factors, knobs = session.grid_flags(args)
    if args.seeds is not None:
        raise InputError(f"passkey has no --seeds: it takes --trials N (seeds 0 .. N-1) and --seed S "
                         f"(the first), as retrieval does; e.g. --trials {args.seeds} for --seeds "
                         f"{args.seeds}.")
    depths, seeds = session.depths_flag(args), session.trial_seeds(args)
    grid, _ = session.without_unfit(RetrievalGrid(methods, lengths, depths, seeds=seeds, factors=factors,
                                                  knobs=knobs), args, ranks)
    spec = session.model_spec(args, ranks, "passkey")
    tokenizer = load_tokenizer_from(spec)
    try:
        build_prompt(tokenizer, min(lengths), 0.5, passkey_for_seed(0))
    except ValueError as err:
        raise InputError(f"--lengths: {err}") from None
    store, rows = session.evaluate_in_store(args, spec, "passkey", ranks, lambda model, view, progress, info: (
        evaluate_passkey(model, tokenizer, grid, store=view, ranks=ranks, progress=progress, run=info)))
    if not ranks.is_main:
        return 0
    rows = session.folder_rows(store.rows, rows)
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

"""`hf-posext retrieval`: RULER-style retrieval accuracy by task, method, length and depth
(docs/retrieval.md).

    hf-posext retrieval --lengths 8k,16k --methods yarn,leaky_rerope --tasks single_needle,multi_key
    hf-posext retrieval --dataset embedded:shakespeare --trials 50 --depths 0,0.5,1

Each cell runs --trials seeded trials (with --sequential, at most --trials, in looks of --look):
accuracy with its Wilson 95 % interval, and each method's effective length. Every flag is checked, and the prompts built, before the model loads.
"""

from __future__ import annotations

import argparse
import functools

from ..evaluation.shared.distributed import Ranks
from ..evaluation.shared.inputs import InputError
from ..evaluation.retrieval import TASKS, RetrievalGrid, build_cell, evaluate_retrieval, get_task
from ..evaluation.retrieval.blocks import merge_blocks, trials_text
from ..evaluation.retrieval.haystack import NOISE_NAME, load_haystack
from ..evaluation.retrieval.plots import format_summary, plot_all, summary
from ..evaluation.retrieval.settings import DEFAULT_MARGIN, DEFAULT_TRIALS
from ..evaluation.shared.summary import retrieval_section, write_summary
from . import retrieval_engine, retrieval_plan, session
from .model_args import load_tokenizer_from


def add_subcommand(sub) -> None:
    p = sub.add_parser("retrieval", help="RULER-style retrieval accuracy (needle tasks, Wilson intervals)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    session.add_run_args(p)
    g = p.add_argument_group("retrieval")
    g.add_argument("--tasks", default="single_needle",
                   help=f"{', '.join(TASKS)}, or all (default single_needle)")
    session.add_depths_arg(g)
    session.add_trials_args(g, None, f" (default {DEFAULT_TRIALS}; --sequential: the most, in looks of --look)")
    g.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"effective length's tolerance below the base within L (default {DEFAULT_MARGIN})")
    g.add_argument("--baseline", action="store_true",
                   help="past L, also ask the unpatched model each prompt cut to its trained window "
                        "(rows `baseline`: what an extension has to beat)")
    g.add_argument("--no-prefix-reuse", action="store_true",
                   help="prefill every trial in full (default: the prefix once per cell)")
    g.add_argument("--dataset", default=NOISE_NAME,
                   help="haystack: noise (RULER's; default) or any `eval --dataset` source")
    retrieval_plan.add_args(p, g)
    session.add_source_args(g)
    retrieval_engine.add_engine_args(p)
    p.set_defaults(run=run, store_name="retrieval")


def retrieval_grid(args, trials: int, tasks: list[str] | None = None,
                   seeds: list[int] | None = None) -> RetrievalGrid:
    """The flags as a validated `RetrievalGrid` (InputError naming the flag); `trials`: the
    seeds each cell may run (`retrieval_plan.plan_from`)."""
    methods, lengths, factors, knobs = session.grid_flags(args)
    depths = session.depths_flag(args)
    if tasks is None:
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        tasks = list(TASKS) if tasks == ["all"] else tasks
        for t in tasks:
            if t not in TASKS:
                raise InputError(f"--tasks: unknown task {t!r}; use {', '.join(TASKS)} or all.")
        if not tasks:
            raise InputError("--tasks is empty.")
    if seeds is None and trials < 1:
        raise InputError(f"--trials must be at least 1, got {trials}.")
    if not 0.0 <= args.margin < 1.0:
        raise InputError(f"--margin must be in [0, 1), got {args.margin}.")
    return RetrievalGrid(methods, lengths, depths, tasks, trials=len(seeds) if seeds else trials,
                         seed=session.seed_flag(args), seeds=seeds, factors=factors, knobs=knobs,
                         haystack=args.dataset, reuse_prefix=not args.no_prefix_reuse,
                         margin=args.margin, baseline=args.baseline)


def prepare(args, grid: RetrievalGrid, ranks: Ranks):
    """Checks, tokenizer and haystack, and every task's shortest prompt: all before the model.
    Returns the grid (less the cells `--methods all` leaves out), the model's spec, tokenizer and
    haystack."""
    # the model's config checked (readable) and kept: the baseline's window is read from it
    grid, config = session.without_unfit(grid, args, ranks, read_default=grid.baseline)
    trained = baseline_window(args, grid, config) if grid.baseline else None
    spec = session.model_spec(args, ranks, args.store_name)
    tokenizer = load_tokenizer_from(spec)
    try:
        haystack = load_haystack(tokenizer, grid.haystack, max(grid.lengths), config=args.dataset_config,
                                 split=args.split, column=args.column)
    except (FileNotFoundError, ValueError) as err:
        raise InputError(f"--dataset: {err}") from None
    for task in grid.tasks:
        try:
            shortest = build_cell(tokenizer, get_task(task), haystack, min(grid.lengths), 0.5, grid.trial_seeds())
        except ValueError as err:
            raise InputError(f"--lengths: {err}") from None
        if trained is not None:   # the instruction and answer beside the window: the same at every length
            try:
                shortest.window(trained)
            except ValueError as err:
                raise InputError(f"--baseline: {err} (the model's trained window); drop --baseline") from None
    return grid, spec, tokenizer, haystack


def baseline_window(args, grid: RetrievalGrid, config) -> int:
    """The baseline's window, the trained length, from the model's config (read before it loads);
    refused when no length is past it (within it the baseline's prompt is the unpatched model's own)."""
    from types import SimpleNamespace

    from ..patcher import trained_length
    trained = trained_length(SimpleNamespace(config=config))
    if max(grid.lengths) <= trained:
        raise InputError(f"--baseline asks the sliding-window baseline past the trained length ({trained:,} "
                         f"tokens); --lengths {args.lengths} has no length past it: add one (e.g. "
                         f"{2 * trained // 1024}k) or drop --baseline.")
    return trained


def run(args) -> int:
    trials, plan = retrieval_plan.plan_from(args)   # --trials, --sequential / --budget: checked first
    if plan is not None and args.engine != "transformers":
        raise InputError(f"--sequential / --budget run on transformers; --engine {args.engine} runs "
                         "fixed trials (--trials): drop one of them.")
    if args.baseline and (plan is not None or args.engine != "transformers"):
        raise InputError("--baseline is a reference asked on the fixed design in transformers; drop "
                         + ("--sequential / --budget" if plan is not None else f"--engine {args.engine}")
                         + " or ask the baseline in a command of its own.")
    grid = retrieval_grid(args, trials)
    ranks = Ranks()
    engine, _ = retrieval_engine.engine_from_args(args, grid) or (None, None)
    grid, spec, tokenizer, haystack = prepare(args, grid, ranks)
    if plan is not None:
        return retrieval_plan.run(args, spec, grid, plan, tokenizer, haystack, ranks, print_report)
    try:
        store, rows = session.evaluate_in_store(args, spec, args.store_name, ranks, lambda model, view, progress, info: (
            evaluate_retrieval(model, tokenizer, grid, haystack=haystack, store=view, ranks=ranks,
                               progress=progress, engine=engine, run=info)),
            load=engine and functools.partial(retrieval_engine.load_for_engine, engine=engine))
    finally:
        if engine is not None:
            engine.close()
    if ranks.is_main:
        # every block of trials of this run's series (any seeds), each cell's blocks as one row
        rows = merge_blocks(session.folder_rows(store.rows, rows,
                                                key=functools.partial(session.series_of, seeds=False)))
        print_report(args, grid, store, rows)
    return 0


def print_report(args, grid: RetrievalGrid, store, rows: list[dict]) -> None:
    on = f" on vLLM {rows[0]['engine_version']}" if rows[0].get("engine") == "vllm" else ""
    caption = f"{args.model} ({rows[0]['dtype']}{on}), {rows[0]['dataset']} haystack, {trials_text(rows)}"
    print(f"retrieval accuracy — {caption}")
    print(format_summary(summary(rows, grid.margin), grid.margin))
    plots = [] if args.no_plot else plot_all(rows, store.out, caption)
    for path in plots:
        print(f"plot: {path}")
    md, _ = write_summary(store.out, caption, [retrieval_section(rows, grid.margin)], plots)
    print(f"results: {store.csv_path} and {store.json_path}; summary: {md}")

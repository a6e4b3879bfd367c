"""`hf-posext retrieval --sequential` and `--budget`: the flags, checked before the model loads,
and the run (`evaluation.retrieval.schedule`) with its decisions printed under the table.
`--trials` is a cell's most in both designs (the fixed design runs all of them); `--look` the
trials at each depth per look of a sequential run (the old `--max-trials` is refused, naming them).

    hf-posext retrieval --methods yarn --lengths 8k,16k --budget 30m --out r2x
    hf-posext retrieval --methods yarn --lengths 8k,16k --budget 30m --out r2x --resume
    hf-posext retrieval --methods yarn --lengths 8k,16k --sequential --trials 40 --look 8
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

from ..evaluation.shared.inputs import InputError, parse_wall_time
from ..evaluation.retrieval.blocks import merge_blocks
from ..evaluation.retrieval.schedule import (DEFAULT_PREFIX_CACHE_BYTES, Budget, decisions_table,
                                             evaluate_sequential)
from ..evaluation.retrieval.sequential import (BOUNDARIES, DEFAULT_CONFIDENCE, DEFAULT_LOOK, SequentialRule,
                                               look_for)
from ..evaluation.retrieval.settings import DEFAULT_TRIALS
from ..patcher import trained_length
from . import session

def add_args(p, g) -> None:
    """The sequential flags into the group `g`, and the parser `p`'s refusal of the renamed one."""
    g.add_argument("--sequential", action="store_true",
                   help="stop each question once decided, looking every --look trials a depth, at "
                        "most --trials a cell")
    g.add_argument("--look", type=int, default=None,
                   help=f"with --sequential: the trials at each depth per look (default {DEFAULT_LOOK})")
    g.add_argument("--confidence", type=float, default=None,
                   help=f"with --sequential: the intervals' joint confidence (default {DEFAULT_CONFIDENCE})")
    g.add_argument("--indifference", type=float, default=None,
                   help="with --sequential: a zone around the bar (default 0)")
    g.add_argument("--boundary", default=None, choices=BOUNDARIES,
                   help="with --sequential: looks' levels (default exact)")
    g.add_argument("--prefix-cache-gb", type=float, default=None,
                   help=f"with --sequential: GB of prefix caches kept (default {DEFAULT_PREFIX_CACHE_BYTES / 2**30:g})")
    g.add_argument("--bar", type=float, default=None,
                   help="with --sequential: a fixed bar (e.g. 0.7) instead of the unpatched model's")
    g.add_argument("--budget", default=None,
                   help="sequential trials within a wall time (30m, 2h, 90s) or a number of trials; "
                        "--resume continues")
    refuse_max_trials(p)


def refuse_max_trials(p) -> None:
    """The old `--max-trials` (a sequential cell's most, when `--trials` was the trials per look)
    refused in one line naming both new flags: a command copied from an older page fails, not runs
    with `--trials` meaning something else (the benchmark scripts that take these flags call it too)."""
    session.add_renamed_arg(p, "--max-trials", "--trials for a cell's most trials (sequential too) "
                            "and --look for the trials per look, e.g. --trials 20 --look 4")


def parse_budget(text: str) -> Budget:
    text = text.strip().lower()
    if text.isdigit():
        if int(text) < 1:
            raise InputError("--budget must be at least 1 trial.")
        return Budget(trials=int(text))
    try:
        return Budget(seconds=parse_wall_time(text))
    except InputError:   # retrieval's budget may also count trials: say so
        raise InputError(f"--budget {text!r}: give wall time as 30m, 2h or 90s, or a number of "
                         "trials (200).") from None


class Plan(NamedTuple):
    """How a sequential run decides: its rule, the budget and a fixed bar (None: the reference's)."""
    rule: SequentialRule
    budget: Budget | None
    bar: float | None


def plan_from(args) -> tuple[int, Plan | None]:
    """(the trials a cell may run, `--trials`, the sequential plan or None for the fixed design)
    from the flags, InputError naming the flag. The grid builds every one of those trials'
    prompts (checked) before the model loads."""
    sequential = args.sequential or args.budget is not None
    trials = DEFAULT_TRIALS if args.trials is None else args.trials
    if not sequential:
        for flag, value in (("--look", args.look), ("--confidence", args.confidence),
                            ("--indifference", args.indifference), ("--boundary", args.boundary),
                            ("--prefix-cache-gb", args.prefix_cache_gb), ("--bar", args.bar)):
            if value is not None:
                raise InputError(f"{flag} is for sequential trials; add --sequential (or --budget).")
        return trials, None
    budget = parse_budget(args.budget) if args.budget is not None else None
    try:
        look = look_for(args.look, trials)
    except ValueError as err:
        raise InputError(str(err)) from None
    if args.prefix_cache_gb is not None and not 0 <= args.prefix_cache_gb < float("inf"):
        raise InputError(f"--prefix-cache-gb must be >= 0 (0 keeps one prefix), got {args.prefix_cache_gb}.")
    if args.bar is not None and not 0 < args.bar <= 1:
        raise InputError(f"--bar must be an accuracy in (0, 1], got {args.bar}.")
    confidence = DEFAULT_CONFIDENCE if args.confidence is None else args.confidence
    indifference = 0.0 if args.indifference is None else args.indifference
    try:   # the rule checks its own ranges (look and trials are checked above, in flag words)
        rule = SequentialRule(look, trials, confidence, indifference, args.boundary or "exact")
    except ValueError as err:   # "confidence must be in ..." -> "--confidence must be in ..."
        raise InputError(f"--{err}") from None
    return trials, Plan(rule, budget, args.bar)


def prefix_cache_bytes(args) -> int:
    """--prefix-cache-gb in bytes (its default when not given)."""
    gb = args.prefix_cache_gb
    return DEFAULT_PREFIX_CACHE_BYTES if gb is None else int(gb * 2**30)


def run(args, spec, grid, plan: Plan, tokenizer, haystack, ranks, report) -> int:
    """The sequential grid in the results folder; the table, plots and decisions (`report`)."""
    rule, budget, bar = plan
    if ranks.size > 1:
        raise InputError("--sequential runs in one process (its looks depend on each other); "
                         "launch it without torchrun/accelerate.")

    def evaluate(model, view, progress, info):
        asked = grid
        # a fixed bar needs no reference: the unpatched model, there only as the reference beside
        # other methods, is asked within L only; asked alone (`--methods none`: a checkpoint whose
        # config already carries its extension, e.g. a fine-tuned one) it is the question everywhere
        if bar is not None and any(m != "none" for m in grid.methods):
            trained = trained_length(model)
            asked = dataclasses.replace(grid, skip=tuple(grid.skip) + tuple(
                ("none", n, 1.0) for n in grid.lengths if n > trained))
        return evaluate_sequential(model, tokenizer, asked, rule, haystack=haystack, store=view, budget=budget,
                                   run=info,
                                   prefix_cache_bytes=prefix_cache_bytes(args), bar=bar)

    store, state = session.evaluate_in_store(args, spec, args.store_name, ranks, evaluate)
    if state.rows:   # every block of the run's series in the folder, each cell's blocks as one row
        report(args, grid, store, merge_blocks(session.folder_rows(
            store.rows, state.rows, key=functools.partial(session.series_of, seeds=False))))
    print(decisions_table(state))
    return 0

"""Sequential trials on the committed 2x grid, replayed: the trials the rule of
`hf-posext retrieval --sequential` (evaluation/retrieval/sequential.py) needs for each decision
against the fixed design's, and whether its decisions equal the committed ones. A REPLAY of the
committed per-trial outcomes (scored again, in seed order), not a rerun; plus a simulated live
run, the floor any rule needs, and the rule at known accuracies (`sequential.simulate`).

    python benchmarks/retrieval_sequential.py            # writes benchmarks/results/retrieval_sequential.md
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hf_posext.commands import session  # noqa: E402
from hf_posext.commands.retrieval_plan import refuse_max_trials  # noqa: E402
from hf_posext.evaluation.retrieval.blocks import merge_blocks  # noqa: E402
from hf_posext.evaluation.retrieval.designs import outcomes, replay  # noqa: E402
from hf_posext.evaluation.retrieval.sequential import (ABOVE, BELOW, UNDECIDED, SequentialRule,  # noqa: E402
                                                       _pmf, call, crossing, effective_bounds, simulate,
                                                       tail_values)
from hf_posext.evaluation.retrieval.stats import effective_length, pooled  # noqa: E402
from hf_posext.evaluation.shared.record import read_rows  # noqa: E402

GRID = ROOT / "benchmarks" / "results" / "retrieval-2x" / "retrieval.json"
OUT = ROOT / "benchmarks" / "results" / "retrieval_sequential.md"
COMMAND = "python benchmarks/retrieval_sequential.py"
SCOPE = ("single_needle", "niah_single")   # the tasks the cost target is set on




def _k(length: int | None) -> str:
    return f"{length // 1024}k" if length else "—"


def tables(rows: list[dict], rule: SequentialRule, margin: float,
           tally_out: dict[str, list[int]] | None = None) -> list[str]:
    merged = merge_blocks(rows)
    per = outcomes(rows)
    trained = int(rows[0]["trained_length"])
    lines = ["| task | method | length | committed k/n | fixed: pooled ≥ bar | sequential | trials (sequential / committed) |",
             "|---|---|---|---|---|---|---|"]
    n_used = n_committed = 0
    tally: dict[str, list[int]] = {"decided": [0, 0, 0, 0], "at max": [0, 0, 0, 0], "needs more": [0, 0, 0, 0]}
    eff_lines = []
    for task in dict.fromkeys(r["task"] for r in merged):
        ref_rows = [r for r in merged if r["task"] == task and r["method"] == "none" and int(r["length"]) <= trained]
        k, n = pooled(ref_rows)
        bar = k / n - margin if n and k / n > margin else None
        series: dict[tuple, list] = {}
        for (t, method, factor, length), trials in per.items():
            if t != task:
                continue
            kk, nn = sum(sum(t_) for t_ in trials.values()), sum(map(len, trials.values()))
            fixed = None if bar is None else (ABOVE if kk / nn >= bar else BELOW)
            got: dict[str, Any]
            if method == "none" and length <= trained:   # the reference: every committed trial
                ref_decision = rule.decide(kk, nn, bar, len(trials))[0]
                got = dict(decision=ref_decision, used=nn, more=False,
                           call=call(ref_decision, kk, nn, bar, True))
                shown = f"{got['decision']} (reference: all trials)"
            else:
                got = replay(trials, rule, bar)
                kind = "needs more" if got["more"] else ("at max" if got["call"][1] else "decided")
                shown = {"needs more": f"{got['decision']} after {got['used']} trials: the rule looks again, the folder has no more",
                         "at max": f"undecided at {rule.max_trials} a cell: point estimate {got['call'][0]}",
                         "decided": got["decision"]}[kind]
                if bar is not None:
                    tally[kind][0] += 1
                    tally[kind][1] += got["call"][0] == fixed
                    tally[kind][2] += got["used"]
                    tally[kind][3] += nn
            lines.append(f"| {task} | {method} s={factor:g} | {_k(length)} | {kk}/{nn} | "
                         f"{fixed or '— (no bar)'} | {shown} | {got['used']} / {nn} |")
            n_used, n_committed = n_used + got["used"], n_committed + nn
            series.setdefault((method, factor), []).append((length, got["call"][0]))
        for (method, factor), calls in series.items():
            mine = [r for r in merged if r["task"] == task and r["method"] == method and float(r["factor"]) == factor]
            fixed_eff, _ = effective_length(mine, ref_rows, trained, margin)
            surely, at_most = effective_bounds(calls)
            seq = ("— (no bar)" if bar is None else _k(surely) if surely == at_most
                   else f"{_k(surely)} to {_k(at_most)} (open)")
            eff_lines.append(f"| {task} | {method} s={factor:g} | {_k(fixed_eff)} | {seq} |")
        about = f"bar {bar:.2f}" if bar is not None else f"no bar (reference {k}/{n} ≤ margin)"
        eff_lines.append(f"| {task} | | {about} | |")
    said = {"decided": "decided by the rule", "at max": f"undecided after {rule.max_trials} a cell (point estimate)", "needs more": "would need more trials than the folder has"}
    summary = ["Questions with a bar, the reference cells aside (they run in full): " + "; ".join(
        f"**{said[kind]}: {c}**" + (f", {a} of them as the fixed design" if kind != "needs more" else "")
        + f", {u} of their {m} trials" for kind, (c, a, u, m) in tally.items())
        + f". All cells: {n_used} of {n_committed} committed trials replayed."]
    eff = ["| task | method | effective length, fixed (committed rows) | sequential (replayed calls) |", "|---|---|---|---|", *eff_lines]
    if tally_out is not None:   # per kind: questions, as the fixed design, trials used, committed
        tally_out.update(tally)
    return [*summary, "", *lines, "", *eff]


def simulation(rule: SequentialRule, runs: int) -> list[str]:
    """The rule at the grid's two bars: single_needle (5 depths, bar 0.30), niah_single (2 depths, bar 0.90)."""
    lines = ["| depths | bar | true accuracy | above | below | undecided | wrong | mean trials (of max) |",
             "|---|---|---|---|---|---|---|---|"]
    for depths, bar, ps in ((5, 0.30, (0.0, 0.10, 0.20, 0.25, 0.30, 0.35, 0.45, 0.60)),
                            (2, 0.90, (0.50, 0.80, 0.85, 0.90, 0.95, 1.00))):
        for p in ps:
            counts, mean = simulate([p] * depths, bar, rule, runs, seed=0)
            wrong = counts[BELOW] if p >= bar else counts[ABOVE]
            zone = bar - rule.indifference <= p < bar + rule.indifference   # either call accepted there
            lines.append(f"| {depths} | {bar:.2f} | {p:.2f} | {counts[ABOVE] / runs:.3f} | {counts[BELOW] / runs:.3f} | "
                         f"{counts[UNDECIDED] / runs:.3f} | {'— (in the zone)' if zone else f'{wrong / runs:.4f}'} | "
                         f"{mean:.1f} ({rule.max_trials * depths}) |")
    return lines


def _mix_pmf(m: int, p_depths: tuple[float, ...]) -> list[float]:
    """The pmf of one look's successes: m trials at each depth, depth d at p_depths[d]."""
    out = [1.0]
    for p in p_depths:
        out = [sum(out[i - j] * q for j, q in enumerate(_pmf(m, p)) if 0 <= i - j < len(out))
               for i in range(len(out) + m)]
    return out


def depth_mixes(rule: SequentialRule, mixes_each: int = 200, runs_seed: int = 0) -> list[str]:
    """The exact chance of each wrong crossing when the depths differ, mean on the bar (the worst
    case of each side: `above` only gets likelier as any depth's accuracy rises), computed by
    `sequential.crossing` with the pooled look's Poisson-binomial increments, against the same
    with every depth at the mean (what the levels are calibrated on) and alpha."""
    import random
    rng = random.Random(runs_seed)
    lines = ["| depths | bar | boundary | mixes tried (mean on the bar) | wrong `above` crossing: all depths at the bar / worst mix | wrong `below` crossing: all at the bar / worst mix |",
             "|---|---|---|---|---|---|"]
    for depths, bar in ((5, 0.30), (2, 0.90)):
        mixes = {tuple([bar] * depths)}
        for _ in range(mixes_each):   # random mixes on the slice mean = bar, extremes (0 and 1) included
            w = [rng.random() ** 3 for _ in range(depths)]
            x = [min(1.0, bar * depths * v / sum(w)) for v in w]
            short = bar * depths - sum(x)
            for i in range(depths):
                add = min(1.0 - x[i], short)
                x[i], short = x[i] + add, short - add
            mixes.add(tuple(round(v, 12) for v in x))
        if depths == 5:
            mixes |= {(1.0, 0.5, 0.0, 0.0, 0.0), (1.0, 0.25, 0.25, 0.0, 0.0), (0.75, 0.75, 0.0, 0.0, 0.0)}
        else:
            mixes |= {(1.0, 0.8), (0.95, 0.85)}
        for boundary in ("bonferroni", "exact"):
            r = dataclasses.replace(rule, boundary=boundary)
            sizes = r.sizes(depths)
            t_low, t_high = r.tails(bar, depths)
            ups = [[v <= t_low for v in tail_values(n, bar - r.indifference, True)] for n in sizes]
            downs = [[v < t_high for v in tail_values(n, bar + r.indifference, False)] for n in sizes]
            steps = [(n - m) // depths for n, m in zip(sizes, (0, *sizes[:-1]))]
            worst: dict[str, list[float]] = {"up": [], "down": []}
            for mix in sorted(mixes):
                incs = [_mix_pmf(m, mix) for m in steps]
                worst["up"].append(crossing(sizes, ups, incs))
                worst["down"].append(crossing(sizes, downs, incs))
            flat = [_mix_pmf(m, (bar,) * depths) for m in steps]
            lines.append(f"| {depths} | {bar:.2f} | {boundary} | {len(mixes)} | {crossing(sizes, ups, flat):.4f} / "
                         f"{max(worst['up']):.4f} | {crossing(sizes, downs, flat):.4f} / {max(worst['down']):.4f} |")
    return lines


def questions(rows: list[dict], margin: float):
    """(task, bar, (method, factor, length), its rows) of every question with a bar: the bar is
    the unpatched model's pooled accuracy within L minus `margin` (none where that is <= margin)."""
    merged, trained = merge_blocks(rows), int(rows[0]["trained_length"])
    for task in dict.fromkeys(r["task"] for r in merged):
        ref = [r for r in merged if r["task"] == task and r["method"] == "none" and int(r["length"]) <= trained]
        k, n = pooled(ref)
        if not n or k / n <= margin:
            continue
        groups: dict[tuple, list[dict]] = {}
        for r in merged:
            if r["task"] == task:
                groups.setdefault((r["method"], float(r["factor"]), int(r["length"])), []).append(r)
        for key, part in groups.items():
            yield task, k / n - margin, key, part


def at_committed_rates(rows: list[dict], rule: SequentialRule, margin: float, runs: int,
                       totals: dict[str, float] | None = None) -> list[str]:
    """A live run's expected cost, simulated with each depth cell's committed accuracy as its
    true rate (few trials: a rough stand-in, 0/4 read as 0): per question the chance the rule
    decides, the chance its call equals the fixed design's, and the mean trials, against
    max_trials a cell; the reference cells count in full."""
    trained = int(rows[0]["trained_length"])
    lines = ["| task | method | length | committed rates by depth | decided | call as fixed | mean trials (fixed) |",
             "|---|---|---|---|---|---|---|"]
    total_seq = total_fixed = not_as_fixed = seq_scope = fixed_scope = 0.0
    for task, bar, (method, factor, length), part in questions(rows, margin):
        fixed_n = rule.max_trials * len(part)
        total_fixed += fixed_n
        in_scope = task in SCOPE
        fixed_scope += fixed_n * in_scope
        if method == "none" and length <= trained:
            total_seq += fixed_n
            seq_scope += fixed_n * in_scope
            continue
        rates = [int(r["correct"]) / int(r["trials"]) for r in sorted(part, key=lambda r: float(r["depth"]))]
        counts, mean = simulate(rates, bar, rule, runs, seed=0)
        fixed = ABOVE if sum(rates) / len(rates) >= bar else BELOW
        decided = (counts[ABOVE] + counts[BELOW]) / runs
        # undecided at the last look falls back on the point estimate, itself random: not counted
        same = counts[fixed] / runs
        not_as_fixed += 1 - same
        total_seq += mean
        seq_scope += mean * in_scope
        lines.append(f"| {task} | {method} s={factor:g} | {_k(length)} | {', '.join(f'{x:.2f}' for x in rates)} | "
                     f"{decided:.2f} | ≥ {same:.2f} | {mean:.1f} ({fixed_n}) |")
    lines.append(f"| all | | | | | | **{total_seq:.0f} ({total_fixed:.0f}) = {total_seq / total_fixed:.0%}** |")
    if totals is not None:
        totals.update(seq=total_seq, fixed=total_fixed, not_as_fixed=not_as_fixed, seq_scope=seq_scope,
                      fixed_scope=fixed_scope)
    return lines


def floor(rows: list[dict], rule: SequentialRule, margin: float) -> tuple[float, float]:
    """(trials, fixed design's) that any rule deciding on a look's count (monotone in it, as both
    boundaries here) and erring with probability <= alpha at the bar needs at the committed rates,
    the reference cells in full: a decision at a look of n trials then needs that look's own
    one-sided p-value at the bar <= alpha (every walk with that count or a more extreme one
    decides wrongly at the bar), so a
    question whose depths are all at 0 or 1 (its count k = n · mean, no chance in it) cannot stop
    before the first look where that holds, nor, if it never does, before its last; any other
    question is counted at one look (a bound, not a forecast)."""
    trained = int(rows[0]["trained_length"])
    need = fixed = 0.0
    alpha = 1.0 - rule.confidence
    for _task, bar, (method, _factor, length), part in questions(rows, margin):
        rates = [int(r["correct"]) / int(r["trials"]) for r in part]
        sizes = rule.sizes(len(rates))
        fixed += sizes[-1]
        if method == "none" and length <= trained:
            need += sizes[-1]
            continue
        if any(0.0 < x < 1.0 for x in rates):
            need += sizes[0]
            continue
        mean, looks = sum(rates) / len(rates), []
        for n_j in sizes:
            kk = round(n_j * mean)
            up = tail_values(n_j, bar - rule.indifference, True)[kk]    # `above` needs this <= alpha
            down = tail_values(n_j, bar + rule.indifference, False)[kk]
            looks.append(n_j if min(up, down) <= alpha else None)
        need += next((x for x in looks if x), sizes[-1])
    return need, fixed


def zones(rows: list[dict], rule: SequentialRule, margin: float, runs: int) -> list[str]:
    """The live-run cost and the calls at several indifference zones (`--indifference`): the
    trials against the fixed design's, and the questions whose call differs from the fixed one."""
    lines = ["| boundary | indifference | simulated live run: trials (of the fixed design's) | the same, single_needle and niah_single only (the target's scope) | floor: what any count-based rule at this confidence needs (`floor`) | questions not surely called as the fixed design (undecided or opposite; simulated, mean per run) | replay: decided / as fixed |",
             "|---|---|---|---|---|---|---|"]
    for boundary, delta in ((b, d) for b in ("bonferroni", "exact") for d in (0.0, 0.05, 0.10)):
        zoned = dataclasses.replace(rule, indifference=delta, boundary=boundary)
        totals: dict[str, float] = {}
        at_committed_rates(rows, zoned, margin, runs, totals)
        tally: dict[str, list[int]] = {}
        tables(rows, zoned, margin, tally)
        decided, same = tally["decided"][:2]
        low, _ = floor(rows, zoned, margin)
        lines.append(f"| {boundary} | {delta:g} | {totals['seq']:.0f} ({totals['fixed']:.0f}) = "
                     f"{totals['seq'] / totals['fixed']:.0%} | {totals['seq_scope']:.0f} ({totals['fixed_scope']:.0f}) = "
                     f"{totals['seq_scope'] / totals['fixed_scope']:.0%} | {low:.0f} = {low / totals['fixed']:.0%} | "
                     f"{totals['not_as_fixed']:.2f} | {decided} / {same} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", type=Path, default=GRID, help="a retrieval.json with per-trial answers and outputs")
    p.add_argument("--trials", type=int, default=20, help="the most trials a cell runs (default 20)")
    p.add_argument("--look", type=int, default=4, help="trials per look at each depth (default 4)")
    refuse_max_trials(p)
    session.add_renamed_arg(p, "--block", "--look")
    p.add_argument("--confidence", type=float, default=0.95, help="over all looks (default 0.95)")
    p.add_argument("--indifference", type=float, default=0.0,
                   help="half-width of the zone around the bar where either call is accepted (default 0)")
    p.add_argument("--boundary", default="exact", choices=["exact", "bonferroni"],
                   help="the levels of the looks: computed exactly (default) or alpha / J each")
    p.add_argument("--margin", type=float, default=0.10, help="the effective length's margin (default 0.10)")
    p.add_argument("--runs", type=int, default=4000, help="simulated cells per accuracy (default 4000)")
    p.add_argument("--mixes", type=int, default=200, help="random depth mixes per design checked exactly (default 200)")
    p.add_argument("--out", type=Path, default=OUT, help=f"the report (default {OUT.relative_to(ROOT)})")
    args = p.parse_args(argv)
    try:
        rule = SequentialRule(args.look, args.trials, args.confidence, args.indifference, args.boundary)
    except ValueError as err:
        p.error(str(err))
    rows = read_rows(args.grid)
    try:
        outcomes(rows)   # every row holds one answer and output per trial, scored as its count says
    except ValueError as error:
        raise SystemExit(str(error)) from None
    text = [
        "# Sequential trials on the committed 2x grid: a replay",
        "",
        f"Made by `{COMMAND}` from [retrieval-2x/retrieval.json](retrieval-2x/retrieval.json) "
        "(the rows of [its report](retrieval-2x/report.md)). **A replay of the committed per-trial "
        "outcomes, not a rerun**: each row keeps every trial's answer and output, scored again here "
        "(the counts equal the rows'), in seed order, one look of "
        f"{rule.look} trials at each depth at a time, at most {rule.max_trials} a cell ({rule.looks} looks), "
        f"Clopper–Pearson at {rule.confidence:g} over all looks, `rule: {rule.boundary}` (docs/retrieval_sequential.md). "
        f"The bar is the unpatched model's committed within-L accuracy minus {args.margin:g}, as the fixed "
        "design's; the reference cells count in full. Where the rule would look again but the folder "
        "has no more trials (most cells ran 4), the replay says so: the rule, run live, would spend more there.",
        "",
        *tables(rows, rule, args.margin),
        "",
        "## A live run at the committed rates (simulated)",
        "",
        f"What a live `--sequential` run of the grid's questions would cost, simulated ({args.runs} runs a "
        "question, seed 0) with each depth cell's committed accuracy as its true rate, against the fixed "
        f"design at {rule.max_trials} a cell; the reference cells run in full either way. Rough: most rates come "
        "from 4 trials. *call as fixed*: decided the fixed design's way (a lower bound: an undecided cell "
        "falls back on its point estimate, which may agree too).",
        "",
        *at_committed_rates(rows, rule, args.margin, args.runs),
        "",
        "## With an indifference zone",
        "",
        "The same live-run simulation and replay for both boundaries (`--boundary bonferroni`: alpha / J a look; "
        "`exact`: the levels computed for the looks, the default) and `--indifference` 0, 0.05 and 0.10: a cell stops once "
        "its bounds put it above bar − δ or below bar + δ, so a cell near the bar stops sooner and may be "
        "called either way (the stated error holds for accuracies at least δ from the bar). *not surely as "
        "the fixed design*: the expected number of questions, per simulated run, left undecided or called "
        "against the committed point estimate (such cells are near the bar, where the fixed design's call is "
        "itself a coin flip of its trials). *floor*: the trials that any rule deciding on each look's count whose wrong decisions are at most "
        f"{1 - rule.confidence:.2g} at the bar needs at the committed rates with the reference cells in full "
        "(`floor` in this script: a decision at a look needs that look's own p-value at the bar <= alpha; "
        "questions whose depths all read 0 or 1 are held to the first such look, the rest counted at one look).",
        "",
        *zones(rows, rule, args.margin, args.runs),
        "",
        "## Depths that differ (exact)",
        "",
        "The levels are calibrated with every depth at the bar; a question pools depths whose accuracies "
        "differ. Each wrong crossing's exact probability (`sequential.crossing`, the pooled look's "
        "Poisson-binomial increments), the depths' mean on the bar (each side's worst case: raising any depth "
        "only makes `above` likelier), over the listed mixes (random ones on that slice, seed 0, and "
        f"extremes such as 1, 0.5, 0, 0, 0), at the grid's two designs, against alpha = {1 - rule.confidence:.2g}. "
        "A check at these mixes, not a proof for all of them.",
        "",
        *depth_mixes(rule, args.mixes),
        "",
        "## The rule at known accuracies (simulated)",
        "",
        f"{args.runs} simulated cells per line (`sequential.simulate`, seed 0): every depth at the given "
        "accuracy, looks as above. *wrong*: `below` when the accuracy is at least the bar, `above` when "
        f"it is below; the rule states at most {1 - rule.confidence:.3f}.",
        "",
        *simulation(rule, args.runs),
        "",
    ]
    args.out.write_text("\n".join(text), encoding="utf-8")
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())

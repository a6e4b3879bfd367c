"""The sequential design against the fixed one (sequential.py's rule, schedule.py's looks), from
stored rows: a replay of a folder's per-trial outcomes through the rule, look by look in seed order
(benchmarks/retrieval_sequential.py), and the report of a sequential run beside fixed-design rows,
per question (task, method, factor, length): each design's trials, wall time and call, and the
trials both ran whose answer text is the same (benchmarks/retrieval_live.py, which runs the two
designs live with `design_commands`, or reports a stored sequential run against stored rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..shared.record import read_rows
from .blocks import seed_set
from .sequential import UNDECIDED, SequentialRule, call
from .stats import effective_length, pooled, score_trial
from .tasks import get_task

# `hf-posext retrieval` flags the comparison sets itself, and the rule's flags (the sequential
# run's only: the fixed design has no rule)
OWN = ("--trials", "--look", "--sequential", "--budget", "--out", "--seed", "--resume")
RULE = ("--confidence", "--indifference", "--boundary")


def outcomes(rows: list[dict]) -> dict[tuple, dict[float, list[bool]]]:
    """Per question (task, method, factor, length): per depth, every trial's outcome in seed
    order, scored again from the stored answers and outputs (checked against the stored counts)."""
    out: dict[tuple, dict[float, list[tuple[int, bool]]]] = {}
    for r in rows:
        task = get_task(r["task"])
        answers, texts = r["answers"], r["outputs"]
        seeds = sorted(seed_set(str(r["seeds_list"])))
        if not (len(answers) == len(texts) == len(seeds) == int(r["trials"])):
            raise ValueError(f"{r['task']} {r['method']} {r['length']} {r['depth']}: answers, outputs and "
                             "seeds do not line up; the replay needs one per trial")
        right = [score_trial(t, a, task.multi_answer) == 1.0 for t, a in zip(texts, answers)]
        if sum(right) != int(r["correct"]):
            raise ValueError(f"{r['task']} {r['method']} {r['length']} {r['depth']}: scored again "
                             f"{sum(right)} right, the row says {r['correct']}")
        q = out.setdefault((r["task"], r["method"], float(r["factor"]), int(r["length"])), {})
        q.setdefault(float(r["depth"]), []).extend(zip(seeds, right))
    return {k: {d: [ok for _, ok in sorted(v)] for d, v in q.items()} for k, q in out.items()}


def replay(trials: dict[float, list[bool]], rule: SequentialRule, bar: float | None) -> dict[str, Any]:
    """Looks in seed order while the stored trials last: the decision, trials used, whether
    the rule would ask for more than the folder has, and the call (`sequential.call`: after the
    last look the point estimate's, flagged)."""
    k = n = 0
    decision, complete = UNDECIDED, False
    for look in range(1, rule.looks + 1):
        m = len(rule.look_seeds(0, look))
        start = (look - 1) * rule.look
        if any(len(t) < start + m for t in trials.values()):
            break
        k += sum(sum(t[start:start + m]) for t in trials.values())
        n += m * len(trials)
        decision = rule.decide(k, n, bar, len(trials))[0]
        complete = look == rule.looks
        if decision != UNDECIDED:
            break
    more = decision == UNDECIDED and not complete
    return dict(decision=decision, used=n, more=more, call=call(decision, k, n, bar, complete))


def check_designs(common: list[str], look: int, trials: int) -> None:
    """The comparison's settings (ValueError saying what to change): `common`, the `hf-posext
    retrieval` arguments both runs get, sets none of OWN nor `--dtype auto`; the sequential run's
    looks of `look` add up to `trials`, its most and the fixed design's every trial."""
    refused = sorted({a.split("=")[0] for a in common if a.split("=")[0] in OWN})
    if refused:
        raise ValueError(f"{', '.join(refused)} after `--`: the comparison sets it; give --trials / --look / "
                         "--resume before `--`")
    spaced = dict(zip(common, common[1:]))   # --dtype X, or --dtype=X
    dtype = spaced.get("--dtype") or next((a.split("=", 1)[1] for a in common if a.startswith("--dtype=")), None)
    if dtype == "auto":   # each run would probe on its own, and a probe under load can choose otherwise
        raise ValueError("--dtype auto after `--`: the two runs must compute alike; give float32 or bfloat16")
    if not 1 <= look <= trials:
        raise ValueError(f"--trials {trials} --look {look}: need 1 <= look <= trials")
    if trials % look:
        raise ValueError(f"--trials {trials} is not a whole number of looks of --look {look}; "
                         "the fixed design would not be the sequential run's full length")


def without_rule(common: list[str]) -> list[str]:
    """The arguments with the rule's flags (and their values) taken out, for the fixed design."""
    kept, skip = [], False
    for a in common:
        if skip:
            skip = False
        elif a.split("=")[0] in RULE:
            skip = "=" not in a
        else:
            kept.append(a)
    return kept


def design_commands(common: list[str], look: int, trials: int, out: Path,
                    resume: bool = False) -> dict[str, list[str]]:
    """The two `hf-posext retrieval` command lines, sequential (at most `trials` a cell, in looks
    of `look`) then fixed (every cell `trials`), into out/sequential and out/fixed (checked by the
    CLI before any model loads)."""
    tail = ["--no-plot", "--no-progress"] + (["--resume"] if resume else [])
    return {"sequential": ["retrieval", *common, "--sequential", "--trials", str(trials),
                           "--look", str(look), "--out", str(out / "sequential"), *tail],
            "fixed": ["retrieval", *without_rule(common), "--trials", str(trials),
                      "--out", str(out / "fixed"), *tail]}


def question_rows(rows: list[dict]) -> dict[tuple, list[dict]]:
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["task"], r["method"], float(r["factor"]), int(r["length"])), []).append(r)
    return by


def fixed_call(part: list[dict], ref: list[dict], trained: int, margin: float) -> tuple[str, float | None]:
    """The fixed design's call on one question (one length): `stats.effective_length`'s comparison
    of its pooled accuracy with the reference's bar."""
    reached, reference = effective_length(part, ref, trained, margin)
    if reference is None or reference <= margin:
        return "no bar", None
    return ("above" if reached is not None else "below"), reference - margin


def sequential_call(part: list[dict]) -> tuple[str, str]:
    """(text, side): the last look's decision (every row of a look carries it); undecided falls
    back on the point estimate against the bar (`sequential.call`, as the CLI's effective length)."""
    last = max(part, key=lambda r: int(r.get("look") or 0))
    bar = None if last.get("bar") is None else float(last["bar"])
    side, fallback = call(last.get("decision") or UNDECIDED, *pooled(part), bar, complete=True)
    return (f"undecided ({side} by its point estimate)" if fallback else side), side


def same_text(part: list[dict], other: list[dict]) -> tuple[int, int]:
    """(trials whose answer text is the same in both runs, trials both ran), by (depth, seed): a
    row's `outputs` are its trials' texts in seed order."""
    def by_seed(rows):
        texts = {}
        for r in rows:
            seeds, outs = sorted(seed_set(str(r["seeds_list"]))), list(r["outputs"])
            if len(seeds) == len(outs):   # a text holding ` | ` itself: the row is not compared
                texts.update({(float(r["depth"]), s): o for s, o in zip(seeds, outs)})
        return texts
    a, b = by_seed(part), by_seed(other)
    shared = a.keys() & b.keys()
    return sum(a[k] == b[k] for k in shared), len(shared)


def questions(seq: dict, fix: dict, trained: int, margin: float):
    """Per question of the fixed rows (reference cells first): both designs' rows and calls."""
    for key in sorted(fix, key=lambda k: (k[0], k[1] != "none", k[1], k[3])):
        task, method, _factor, length = key
        ref = [r for (t, m, _f, _n), part in fix.items() if t == task and m == "none" for r in part]
        s_part, f_part = seq.get(key, []), fix[key]
        is_ref = method == "none" and length <= trained
        f_call, bar = ("reference", None) if is_ref else fixed_call(f_part, ref, trained, margin)
        s_call, s_side = ("reference", "") if is_ref else sequential_call(s_part) if s_part else ("not run", "")
        yield key, s_part, f_part, s_call, f_call, bar, "—" if is_ref else ("yes" if s_side == f_call else "no")


def cost(part: list[dict]) -> tuple[int, float]:
    """(trials, seconds) of a question's rows."""
    return pooled(part)[1], sum(float(r["seconds"]) for r in part)


def live_report(out: Path, command: str, walls: dict[str, float], margin: float) -> str:
    """report.md of the two designs run live into out/sequential and out/fixed by `command`;
    `walls`: each run's wall time ({} when resumed)."""
    rows = {d: read_rows(out / d / "retrieval.json") for d in ("sequential", "fixed")}
    seq, fix = question_rows(rows["sequential"]), question_rows(rows["fixed"])
    trained = int(rows["fixed"][0]["trained_length"])
    lines = ["| task | method | length | sequential: trials | wall s | call | fixed: trials | wall s | call (bar) "
             "| same call | same text |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    totals: dict[str, list[float]] = {"sequential": [0, 0.0], "fixed": [0, 0.0]}
    text = [0, 0]   # trials with the same answer text, trials both ran
    for (task, method, factor, length), s_part, f_part, s_call, f_call, bar, same in questions(seq, fix, trained, margin):
        cells = [cost(s_part), cost(f_part)]
        for name, (n, secs) in zip(totals, cells):
            totals[name][0] += n
            totals[name][1] += secs
        bar_text = f" ({bar:.2f})" if bar is not None else ""
        k, n = same_text(s_part, f_part)
        text[0] += k
        text[1] += n
        lines.append(f"| {task} | {method} s={factor:g} | {length} | {cells[0][0]} | {cells[0][1]:.1f} | {s_call} | "
                     f"{cells[1][0]} | {cells[1][1]:.1f} | {f_call}{bar_text} | {same} | {k}/{n} |")
    (sn, ss), (fn, fs), (tk, tn) = totals["sequential"], totals["fixed"], text
    lines.append(f"| all | | | **{sn:.0f}** ({sn / fn:.0%}) | **{ss:.1f}** ({ss / fs if fs else 0:.0%}) | | {fn:.0f} | {fs:.1f} "
                 f"| | | {tk}/{tn} |")
    run_text = "; ".join(f"{d} {walls[d]:.1f} s" for d in walls) or "resumed: see the rows' seconds"
    return "\n".join([
        "# Sequential trials against the fixed design, live", "",
        f"Made by `{command}`: the same "
        "`hf-posext retrieval` arguments run sequentially, then as the fixed design, in one invocation. "
        f"Trials and wall time per question are the rows' (`seconds`: a cell's compute); this invocation's wall "
        f"time: {run_text}. Reference cells (unpatched, lengths <= {trained}) run in full in both.", "",
        *lines, ""])


def reference(by_question: dict, task: str, trained: int) -> tuple[int, int]:
    """(correct, trials) of a task's reference cells: the unpatched model at lengths <= L."""
    return pooled([r for (t, m, _f, n), part in by_question.items() if t == task and m == "none" and n <= trained
                   for r in part])


def fixed_estimate(part: list[dict], full: int) -> float:
    """The fixed design's wall time for a question of `full` trials, from its sequential looks: the
    first look as it ran (it prefilled the question's prefix, which the fixed design also does once),
    then every further trial at the cheapest look's pace (a look after the first prefills nothing).
    A question run in one look has only that look's pace: an overestimate by its prefill's share."""
    looks: dict[int, list[float]] = {}
    for r in part:
        look = looks.setdefault(int(r.get("look") or 1), [0, 0.0])
        look[0] += int(r["trials"])
        look[1] += float(r["seconds"])
    if not looks:
        return 0.0
    first_n, first_s = looks[min(looks)]
    pace = min(s / n for n, s in looks.values() if n)
    return first_s + (full - first_n) * pace


def against_report(out: Path, against: Path, max_trials: int, command: str, margin: float) -> str:
    """A sequential run already stored in OUT/sequential (budgets and resumes as it was run) against
    stored fixed-design rows (`--against`, e.g. the committed grid): the calls side by side, and
    what the fixed design at `max_trials` a depth (`--trials`, the run's most) would run, its time
    estimated from each question's looks (`fixed_estimate`; a look's trial costs a fixed one's: the
    live comparison in one run measured +1 %). ValueError when the stored rows do not fit the settings given."""
    seq_rows = read_rows(out / "sequential" / "retrieval.json")
    seq = question_rows(seq_rows)
    fix = {k: v for k, v in question_rows(read_rows(against / "retrieval.json")).items()
           if k in seq}
    if not fix:
        raise ValueError(f"{against} holds none of the questions in {out / 'sequential'}")
    trained = int(seq_rows[0]["trained_length"])
    stored = {int(r["max_trials"]) for r in seq_rows if r.get("max_trials") is not None}
    if stored != {max_trials}:
        raise ValueError(f"{out / 'sequential'} was run with --trials {sorted(stored)} (its most), not "
                         f"{max_trials}: pass its own, the fixed design it is measured against")
    for task in {k[0] for k in seq}:   # the stored bar is its run's reference minus its --margin
        k, n = reference(seq, task, trained)
        for bar in {round(float(r["bar"]), 9) for r in seq_rows if r["task"] == task and r.get("bar") is not None}:
            if n and abs(k / n - margin - bar) > 1e-6:
                raise ValueError(f"{task}: the stored bar {bar:.4f} is its reference {k}/{n} minus {k / n - bar:.4f}, "
                                 f"not the margin {margin}: pass `-- --margin {k / n - bar:.4f}`")
    lines = ["| task | method | length | sequential: trials | wall s | call | stored: trials | call (bar) | same call "
             f"| fixed design at {max_trials} a depth: trials | its wall s (est.) |", "|---" * 11 + "|"]
    total = [0, 0.0, 0, 0.0]
    for key, s_part, f_part, s_call, f_call, bar, same in questions(seq, fix, trained, margin):
        (n, secs), depths = cost(s_part), {float(r["depth"]) for r in s_part}
        full = len(depths) * max_trials
        est = fixed_estimate(s_part, full)
        total = [total[0] + n, total[1] + secs, total[2] + full, total[3] + est]
        bar_text = f" ({bar:.2f})" if bar is not None else ""
        lines.append(f"| {key[0]} | {key[1]} s={key[2]:g} | {key[3]} | {n} | {secs:.1f} | {s_call} | {cost(f_part)[0]} | "
                     f"{f_call}{bar_text} | {same} | {full} | {est:.0f} |")
    lines.append(f"| all | | | **{total[0]}** ({total[0] / total[2]:.0%}) | **{total[1]:.1f}** ({total[1] / total[3]:.0%}) "
                 f"| | | | | {total[2]} | {total[3]:.0f} |")
    for task in sorted({k[0] for k in seq}):   # each design's bar: its own reference cells
        refs = [(reference(rows, task, trained), name) for rows, name in ((seq, "the sequential run"), (fix, "the stored run"))]
        lines.append("\n" + task + ": " + "; ".join(f"{name}'s reference {k}/{n}, bar {k / n - margin:.2f}"
                                                   for (k, n), name in refs if n) + f" (margin {margin:g})")
    return "\n".join([
        "# A stored sequential run against stored fixed-design rows", "",
        f"Made by `{command}`: nothing run; the rows of "
        f"{out / 'sequential'} against those of {against}. Wall time per question is the rows' "
        "(`seconds`: a cell's compute); the fixed design's is estimated from the sequential run's own looks of "
        "each question: its first look as run (it prefilled the prefix, as the fixed design does once), the rest "
        "at its cheapest look's pace per trial (an overestimate for a question run in one look). "
        f"Reference cells (unpatched, lengths <= {trained}) run in full.", "",
        *lines, ""])

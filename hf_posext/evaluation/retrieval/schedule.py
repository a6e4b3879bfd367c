"""`evaluate_sequential`: the retrieval grid run in looks (`sequential.SequentialRule`), the
trials going where a decision is open, within an optional budget.

A *question* is a (task, method, factor, knobs, length): its depth cells, pooled, against the
bar (reference - margin). A look runs `--look` seeds at every depth of a question through
`evaluate_retrieval` (so each look is one stored block row per depth, as `--seed N --trials M`
blocks are: `blocks.py` merges them, resume reads them back, overlapping seeds are refused). Order:

1. the reference questions (the unpatched model at lengths <= L) run every look, first: they
   set the bar (unless a fixed `bar` is given, e.g. a target accuracy: then none is a reference);
2. then, look by look, the open questions the effective length depends on (undecided, fewer
   than J looks, no shorter length of their series decided `below`): a series' first length not
   yet `above` before later ones, fewer looks before more, shorter lengths before longer;
3. then one look of every question not run yet (the tables show every cell), last.

A budget (seconds of wall time or trials, this invocation's) is spent in that order: a look
starts only if its estimated cost fits what is left: its own question's earlier looks, else a
look at the same length and method, the same length (times the method's pace against those
looks' methods at a length both ran), or the nearest measured length scaled by (length ratio)²
(attention's share grows with the square; it overestimates here: 16k cost 3.3x 8k in the
committed grid), the trials in a look when the budget is trials. The first look
measured is the probe. Every look is stored as it finishes; what stays open is reported.
`--resume` reads the stored looks back (no trial recomputed) and continues the same order.

A look's prompts are those of the question's whole series of seeds (`RetrievalGrid.layout_seeds`),
so every look of a question has the same prefixes, and they are kept across looks
(`decode.SharedPrefix`, up to `prefix_cache_bytes`, the least recently used question's dropped
first): a later look only runs its trials' suffixes, as the fixed design's later trials do.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from ...patcher import trained_length
from ..shared.grid import knob_text
from ..shared.settings import RunInfo
from .decode import SharedPrefix, answer_cell, takes_shared
from .run import evaluate_retrieval
from .sequential import ABOVE, BELOW, BOUNDARY_TEXT, UNDECIDED, SequentialRule, call, effective_bounds
from .settings import RetrievalGrid


# prefix caches kept across looks: ~5 questions' deepest 16k prefixes of the embedded model in float32
DEFAULT_PREFIX_CACHE_BYTES = 4 << 30


@dataclass(frozen=True)
class Budget:
    """What one invocation may spend: wall seconds, or trials (one of the two)."""
    seconds: float | None = None
    trials: int | None = None

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.trials is None):
            raise ValueError("a budget is seconds or trials, one of the two.")
        if (self.seconds is not None and not self.seconds > 0) or (self.trials is not None and self.trials < 1):
            raise ValueError(f"a budget must be positive, got {self}.")

    def text(self) -> str:
        return f"{self.trials} trials" if self.trials is not None else f"{self.seconds / 60:.1f} min"


@dataclass
class Question:
    task: str
    method: str
    factor_spec: str
    factor: float
    knobs: str
    length: int
    depths: int
    reference: bool
    index: int
    looks: list[tuple[int, int]] = field(default_factory=list)   # (correct, trials) per look
    seconds: list[float] = field(default_factory=list)           # wall time per look
    decision: str = UNDECIDED
    low: float = 0.0
    high: float = 1.0

    @property
    def series(self) -> tuple:
        return (self.task, self.method, self.factor_spec, self.knobs)

    @property
    def correct(self) -> int:
        return sum(k for k, _ in self.looks)

    @property
    def trials(self) -> int:
        return sum(n for _, n in self.looks)

    def label(self) -> str:
        s = "" if self.method == "none" else f" s={self.factor:g}"
        return f"{self.task} {self.method}{s}{f' [{self.knobs}]' if self.knobs else ''} at {self.length}"


@dataclass
class SequentialResult:
    rows: list[dict]                 # every stored block row of the run's looks
    questions: list[Question]
    bars: dict[str, float | None]    # per task (None: no reference, or reference <= margin)
    rule: SequentialRule
    stopped: str = ""                # why the run ended before every decision was taken

    def open_questions(self) -> list[Question]:
        """The reference not measured in full, and the undecided questions the effective length
        depends on that have looks left (the run stopped before them: the budget)."""
        return [q for q in self.questions if len(q.looks) < self.rule.looks and (
            q.reference or (q.decision == UNDECIDED and _matters(q, self)))]

    def call(self, q: Question) -> tuple[str, bool]:
        """q's decision, or after its last look the point estimate's (`sequential.call`)."""
        return call(q.decision, q.correct, q.trials, self.bars.get(q.task), len(q.looks) >= self.rule.looks)

    def effective(self) -> dict[tuple, tuple[int | None, int | None]]:
        """(surely, at most) per series (`sequential.effective_bounds` of the calls)."""
        out: dict[tuple, list] = {}
        for q in self.questions:
            out.setdefault(q.series, []).append((q.length, self.call(q)[0]))
        return {s: effective_bounds(d) for s, d in out.items()}


def questions_of(grid: RetrievalGrid, trained: int, reference: bool = True) -> list[Question]:
    """One question per (task, method, factor, knobs, length); `reference` False: none is the
    reference (a fixed bar is given instead)."""
    out: dict[tuple, Question] = {}
    for c in grid.cells(trained):
        key = (c.extra["task"], c.method, c.factor_spec, knob_text(c.knobs), c.length)
        if key not in out:
            out[key] = Question(*key[:3], c.factor, key[3], c.length, 0,
                                reference and c.method == "none" and c.length <= trained, len(out))
        out[key].depths += 1
    return list(out.values())


def _bars(questions: list[Question], margin: float) -> dict[str, float | None]:
    """Per task: the reference pooled over its questions (`stats.effective_length`) - margin."""
    bars: dict[str, float | None] = {}
    for task in dict.fromkeys(q.task for q in questions):
        ref = [q for q in questions if q.task == task and q.reference]
        k, n = sum(q.correct for q in ref), sum(q.trials for q in ref)
        bars[task] = (k / n - margin) if n and k / n > margin else None
    return bars


def _matters(q: Question, state: SequentialResult) -> bool:
    """The effective length depends on q: there is a bar and no shorter length of q's series is
    called `below` (decided, or by its point estimate after its last look: the effective length
    ends before it)."""
    return state.bars.get(q.task) is not None and not any(
        r.series == q.series and r.length < q.length and state.call(r)[0] == BELOW for r in state.questions)


def _priority(q: Question, state: SequentialResult) -> tuple | None:
    """The sort key of q's next look (smaller first), None when q needs no more."""
    if len(q.looks) >= state.rule.looks:
        return None
    if q.reference:
        return (0, len(q.looks), q.length, q.index)
    if any(r.reference and len(r.looks) < state.rule.looks for r in state.questions if r.task == q.task):
        return None   # the bar is not measured yet
    if _matters(q, state) and q.decision == UNDECIDED:
        shorter = [r for r in state.questions if r.series == q.series and r.length < q.length]
        return (1, sum(state.call(r)[0] != ABOVE for r in shorter), len(q.looks), q.length, q.index)
    if not q.looks:
        return (2, q.length, q.index)
    return None


def _estimate(q: Question, state: SequentialResult, rule: SequentialRule, budget: Budget) -> float | None:
    """The next look's cost in the budget's unit (None: nothing measured yet)."""
    trials = len(rule.look_seeds(0, len(q.looks) + 1)) * q.depths
    if budget.trials is not None:
        return float(trials)
    def per_trial(qs):
        t = [(s, n) for r in qs for s, (_, n) in zip(r.seconds, r.looks)]
        return sum(s for s, _ in t) / sum(n for _, n in t) if t else None
    for same in (lambda r: r is q, lambda r: (r.length, r.method) == (q.length, q.method)):
        rate = per_trial([r for r in state.questions if same(r)])
        if rate is not None:
            return rate * trials
    def pace(length, methods):   # per trial, over those methods' looks at that length (None: none)
        return per_trial([r for r in state.questions if r.length == length and r.method in methods])
    others = {r.method for r in state.questions if r.length == q.length and r.seconds}
    if others:   # other methods at this length, scaled by this method's pace against theirs where both
        # ran (live, 2x grid: DualChunk's first 8k look cost 1.6x YaRN's, its first 16k look 1.5x)
        shared = [n for n in {r.length for r in state.questions}
                  if pace(n, {q.method}) is not None and pace(n, others) is not None]
        n = min(shared, key=lambda n: abs(n - q.length), default=None)
        mine, theirs = (None, None) if n is None else (pace(n, {q.method}), pace(n, others))
        ratio = mine / theirs if mine and theirs else 1.0
        return pace(q.length, others) * trials * ratio
    measured = {r.length for r in state.questions if r.seconds}
    if not measured:
        return None
    near = min(measured, key=lambda n: abs(n - q.length))
    rate = per_trial([r for r in state.questions if r.length == near])
    return rate * trials * max(1.0, (q.length / near) ** 2) if rate is not None else None


def evaluate_sequential(model, tokenizer, grid: RetrievalGrid, rule: SequentialRule, *,
                        run: RunInfo | None = None, haystack=None, store=None,
                        budget: Budget | None = None, answer_fn=None, bar: float | None = None,
                        clock: Callable[[], float] = time.monotonic,
                        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
                        log: Callable[[str], None] = lambda s: print(s, flush=True)) -> SequentialResult:
    """Run `grid`'s questions look by look (the module docstring); each block row gains `look`,
    `max_trials` (the cell's most, `--trials`: the column keeps its first name), `confidence`,
    `indifference`, `rule` (the boundary), and the question's `decision`, `decision_low`,
    `decision_high` and `bar` after that look. `clock` and `answer_fn` are injectable (tests: a fake clock the
    stub answers advance). bar: a fixed bar in (0, 1] instead of the reference's (e.g. a target
    accuracy such as 0.9): no cell is then a reference and no length <= L is needed.
    Every look is laid out as the question's whole series of seeds (`RetrievalGrid.layout_seeds`:
    its prompts are the fixed design's at max_trials), and the prefix caches are kept across
    looks (`decode.SharedPrefix`, up to `prefix_cache_bytes`): a later look prefills nothing."""
    if bar is not None and not 0.0 < bar <= 1.0:
        raise ValueError(f"a fixed bar must be in (0, 1], got {bar}.")
    run = run or RunInfo()
    run = dataclasses.replace(run, extra_columns={**run.extra_columns, "max_trials": rule.max_trials,
                                                  "confidence": rule.confidence,
                                                  "indifference": rule.indifference, "rule": rule.boundary})
    trained = trained_length(model)
    if bar is None and not any(length <= trained for length in grid.lengths):
        raise ValueError(f"sequential trials need a length <= the trained length {trained} in the "
                         "grid: the bar is the unpatched model's accuracy there (add it to --lengths).")
    answer_fn = answer_fn or answer_cell
    state = SequentialResult([], questions_of(grid, trained, reference=bar is None), {}, rule)
    if not state.questions:   # every cell left out (grid.skip): a run that would do nothing, silently
        raise ValueError("the sequential grid has no question left to decide (every cell was left out); "
                         "check --methods and --lengths.")
    holder = SharedPrefix(prefix_cache_bytes)
    # every look's seeds: each look is laid out as the whole series
    layout = tuple(s for j in range(1, rule.looks + 1) for s in rule.look_seeds(grid.seed, j))
    start, spent_trials = clock(), 0

    def look(q: Question, compute: bool) -> bool:
        nonlocal spent_trials
        j, computed = len(q.looks) + 1, []

        def answer(model_, tokenizer_, cell, reuse_prefix, shared=None):
            computed.append(len(cell.trials))
            extra = {"shared": shared} if shared is not None and takes_shared(answer_fn) else {}
            return answer_fn(model_, tokenizer_, cell, reuse_prefix, **extra)

        sub = dataclasses.replace(
            grid, methods=[q.method], lengths=[q.length], tasks=[q.task], factors=[q.factor_spec],
            seeds=rule.look_seeds(grid.seed, j), layout_seeds=layout,
            skip=tuple(grid.skip) + ((("none", q.length, 1.0),) if q.method != "none" else ()))
        began = clock()
        rows = evaluate_retrieval(model, tokenizer, sub, haystack=haystack, store=store,
                                  run=dataclasses.replace(run, extra_columns={**run.extra_columns, "look": j}),
                                  progress=False, answer_fn=answer, prefix_cache=holder,
                                  stored_only=not compute)
        if rows is None:   # asked for stored rows only, and this look is not stored yet
            return False
        q.looks.append((sum(int(r["correct"]) for r in rows), sum(int(r["trials"]) for r in rows)))
        q.seconds.append(clock() - began if computed else sum(float(r["seconds"]) for r in rows))
        spent_trials += sum(computed)
        state.bars = _bars(state.questions, grid.margin) if bar is None else {t: bar for t in grid.tasks}
        for r in state.questions:
            if r.looks:
                r.decision, r.low, r.high = rule.decide(r.correct, r.trials, state.bars[r.task], r.depths)
        state.rows += rows
        if computed:   # rows read back keep what their run recorded
            decision = dict(decision=q.decision, decision_low=round(q.low, 4), decision_high=round(q.high, 4),
                            bar=None if state.bars[q.task] is None else round(state.bars[q.task], 4))
            for r in rows:
                r.update(decision)
                if store is not None:   # the decision columns, added after the rows were stored
                    store.update(r["key"], **decision)
            log(f"look {j}/{rule.looks} {q.label()}: {q.correct}/{q.trials} "
                f"[{q.low:.2f}, {q.high:.2f}] {q.decision} ({q.seconds[-1]:.0f} s)")
        return True

    for q in sorted(state.questions, key=lambda q: not q.reference):   # stored looks: read back, nothing computed
        while len(q.looks) < rule.looks and look(q, compute=False):
            pass
    log(plan_text(state, budget))
    while True:
        ready = sorted((p, q.index) for q in state.questions if (p := _priority(q, state)) is not None)
        if not ready:
            break
        chosen = None
        for _, i in ready:
            q = state.questions[i]
            if budget is None:
                chosen = q
                break
            left = (budget.trials - spent_trials if budget.trials is not None
                    else budget.seconds - (clock() - start))
            cost = _estimate(q, state, rule, budget)
            if (cost if cost is not None else 0.0) <= left and left > 0:
                chosen = q
                break
        if chosen is None:
            state.stopped = f"the budget ({budget.text()}) is spent" if budget else ""
            break
        look(chosen, compute=True)
    return state


def zone_text(rule: SequentialRule) -> str:
    """What an indifference zone changes in the stated error ('' without one)."""
    d = rule.indifference
    return (f" for accuracies outside the bar ± {d:g} (inside it either call is accepted)" if d else "")


def plan_text(state: SequentialResult, budget: Budget | None) -> str:
    """What the run will do, before it does it: the rule, the budget, what is stored."""
    rule, done = state.rule, sum(len(q.looks) for q in state.questions)
    refs = ", ".join(q.label() for q in state.questions if q.reference) or "none"
    left = sum(len(rule.look_seeds(0, j)) * q.depths for q in state.questions
               for j in range(len(q.looks) + 1, rule.looks + 1))
    costs = [(_estimate(q, state, rule, Budget(seconds=1.0)), rule.looks - len(q.looks))
             for q in state.questions if len(q.looks) < rule.looks]
    cost = (f" (about {sum(c * n for c, n in costs) / 60:.0f} min at the pace of the stored looks)"
            if costs and all(c is not None for c, _ in costs) else "")
    return (f"sequential: looks of {rule.look} trial(s) at each depth (--look), at most {rule.max_trials} "
            f"a depth (--trials; {rule.looks} looks), Clopper–Pearson bounds at {BOUNDARY_TEXT[rule.boundary]}, wrong decisions <= {1 - rule.confidence:.2g} over all looks"
            f"{zone_text(rule)}; "
            f"{len(state.questions)} questions, {done} looks stored; at most {left} trials to run"
            f"{cost}; reference first ({refs}); budget: {budget.text() if budget else 'none'}")


def decisions_table(state: SequentialResult) -> str:
    """Per series: each length's decision with its counts and interval, and the effective length
    (`surely`–`at most` where a decision it rests on is open)."""
    from ..shared.results import format_length
    lines = []
    eff = state.effective()
    for series in dict.fromkeys(q.series for q in state.questions):
        qs = sorted((q for q in state.questions if q.series == series), key=lambda q: q.length)
        parts = [f"{format_length(q.length)} {q.decision} {q.correct}/{q.trials} [{q.low:.2f}, {q.high:.2f}]"
                 + (f" (after {state.rule.max_trials}: point estimate {state.call(q)[0]})" if state.call(q)[1] else "")
                 + (" (reference)" if q.reference else "") for q in qs if q.looks]
        surely, at_most = eff[series]
        bar = state.bars.get(series[0])
        estimated = [format_length(q.length) for q in qs if state.call(q)[1] and surely and q.length <= surely]
        if bar is None:
            length = "— (no bar)"
        elif surely == at_most:
            length = format_length(surely) if surely else "—"
        else:
            length = f"{format_length(surely) if surely else '—'} to {format_length(at_most)} (open)"
        if estimated:
            length += f" (resting on point estimates at {', '.join(estimated)})"
        lines.append(f"{qs[0].label().rsplit(' at ', 1)[0]}: {'; '.join(parts) or 'no look yet'} "
                     f"-> effective length {length}")
    bars = "; ".join(f"{t}: {'none' if b is None else f'{b:.2f}'}" for t, b in state.bars.items())
    lines.append(f"bar (reference - margin): {bars}; [bounds]: Clopper–Pearson at "
                 f"{BOUNDARY_TEXT[state.rule.boundary]}, a decision wrong with "
                 f"probability <= {1 - state.rule.confidence:.2g} over all {state.rule.looks} looks"
                 f"{zone_text(state.rule)}")
    open_q = state.open_questions()
    if state.stopped or open_q:
        lines.append(f"stopped: {state.stopped or 'max trials'}; open: "
                     + (", ".join(q.label() for q in open_q) or "nothing") + " (--resume continues)")
    return "\n".join(lines)

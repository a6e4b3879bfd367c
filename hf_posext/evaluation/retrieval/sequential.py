"""Sequential trials: when a cell's trials can stop, and what the effective length rests on.

The question the grid asks of a (task, method, factor, length) is one comparison: is its
accuracy p, pooled over the depths (as `stats.effective_length` pools them), at least the bar
b = reference - margin, or below it? A fixed design runs every cell to `--trials` whatever it
already shows; here a cell runs in *looks*, `look` trials at each depth per look (`--look`), at
most `max_trials` a depth (`--trials`, the cell's most), so at most J = ceil(max_trials / look)
looks, and stops at the first look whose interval lies wholly on one side of the bar.

The rule (repeated confidence bounds at levels that hold over all the looks; Jennison &
Turnbull, "Group Sequential Methods with Applications to Clinical Trials", 2000, ch. 9,
repeated confidence intervals, and ch. 12 / 19.2 for exact discrete boundaries):

- After look j, with k successes in n trials, the bounds are Clopper–Pearson's (Clopper &
  Pearson 1934, Biometrika 26:404) with tail t_low (lower bound) and t_high (upper bound):
  low is the p with P(X >= k | n, p) = t_low, high the p with P(X <= k | n, p) = t_high,
  X ~ Binomial(n, p); low = 0 at k = 0, high = 1 at k = n.
- Decision: `below` when high < b, `above` when low >= b, else `undecided` (the next look; at
  J looks the cell stays undecided and the table falls back on its point estimate, flagged).
  Equivalently `above` when the look's one-sided p-value at b, P_b(X >= k), is <= t_low, and
  `below` when P_b(X <= k) < t_high: a decision is a test at b, the bound only its report.
- The levels (`boundary`): "bonferroni" spends alpha/J at every look (alpha = 1 - confidence;
  the simplest alpha-spending function, Lan & DeMets 1983, Biometrika 70:659). "exact" (the
  default) takes, for each side, the largest constant level c whose *exact* probability that
  some look's p-value at b is <= c is at most alpha (`exact_tail`): the looks are nested (each
  adds a look's trials to the same trials), so the union bound is loose, and the walk S_1 <= S_2 <= ...
  under X ~ Binomial at b is computed by dynamic programming over its counts (`crossing`),
  look by look (a Pocock-type constant nominal level, Pocock 1977, Biometrika 64:191, made exact
  for the discrete walk). c depends on b, the look, max_trials and the number of depths (the
  looks' sizes n_j = depths · min(j · look, max_trials)), so it is computed per question
  (cached). It is never below alpha/J (the union bound is feasible), and any c at most the
  calibrated one is sound.
- With an indifference zone of half-width delta (`--indifference`; Wald's SPRT and Bechhofer's
  ranking procedures state their error this way: Wald 1947, "Sequential Analysis", ch. 3;
  Bechhofer 1954, Ann. Math. Statist. 25:16): `above` when low >= b - delta, `below` when
  high < b + delta (both: the interval lies inside the zone, and the call is the point
  estimate's, either being within tolerance); the exact levels are calibrated at b - delta
  (t_low) and b + delta (t_high). The guarantee moves to the accuracies at least delta from the
  bar: a wrong `below` at p >= b + delta needs high < b + delta <= p, a wrong `above` at
  p < b - delta needs low >= b - delta > p; within the zone either call is accepted. delta = 0
  is the rule above.
- Why a decision is wrong with probability at most alpha, for every p, bar and stopping, when
  the trials are independent with one rate p (PROVED): a wrong `above` (p < b - delta) needs
  some look's upper-tail test at b - delta to reject; "some look rejects" is an increasing event
  in the trials' outcomes, so its probability grows with p (couple the trials by uniforms) and
  is at most its value at p = b - delta, which is <= alpha by the union bound (bonferroni: each
  look's Clopper–Pearson test is exact, conservative) or by the exact computation (exact). A
  wrong `below` likewise, the lower-tail event falling with p. The other side's boundary only
  stops some walks earlier, so ignoring it over-counts (non-binding boundaries). (A fixed-n
  bound read after every look has no such guarantee: at J looks its error grows towards J
  times the nominal one; Armitage, McPherson & Rowe 1969, and tests/test_retrieval_sequential.py.)
- Depths pooled: a look runs the same number of trials at every depth, so the pooled count is
  a sum of independent Bernoulli(p_d) whose mean rate is the depth-pooled p. Raising any p_d
  only makes the increasing event likelier, so each side's worst case has the depths' mean ON
  the bar (PROVED). For one look, Hoeffding (1956, Ann. Math. Statist. 27:713, Theorem 4) bounds
  such a sum's tails by the Binomial ones beyond one trial from the mean (PROVED, single look:
  bonferroni's argument, look by look, holds with it). For the exact levels over several looks,
  that the equal-depth walk is the worst mix is NOT proved here: it is CHECKED, by exact
  enumeration of every outcome on small designs with depths at 0 and 1 and in between
  (tests/test_retrieval_sequential.py) and by the exact crossing probability with the pooled
  looks' Poisson-binomial increments over 200+ mixes at the 2x grid's two designs
  (benchmarks/retrieval_sequential.py, *Depths that differ*: the equal-depth walk was the worst
  of every mix tried, a mix's smaller variance making both crossings rarer).
- The bar is taken as measured: the reference cells (the unpatched model within L) run first,
  to `max_trials`, from trials independent of the cell's, and the decision is about p against
  that bar (as the fixed design compares its point estimate with it); the bar's own sampling
  error is not in alpha.

The effective length of a series rests on the decisions of its lengths in order
(`effective_bounds`): the longest length up to which every length is `above`, and the longest
up to which none is `below` (the two agree once the lengths that matter are decided).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

from .settings import DEFAULT_TRIALS

ABOVE, BELOW, UNDECIDED = "above", "below", "undecided"
DEFAULT_LOOK = 4
DEFAULT_CONFIDENCE = 0.95


def look_for(look: int | None, trials: int) -> int:
    """The trials per look (`--look`, DEFAULT_LOOK when None) of a sequential run of at most
    `trials` a cell (`--trials`), checked in the flags' words (ValueError): the one check of the
    CLI's and the fine-tuning experiment's sequential flags. One look is refused: it is the fixed
    design, and `--sequential --trials 4` once meant looks of 4 (up to 20)."""
    n = DEFAULT_LOOK if look is None else look
    if trials < 1:
        raise ValueError(f"--trials (a cell's most) must be at least 1, got {trials}.")
    if n < 1:
        raise ValueError(f"--look (trials per look) must be at least 1, got {n}.")
    if n > trials:
        raise ValueError(f"--look {n}{' (the default)' if look is None else ''} is more than --trials {trials} "
                         "(a cell's most); lower --look or raise --trials.")
    if n == trials:
        raise ValueError(f"--trials {trials} with --look {n} is one look: a sequential run needs two or more; "
                         f"raise --trials (a cell's most, e.g. {DEFAULT_TRIALS}) or drop --sequential.")
    return n


def _log_pmf(i: int, n: int, p: float) -> float:
    return (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
            + i * math.log(p) + (n - i) * math.log1p(-p))


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k), X ~ Binomial(n, p), summed exactly term by term (in logs: no overflow)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))


def _solve(f, target: float) -> float:
    """The p in (0, 1) where the decreasing function f(p) equals target (bisection: 60 halvings
    reach double precision)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@functools.lru_cache(maxsize=4096)   # a run reads few (k, n) pairs, the simulation many times
def clopper_pearson(k: int, n: int, tail: float) -> tuple[float, float]:
    """The exact interval of k successes in n trials with `tail` probability in each tail
    (two-sided level 1 - 2·tail): low solves P(X >= k | p) = tail, high P(X <= k | p) = tail."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0.0 < tail < 0.5:
        raise ValueError(f"the tail probability must be in (0, 0.5), got {tail}")
    # P(X >= k | p) = 1 - cdf(k - 1) grows with p; its complement cdf(k - 1) falls
    low = 0.0 if k == 0 else _solve(lambda p: binom_cdf(k - 1, n, p), 1.0 - tail)
    high = 1.0 if k == n else _solve(lambda p: binom_cdf(k, n, p), tail)
    return low, high


def _pmf(n: int, p: float) -> list[float]:
    """P(X = i), i = 0..n, X ~ Binomial(n, p)."""
    if p <= 0.0 or p >= 1.0:
        return [float(i == (0 if p <= 0.0 else n)) for i in range(n + 1)]
    return [math.exp(_log_pmf(i, n, p)) for i in range(n + 1)]


def tail_values(n: int, point: float, upper: bool) -> list[float]:
    """The one-sided p-values of k = 0..n against `point`: P(X >= k) (upper) or P(X <= k)."""
    pmf = _pmf(n, point)
    acc, out = 0.0, []
    for q in (reversed(pmf) if upper else pmf):
        acc += q
        out.append(min(acc, 1.0))
    return out[::-1] if upper else out


def crossing(sizes: Sequence[int], rejects: Sequence[Sequence[bool]],
             increments: Sequence[Sequence[float]]) -> float:
    """Exact P(the walk S_j = X_1 + ... + X_j is in rejects[j] at some look j), the X_j independent
    with the pmfs `increments` (S_j in 0..sizes[j]): the mass that has not crossed, carried look to
    look by convolution (Jennison & Turnbull 2000, section 19.2's recursion)."""
    alive, crossed = [1.0], 0.0
    for n, reject, inc in zip(sizes, rejects, increments):
        nxt = [0.0] * (n + 1)
        for i, a in enumerate(alive):
            if a:
                for d, q in enumerate(inc):
                    nxt[i + d] += a * q
        crossed += sum(x for x, r in zip(nxt, reject) if r)
        alive = [0.0 if r else x for x, r in zip(nxt, reject)]
    return crossed


@functools.lru_cache(maxsize=1024)
def exact_tail(point: float, sizes: tuple[int, ...], alpha: float, upper: bool) -> float:
    """The largest level c with P_point(some look's one-sided p-value at `point` <= c) <= alpha,
    exact over the looks at `sizes` trials (all at rate `point`); c lies strictly between two
    attainable p-values, so `< c` and `<= c` reject alike, and c >= alpha / J (Bonferroni's)."""
    looks = len(sizes)
    if not 0.0 < point < 1.0:   # no accuracy lies beyond such a point: any level is sound
        return alpha / looks
    values = [tail_values(n, point, upper) for n in sizes]
    increments = [_pmf(n - m, point) for n, m in zip(sizes, (0, *sizes[:-1]))]
    grid = sorted({v for vs in values for v in vs})

    def err(c: float) -> float:
        return crossing(sizes, [[v <= c for v in vs] for vs in values], increments)

    lo, hi = -1, len(grid) - 1    # err(grid[hi]) = 1 (k = 0 or n has p-value 1); err(below all) = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if err(grid[mid]) <= alpha else (lo, mid)
    floor = grid[lo] if lo >= 0 else 0.0
    c = math.sqrt(floor * grid[hi]) if floor > 0 else grid[hi] / 2
    # any level at most the calibrated one is sound, and so is alpha / J (the union bound)
    return min(max(c, alpha / looks), 0.4999)


BOUNDARIES = ("exact", "bonferroni")
BOUNDARY_TEXT = {"exact": "levels computed exactly for the looks", "bonferroni": "alpha / J a look"}


@dataclass(frozen=True)
class SequentialRule:
    """Looks of `look` trials at each depth (`--look`), up to `max_trials` per depth cell (`--trials`,
    the cell's most); a decision is
    wrong with probability at most 1 - `confidence`, over all looks together (the docstring above).
    `boundary`: "exact" (the levels computed for the looks, the default) or "bonferroni" (alpha/J)."""

    look: int = DEFAULT_LOOK
    max_trials: int = 20
    confidence: float = DEFAULT_CONFIDENCE
    indifference: float = 0.0
    boundary: str = "exact"

    def __post_init__(self) -> None:
        for name in ("look", "max_trials"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}.")
        if self.look > self.max_trials:
            raise ValueError(f"a look of {self.look} trials is more than max_trials={self.max_trials} (the "
                             "cell's most); give a look <= max_trials.")
        if not (0.5 <= self.confidence < 1.0):
            raise ValueError(f"confidence must be in [0.5, 1), e.g. 0.95; got {self.confidence}.")
        if isinstance(self.indifference, bool) or not 0.0 <= self.indifference < 0.5:
            raise ValueError(f"indifference must be in [0, 0.5), e.g. 0.05 (accuracies within it of the "
                             f"bar may be called either way); got {self.indifference!r}.")
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"boundary must be one of {', '.join(BOUNDARIES)}; got {self.boundary!r}.")

    @property
    def looks(self) -> int:
        """J, the most looks a cell takes (the last one shorter when look does not divide max_trials)."""
        return -(-self.max_trials // self.look)

    def look_seeds(self, seed: int, j: int) -> list[int]:
        """The seeds of look j (1-based) at each depth: consecutive runs of `look` seeds from `seed`."""
        if not 1 <= j <= self.looks:
            raise ValueError(f"look {j} is outside 1..{self.looks}")
        start = (j - 1) * self.look
        return list(range(seed + start, seed + min(start + self.look, self.max_trials)))

    def sizes(self, depths: int) -> tuple[int, ...]:
        """The trials of a question of `depths` depths after each look."""
        return tuple(depths * min(j * self.look, self.max_trials) for j in range(1, self.looks + 1))

    def tails(self, bar: float | None, depths: int | None) -> tuple[float, float]:
        """(tail of the lower bound, tail of the upper bound): alpha / J each (bonferroni), or the
        exact levels at bar - delta (a wrong `above`) and bar + delta (a wrong `below`)."""
        alpha = 1.0 - self.confidence
        if self.boundary == "bonferroni" or bar is None:
            return alpha / self.looks, alpha / self.looks
        if depths is None:
            raise ValueError("the exact boundary needs the question's number of depths (decide(..., depths=))")
        sizes, d = self.sizes(depths), self.indifference
        return (exact_tail(round(bar - d, 12), sizes, alpha, True),
                exact_tail(round(bar + d, 12), sizes, alpha, False))

    def interval(self, k: int, n: int, bar: float | None = None, depths: int | None = None) -> tuple[float, float]:
        """The look's bounds: Clopper–Pearson with the rule's tails (`tails`)."""
        t_low, t_high = self.tails(bar, depths)
        return clopper_pearson(k, n, t_low)[0], clopper_pearson(k, n, t_high)[1]

    def decide(self, k: int, n: int, bar: float | None, depths: int | None = None) -> tuple[str, float, float]:
        """(decision, low, high) of k successes in n trials, over `depths` depths, against the bar
        (None: no bar, as when the reference is at most the margin: `undecided`)."""
        if bar is not None and self.boundary == "exact" and depths is not None and n not in self.sizes(depths):
            raise ValueError(f"{n} trials over {depths} depths is not a look of this rule ({self.sizes(depths)})")
        low, high = self.interval(k, n, bar, depths)
        if bar is None:
            return UNDECIDED, low, high
        surely_below, surely_above = high < bar + self.indifference, low >= bar - self.indifference
        if surely_below and surely_above:   # inside the zone (delta > 0 only): either call is right
            return (ABOVE if k / n >= bar else BELOW), low, high
        if surely_below:
            return BELOW, low, high
        if surely_above:
            return ABOVE, low, high
        return UNDECIDED, low, high


def call(decision: str, k: int, n: int, bar: float | None, complete: bool) -> tuple[str, bool]:
    """(above / below / undecided, whether it is the point estimate's): a decision stands; a cell
    undecided after its last look falls back on the fixed design's comparison, k/n >= bar."""
    if decision != UNDECIDED or not complete or bar is None or n == 0:
        return decision, False
    return (ABOVE if k / n >= bar else BELOW), True


def effective_bounds(decisions: Sequence[tuple[int, str]]) -> tuple[int | None, int | None]:
    """(surely, at most) of a series' (length, decision) pairs: `surely` the longest length up to
    which every length is `above`, `at most` the longest before the first `below` (None: none).
    Equal when the lengths that matter are decided; lengths after a `below` do not matter."""
    surely = at_most = None
    open_before = False
    for length, decision in sorted(decisions):
        if decision == BELOW:
            break
        at_most = length
        if decision == ABOVE and not open_before:
            surely = length
        else:
            open_before = True
    return surely, at_most


def simulate(p_depths: Sequence[float], bar: float, rule: SequentialRule, runs: int,
             seed: int = 0) -> tuple[dict[str, int], float]:
    """`runs` simulated cells whose depth d succeeds with probability p_depths[d], run by the rule:
    (decision counts, mean trials per cell). What the tests and docs check the rule with."""
    import random
    rng = random.Random(seed)
    counts = {ABOVE: 0, BELOW: 0, UNDECIDED: 0}
    total = 0
    for _ in range(runs):
        k = n = 0
        decision = UNDECIDED
        for look in range(1, rule.looks + 1):
            m = len(rule.look_seeds(0, look))
            k += sum(rng.random() < p for p in p_depths for _ in range(m))
            n += m * len(p_depths)
            decision = rule.decide(k, n, bar, len(p_depths))[0]
            if decision != UNDECIDED:
                break
        counts[decision] += 1
        total += n
    return counts, total / runs

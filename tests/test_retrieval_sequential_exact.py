"""The exact group-sequential levels of sequential trials (evaluation/retrieval/sequential.py,
`boundary="exact"`): each level against scipy's binomial tails and a full enumeration of the
walk, the whole rule's wrong-decision probability by enumerating every trial's outcome (depths
that differ included), a rule without the correction for repeated looks caught by the same
enumeration, and the trials saved against Bonferroni's split."""

import pytest

from hf_posext.evaluation.retrieval.sequential import (ABOVE, BELOW, UNDECIDED, SequentialRule,
                                                       clopper_pearson, simulate)


def _wrong_by_enumeration(rule, p_depths, bar):
    """P(wrong decision) of the whole rule (stop at the first look that decides), by enumerating
    every outcome of every trial with its probability: no simulation, no shared code path."""
    import itertools
    D, per = len(p_depths), rule.max_trials
    p = sum(p_depths) / D
    wrong_call = BELOW if p >= bar else ABOVE
    total = 0.0
    for bits in itertools.product((0, 1), repeat=D * per):     # bits[d * per + t]: depth d, trial t
        prob = 1.0
        for i, b in enumerate(bits):
            q = p_depths[i // per]
            prob *= q if b else 1 - q
        for look in range(1, rule.looks + 1):
            m = min(look * rule.look, per)
            k = sum(bits[d * per + t] for d in range(D) for t in range(m))
            decision = rule.decide(k, m * D, bar, D)[0]
            if decision != UNDECIDED:
                total += prob * (decision == wrong_call)
                break
    return total


def test_exact_levels_are_the_largest_the_looks_allow():
    """The exact level against scipy's binomial tails and a full enumeration of the walk: at the
    bar, the chance that some look's p-value is <= c is at most alpha, and at the next attainable
    p-value above c it would be more (c is not needlessly small); c >= alpha / J (Bonferroni)."""
    import itertools
    from scipy.stats import binom
    rule = SequentialRule(look=2, max_trials=6, confidence=0.9)          # looks at 2, 4, 6 trials
    def pval(k, n, bar, upper):
        return binom.sf(k - 1, n, bar) if upper else binom.cdf(k, n, bar)

    def err(c, bar, upper):
        out = 0.0
        for bits in itertools.product((0, 1), repeat=6):
            if any(pval(sum(bits[:n]), n, bar, upper) <= c for n in (2, 4, 6)):
                out += bar ** sum(bits) * (1 - bar) ** (6 - sum(bits))
        return out

    for bar in (0.5, 0.3, 0.8):
        t_low, t_high = rule.tails(bar, 1)
        for tail, upper in ((t_low, True), (t_high, False)):
            attainable = sorted({pval(k, n, bar, upper) for n in (2, 4, 6) for k in range(n + 1)})
            above = min(v for v in attainable if v > tail)
            assert 0.1 / 3 <= tail and err(tail, bar, upper) <= 0.1 < err(above, bar, upper), (bar, upper, tail)


@pytest.mark.parametrize("p_depths, bar", [((0.0, 1.0), 0.5), ((0.2, 0.8), 0.5), ((0.5, 0.5), 0.5),
                                           ((0.9, 0.7), 0.8), ((1.0, 0.6), 0.8), ((0.7, 0.7), 0.7),
                                           ((0.45, 0.15), 0.3), ((1.0, 0.0, 0.5), 0.5)])
def test_the_exact_rule_on_depths_that_differ_enumerated(p_depths, bar):
    """Depths pooled with different accuracies whose mean is the bar (the worst case of their
    mean's side: raising any depth's accuracy only makes `above` likelier) and a shade below it:
    the exact probability of a wrong decision, by enumeration, within the stated alpha."""
    rule = SequentialRule(look=1, max_trials=6 if len(p_depths) == 2 else 4, confidence=0.8)
    assert _wrong_by_enumeration(rule, p_depths, bar) <= 0.2 + 1e-12
    lower = [max(0.0, q - 0.01) for q in p_depths]                          # mean below: `above` is wrong
    assert _wrong_by_enumeration(rule, lower, bar) <= 0.2 + 1e-12


def test_the_enumeration_catches_a_rule_without_the_correction():
    class Naive(SequentialRule):   # alpha at every look, as a fixed-n interval read after each
        def interval(self, k, n, bar=None, depths=None):
            return clopper_pearson(k, n, 1 - self.confidence)

    rule = Naive(look=1, max_trials=6, confidence=0.8)
    assert _wrong_by_enumeration(rule, (0.5, 0.5), 0.5) > 0.26 and _wrong_by_enumeration(rule, (0.7, 0.7), 0.7) > 0.27


def test_the_exact_rule_needs_fewer_trials_than_bonferroni():
    exact, bonf = SequentialRule(), SequentialRule(boundary="bonferroni")
    # 2 depths, all right, bar 0.9: P(32/32) = 0.9^32 = 0.034 <= 0.05 and P(24/24) = 0.08 > 0.05, so
    # the exact levels pass it at 32 trials; alpha / 5 = 0.01 would need 0.9^n <= 0.01, n >= 44 > 40
    assert simulate([1.0, 1.0], 0.9, exact, 50) == ({ABOVE: 50, BELOW: 0, UNDECIDED: 0}, 32.0)
    assert simulate([1.0, 1.0], 0.9, bonf, 50) == ({ABOVE: 0, BELOW: 0, UNDECIDED: 50}, 40.0)
    assert exact.tails(0.3, 5)[0] > bonf.tails(0.3, 5)[0] and exact.tails(0.3, 5)[1] > 0.01
    with pytest.raises(ValueError, match="needs the question's number of depths"):
        exact.decide(3, 20, 0.3)
    with pytest.raises(ValueError, match="is not a look of this rule"):
        exact.decide(3, 21, 0.3, 5)

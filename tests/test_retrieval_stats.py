"""Retrieval scoring and statistics against independent references: scipy's Wilson interval,
RULER's string_match_all formula, and the effective length on hand-built rows."""

import pytest

from hf_posext.evaluation.retrieval.stats import (effective_length, exact_match, score_trial,
                                                  string_match_all, wilson)


@pytest.mark.parametrize("k, n", [(0, 20), (1, 20), (10, 20), (19, 20), (20, 20), (3, 7), (57, 100)])
def test_wilson_matches_scipy(k, n):
    stats = pytest.importorskip("scipy.stats")
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson(k, n)
    assert low == pytest.approx(ref.low, abs=1e-9) and high == pytest.approx(ref.high, abs=1e-9)


def test_wilson_closed_forms():
    # 0 of n: upper bound z²/(n + z²) (Wilson 1927), independent of the general expression
    z2 = 1.959963984540054 ** 2
    assert wilson(0, 20) == pytest.approx((0.0, z2 / (20 + z2)))
    assert wilson(20, 20) == pytest.approx((20 / (20 + z2), 1.0))
    with pytest.raises(ValueError, match="at least one trial"):
        wilson(0, 0)


def test_string_match_all_is_rulers_formula():
    # RULER eval/synthetic/constants.py: sum(r.lower() in pred.lower() for r in ref) / len(ref)
    def ruler(pred, ref):
        return sum(1.0 if r.lower() in pred.lower() else 0.0 for r in ref) / len(ref)
    cases = [("The numbers are 1234567, 7654321.", ["1234567", "7654321", "1111111"]),
             (" APPLE, pear", ["apple", "Pear"]), ("", ["1"])]
    for pred, ref in cases:
        assert string_match_all(pred, ref) == ruler(pred, ref)
    assert score_trial("1234567 and 7654321", ["1234567", "7654321"], True) == 1.0


def test_exact_match_takes_the_first_number():
    assert exact_match(" 12345. Remember", "12345")
    assert not exact_match(" 123456", "12345")          # a longer number is not the key
    assert not exact_match(" 99999 then 12345", "12345")
    assert exact_match(" Apple, pear", "apple") and not exact_match("", "apple")


def _rows(method, accuracy_by_length, trials=10):
    return [{"method": method, "length": n, "correct": round(a * trials), "trials": trials}
            for n, a in accuracy_by_length.items()]


def test_effective_length_is_relative_to_the_models_own_accuracy():
    none = _rows("none", {4: 0.6, 8: 0.8, 16: 0.0, 32: 0.0})       # L = 8: reference 0.7
    good = _rows("yarn", {4: 0.7, 8: 0.7, 16: 0.65, 32: 0.3})
    assert effective_length(good, none, trained=8, margin=0.1) == (16, pytest.approx(0.7))
    # a dip stops it even if a longer length recovers
    dip = _rows("ntk", {4: 0.7, 8: 0.5, 16: 0.7})
    assert effective_length(dip, none, 8, 0.1)[0] == 4
    assert effective_length(_rows("x", {4: 0.1}), none, 8, 0.1)[0] is None
    # no length within L: no reference, no effective length
    assert effective_length(good, _rows("none", {16: 0.5}), 8, 0.1) == (None, None)
    # a model that cannot do the task within L: no bar to hold, no effective length
    assert effective_length(good, _rows("none", {4: 0.0, 8: 0.1}), 8, 0.1) == (None, pytest.approx(0.05))


def test_an_accuracy_equal_to_the_bar_clears_it():
    """Reference 8/10 within L less 0.1 is a bar of 0.7 (0.7000000000000001 in floats): 7/10 is at
    least the bar, 69/100 is not."""
    reference = _rows("none", {8: 0.8})
    assert effective_length(_rows("yarn", {8: 0.8, 16: 0.7}), reference, 8, 0.1)[0] == 16
    assert effective_length(_rows("yarn", {8: 0.8, 16: 0.69}, trials=100), reference, 8, 0.1)[0] == 8


def test_a_target_with_a_lower_bound_needs_enough_trials():
    """>= 0.9 with a Wilson lower bound >= 0.7: 9/9 and 10/10 pass (bounds 0.701, 0.722), 9/10 is
    0.9 but its bound 0.596 fails, 18/20 likewise (0.699); the bounds are Wilson's formula with
    z = 1.96 worked by hand: low = (p + z²/2n - z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    from hf_posext.evaluation.retrieval.stats import target_verdict
    assert target_verdict(10, 10, 0.9, 0.7) == "met"
    assert target_verdict(9, 9, 0.9, 0.7) == "met"
    assert target_verdict(9, 10, 0.9, 0.7) == "missed (accuracy 0.90, lower bound 0.60)"
    assert target_verdict(18, 20, 0.9, 0.7) == "missed (accuracy 0.90, lower bound 0.699)"   # not "0.70"
    assert target_verdict(8, 10, 0.8) == "met"
    assert target_verdict(7, 10, 0.8) == "missed (accuracy 0.70 vs 0.8)"

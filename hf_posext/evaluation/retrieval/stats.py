"""Scoring and statistics: exact match and RULER's string_match_all, the Wilson interval, and
the effective length.

- exact (one answer): the first number in the generated text equals the answer (the passkey rule;
  a longer number or another number first is wrong). Answers that are not numbers: the answer
  is the first word.
- string_match_all (several answers; RULER `eval/synthetic/constants.py`): the share of answers
  found, case-insensitively, anywhere in the generated text. A trial *counts as correct* when
  every answer is found (share 1), so accuracy is a proportion of trials with a binomial
  interval; the mean share, RULER's own number, is kept as `score`.
- Wilson 95 % interval (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it over the normal
  interval for small n and rates near 0 or 1): p̂ ± z·√(p̂(1-p̂)/n + z²/4n²), shifted and scaled
  by 1/(1 + z²/n), z = 1.95996.
- effective length: see `effective_length`.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

Z95 = 1.959963984540054
BAR_TOLERANCE = 1e-9   # far below 1/n for any trial count run here


def first_number(text: str) -> int | None:
    m = re.search(r"\d+", text)
    return int(m.group()) if m else None


def exact_match(text: str, answer: str) -> bool:
    if answer.isdigit():
        return first_number(text) == int(answer)
    words = re.findall(r"\w+", text)
    return bool(words) and words[0].lower() == answer.lower()


def string_match_all(text: str, answers: Sequence[str]) -> float:
    return sum(a.lower() in text.lower() for a in answers) / len(answers)


def score_trial(text: str, answers: Sequence[str], multi_answer: bool) -> float:
    """1.0/0.0 for an exact-match task, the share of answers found for a multi-answer one."""
    if multi_answer:
        return string_match_all(text, answers)
    return float(exact_match(text, answers[0]))


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials."""
    if n <= 0:
        raise ValueError(f"the Wilson interval needs at least one trial, got n={n}")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def rate_text(k: int, n: int) -> str:
    """`k/n = p̂ [low, high]` (Wilson 95 %), the form the reports' tables print."""
    low, high = wilson(k, n)
    return f"{k}/{n} = {k / n:.2f} [{low:.2f}, {high:.2f}]"


def target_verdict(k: int, n: int, accuracy: float, lower_bound: float | None = None) -> str:
    """"met" when k/n reaches `accuracy` and, if a `lower_bound` is asked, the Wilson 95 % lower
    bound reaches it too (a target such as ">= 0.9 with a lower bound >= 0.7" holds only on enough
    trials: 9/9 has 0.70, 10/10 0.72); else "missed (...)" with the figures that missed."""
    low = wilson(k, n)[0]
    if k / n >= accuracy and (lower_bound is None or low >= lower_bound):
        return "met"
    # a bound just under the bar is shown with the digit that misses it (18/20: 0.699, not "0.70")
    shown = f"{low:.2f}" if lower_bound is None or round(low, 2) < lower_bound else f"{low:.3f}"
    return (f"missed (accuracy {k / n:.2f}, lower bound {shown})" if lower_bound is not None
            else f"missed (accuracy {k / n:.2f} vs {accuracy:g})")


def pooled(rows: Sequence[dict]) -> tuple[int, int]:
    """(correct, trials) summed over rows (e.g. the depths of one length)."""
    return sum(int(r["correct"]) for r in rows), sum(int(r["trials"]) for r in rows)


def clears(k: int, n: int, reference: float, margin: float) -> bool:
    """k/n is at least the bar (reference - margin), the bar's float error allowed for: 0.8 - 0.1 is
    0.7000000000000001, and 7/10 must clear the bar a page prints as 0.70."""
    return k / n >= reference - margin - BAR_TOLERANCE


def effective_length(method_rows: Sequence[dict], reference_rows: Sequence[dict],
                     trained: int, margin: float) -> tuple[int | None, float | None]:
    """(effective length, reference accuracy) of one method on one task.

    Reference: the unpatched model's accuracy pooled over every depth and length <= the
    trained length L (what the model itself does where it was trained). The effective length is
    the longest grid length N such that at every grid length <= N the method's accuracy, pooled
    over depths, is at least reference - margin; None when it already fails at the shortest
    length, when the grid has no length <= L to take the reference from, or when the reference
    is at most the margin: a model that cannot do the task within L sets a bar at or below zero,
    which every length passes, so the task says nothing about how far the method carries it.

    RULER (§4) instead uses one fixed threshold for every model, Llama-2-7B's 85.6 % at 4k. A
    fixed bar says nothing about a small model whose own in-context accuracy is below it (every
    length fails); relative to the model's own accuracy within L, the number says how far a
    method carries what the model can do, which is what a context extension promises."""
    ref_rows = [r for r in reference_rows if int(r["length"]) <= trained]
    if not ref_rows:
        return None, None
    k, n = pooled(ref_rows)
    reference = k / n
    if reference <= margin:
        return None, reference
    by_length: dict[int, list[dict]] = {}
    for r in method_rows:
        by_length.setdefault(int(r["length"]), []).append(r)
    best = None
    for length in sorted(by_length):
        k, n = pooled(by_length[length])
        if not clears(k, n, reference, margin):
            break
        best = length
    return best, reference

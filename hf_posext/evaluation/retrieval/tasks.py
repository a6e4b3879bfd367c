"""The synthetic tasks, after RULER (Hsieh et al. 2024, arXiv 2404.06654, §3 and its
`scripts/data/synthetic/` templates): what is hidden (needles), what is asked, what counts as
the answer. Every trial is a function of its seed (`random.Random(seed)`), so a rerun builds the
same prompts.

- single_needle: the passkey (Mohtashami & Jaggi 2023) in niah_single_1's haystack: one five-digit key.
- niah_single: RULER's niah_single_1 itself (its wording): one key, one seven-digit number; the
  wording matters to a small model (docs/retrieval_measurements.md, "What the grid says").
- multi_key: the queried needle among `distractors` needles of other keys (niah_multikey_1).
- multi_value: one key with `values` values, all asked for (niah_multivalue).
- multi_query: `queries` keys, each asked for (niah_multiquery).
- variable_tracking: a chain `VAR A = 12345`, `VAR B = VAR A`, ... of `hops` assignments; every
  name holding the value is asked for (RULER's vt, a multi-hop trace).

The first needle (the queried one) sits at the cell's depth; the others follow, spread evenly
to the end of the haystack (`prompt.py`), so every trial of a cell shares the prompt up to the
depth (the cached prefix, `decode.py`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

# The passkey (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2): a five-digit key in
# repetitive filler; the filler is RULER's repeated-noise haystack (niah "noise" type).
PREFIX = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
          "memorize it. I will quiz you about the important information there.\n")
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "What is the pass key? The pass key is"
# RULER's niah template (synthetic/constants.py), the needle and the query.
RULER_PREFIX = ("Some special magic numbers are hidden within the following text. Make sure to "
                "memorize it. I will quiz you about the numbers afterwards.\n")
# With one number asked (niah_single_1, niah_multikey_1) RULER turns the head singular
# (prepare_niah.py: "Some" -> "A", "are" -> "is", numbers -> number).
RULER_PREFIX_ONE = ("A special magic number is hidden within the following text. Make sure to "
                    "memorize it. I will quiz you about the number afterwards.\n")
RULER_NEEDLE = "One of the special magic numbers for {key} is: {value}.\n"
VT_PREFIX = ("Memorize and track the chain(s) of variable assignment hidden in the following "
             "text.\n")
# A fixed word list for keys and variable names (RULER draws words from `wonderwords`; a list
# kept here needs no package and gives the same words on every machine).
WORDS = ("apple", "river", "falcon", "marble", "lantern", "cactus", "violin", "harbor", "pepper",
         "glacier", "meadow", "saddle", "thunder", "walnut", "compass", "orchid", "pebble",
         "quartz", "rocket", "spinach", "tundra", "velvet", "whistle", "yogurt", "zephyr",
         "anchor", "bamboo", "candle", "dolphin", "ember", "fossil", "garnet", "hammock",
         "igloo", "jasmine", "kettle", "lobster", "magnet", "nectar", "oyster", "parrot",
         "quiver", "raven", "sapphire", "tulip", "umbrella", "volcano", "wizard", "beacon",
         "cobalt", "dagger", "elbow", "fiddle", "goblet", "hazel", "ivory", "jungle", "koala")
VT_NAMES = tuple(w.upper()[:5] for w in WORDS)


@dataclass(frozen=True)
class Trial:
    """One trial: the needle texts (the queried one first), the prompt's head and question, the
    answers it must produce, and whether the score is exact (one answer) or all-of (several)."""
    seed: int
    head: str
    needles: tuple[str, ...]
    question: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    name: str
    ruler: str            # the RULER task it follows
    multi_answer: bool    # scored with string_match_all (every answer must appear)
    make: Callable[[random.Random, int], "Trial"]   # (rng, seed) -> Trial

    def trial(self, seed: int) -> Trial:
        return self.make(random.Random(seed), seed)


def passkey_for_seed(seed: int) -> int:
    return random.Random(seed).randint(10000, 99999)


def passkey_trial(key: int, seed: int = -1) -> Trial:
    return Trial(seed, PREFIX, (NEEDLE.format(key=key),), QUESTION, (str(key),))


def _number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))   # RULER's values: seven-digit numbers


def _ruler_question(keys: list[str]) -> str:
    if len(keys) == 1:
        return (f"What is the special magic number for {keys[0]} mentioned in the provided text? "
                f"The special magic number for {keys[0]} mentioned in the provided text is")
    names = ", ".join(keys[:-1]) + f", and {keys[-1]}"
    return (f"What are all the special magic numbers for {names} mentioned in the provided text? "
            f"The special magic numbers for {names} mentioned in the provided text are")


def _single(rng: random.Random, seed: int) -> Trial:
    return passkey_trial(passkey_for_seed(seed), seed)   # `hf-posext passkey`, seed for seed


def _niah_single(rng: random.Random, seed: int) -> Trial:
    """RULER's niah_single_1 as lm-evaluation-harness builds it: one key, one seven-digit value."""
    return _multi_key(rng, seed, distractors=0)


def _multi_key(rng: random.Random, seed: int, distractors: int = 3) -> Trial:
    keys = rng.sample(WORDS, distractors + 1)
    values = [_number(rng) for _ in keys]
    needles = tuple(RULER_NEEDLE.format(key=k, value=v) for k, v in zip(keys, values))
    return Trial(seed, RULER_PREFIX_ONE, needles, _ruler_question(keys[:1]), (values[0],))


def _multi_value(rng: random.Random, seed: int, values: int = 4) -> Trial:
    key = rng.choice(WORDS)
    vals = [_number(rng) for _ in range(values)]
    needles = tuple(RULER_NEEDLE.format(key=key, value=v) for v in vals)
    question = (f"What are all the special magic numbers for {key} mentioned in the provided "
                f"text? The special magic numbers for {key} mentioned in the provided text are")
    return Trial(seed, RULER_PREFIX, needles, question, tuple(vals))


def _multi_query(rng: random.Random, seed: int, queries: int = 4) -> Trial:
    keys = rng.sample(WORDS, queries)
    vals = [_number(rng) for _ in keys]
    needles = tuple(RULER_NEEDLE.format(key=k, value=v) for k, v in zip(keys, vals))
    return Trial(seed, RULER_PREFIX, needles, _ruler_question(keys), tuple(vals))


def _variable_tracking(rng: random.Random, seed: int, hops: int = 4) -> Trial:
    names = rng.sample(VT_NAMES, hops + 1)
    value = str(rng.randint(10000, 99999))
    needles = (f"VAR {names[0]} = {value}.\n",) + tuple(
        f"VAR {b} = VAR {a}.\n" for a, b in zip(names, names[1:]))
    question = (f"Find all variables that are assigned the value {value} in the text above. "
                f"Answer: According to the chain(s) of variables assignment in the text above, "
                f"{hops + 1} variables are assigned the value {value}, they are:")
    return Trial(seed, VT_PREFIX, needles, question, tuple(names))


TASKS = {t.name: t for t in (
    Task("single_needle", "niah_single_1's haystack, the passkey's wording", False, _single),
    Task("niah_single", "niah_single_1", False, _niah_single),
    Task("multi_key", "niah_multikey_1", False, _multi_key),
    Task("multi_value", "niah_multivalue", True, _multi_value),
    Task("multi_query", "niah_multiquery", True, _multi_query),
    Task("variable_tracking", "vt", True, _variable_tracking),
)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown retrieval task {name!r}; use one of {', '.join(TASKS)}.")
    return TASKS[name]


def answer_text(trial: Trial) -> str:
    """The answer as the model should write it after the question (its token count bounds the
    generation)."""
    return " " + ", ".join(trial.answers) + "."

"""A fact about a document, the question asked about it and its answer, as tokens: what the
recipe's synthetic long-range examples (training/synthetic.py) and the search's needle objective
(search/needle.py) are built from, each in its own wording. Keys are whole words of the document,
values 4-7 digit numbers or another word of it."""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    """A fact, the question asked about it at the end of the window, and the answer (the only
    tokens with a loss when `loss: answer`). `value`: "digits" (a 4-7 digit number) or "word"
    (another word of the window)."""
    fact: str
    question: str
    answer: str
    value: str


# Keys and word values: whole words of the window itself (4-16 letters).
KEY_WORD = re.compile(r"(?<![A-Za-z])[A-Za-z]{4,16}(?![A-Za-z])")


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def pieces(tokenizer, fmt: Format, key: str, value: str) -> tuple[list[int], list[int], list[int]]:
    """(fact, question, answer) token ids; the fact and the question on lines of their own."""
    return (_encode(tokenizer, "\n" + fmt.fact.format(key=key, value=value) + "\n"),
            _encode(tokenizer, "\n" + fmt.question.format(key=key)),
            _encode(tokenizer, fmt.answer.format(value=value)))


def draw_fact(rng: random.Random, fmt: Format, text: str) -> tuple[str, str]:
    """(key, value) for `fmt` from the window's `text`."""
    # A word touching either end of the window may be cut by the packing: not used.
    words = sorted({m.group() for m in KEY_WORD.finditer(text) if 0 < m.start() and m.end() < len(text)})
    key = rng.choice(words) if words else "".join(rng.choices(string.ascii_uppercase, k=6))
    if fmt.value == "digits":
        digits = rng.randint(4, 7)
        return key, str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))
    others = [w for w in words if w.lower() != key.lower()]
    return key, rng.choice(others) if others else "".join(rng.choices(string.ascii_lowercase, k=6))


def draw_distractors(rng: random.Random, fmt: Format, text: str, key: str, value: str,
                     n: int) -> list[tuple[str, str]]:
    """`n` more (key, value) pairs of `fmt` for the same window, no word or number used twice among
    all keys and values, the asked fact's included (case-insensitive; "A goes together with B"
    reads both ways): facts of the same form as the asked one, which the answer must not be taken
    from (RULER's niah_multikey distractors, in this module's wording)."""
    seen, out = {key.lower(), value.lower()}, []
    for _ in range(n):
        for _attempt in range(64):
            k, v = draw_fact(rng, fmt, text)
            if k.lower() not in seen and v.lower() not in seen and k.lower() != v.lower():
                break
        else:   # a window with too few distinct words: made-up ones, redrawn until new
            while k.lower() in seen:
                k = "".join(rng.choices(string.ascii_uppercase, k=8))
            while v.lower() in seen | {k.lower()}:
                v = str(rng.randint(10 ** 6, 10 ** 7 - 1)) if fmt.value == "digits" else \
                    "".join(rng.choices(string.ascii_lowercase, k=8))
        seen |= {k.lower(), v.lower()}
        out.append((k, v))
    return out

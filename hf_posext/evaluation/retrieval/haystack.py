"""Haystacks: the text the needles hide in, as token pieces (needles go between pieces).

- `noise`: RULER's repeated-noise haystack ("The grass is green. The sky is blue. ..."), the
  passkey filler, one piece repeated.
- a document source (`--dataset`, the loader of hf_posext/data/): the first document long
  enough, cut at line ends, so a needle never splits a word or a line.
Pieces are tokenised separately, so a prompt's length is known in tokens without re-encoding.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ...data.documents import TextSource, load_documents
from . import tasks

NOISE_NAME = "noise"


@dataclass(frozen=True)
class Haystack:
    label: str
    pieces: tuple[tuple[int, ...], ...]
    repeat: bool            # noise: the one piece repeats without end
    fingerprint: str

    def take(self, budget: int) -> list[tuple[int, ...]]:
        """The first pieces whose tokens fit in `budget`."""
        out, used, i = [], 0, 0
        while True:
            if not self.repeat and i >= len(self.pieces):
                return out
            piece = self.pieces[i % len(self.pieces)]
            if used + len(piece) > budget:
                return out
            out.append(piece)
            used += len(piece)
            i += 1


def _encode(tokenizer, texts: list[str]) -> list[tuple[int, ...]]:
    return [tuple(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _digest(label: str, pieces) -> str:
    # the repr of (label, pieces) as passed (a tuple for noise, a list for a document): stored
    # results are keyed by this digest, so its input must stay exactly what it has been
    return hashlib.sha256(repr((label, pieces)).encode()).hexdigest()[:12]


def noise_haystack(tokenizer) -> Haystack:
    pieces = tuple(_encode(tokenizer, [tasks.NOISE]))
    if not pieces[0]:
        raise ValueError("the tokenizer turns the noise haystack into no tokens; use the model's "
                         "own tokenizer.")
    return Haystack(NOISE_NAME, pieces, True, _digest(NOISE_NAME, pieces))


def document_haystack(tokenizer, source: TextSource, tokens: int) -> Haystack:
    """The first document of `source` with at least `tokens` tokens (its first lines only are
    tokenised: what the longest prompt can hold)."""
    longest = 0
    for doc in load_documents(source, streaming=True):
        lines = doc.text.splitlines(keepends=True)
        pieces, total = [], 0
        for start in range(0, len(lines), 256):
            for ids in _encode(tokenizer, lines[start:start + 256]):
                if ids:
                    pieces.append(ids)
                    total += len(ids)
            if total >= tokens:
                label = f"{source.label}: {doc.name}"
                return Haystack(label, tuple(pieces), False, _digest(label, pieces))
        longest = max(longest, total)
    raise ValueError(f"no document of {source.label} has the {tokens} tokens the longest length "
                     f"needs (the longest has {longest}); use shorter --lengths or the noise "
                     "haystack.")


def load_haystack(tokenizer, name: str, tokens: int, **source) -> Haystack:
    if name == NOISE_NAME:
        return noise_haystack(tokenizer)
    return document_haystack(tokenizer, TextSource(name, **source), tokens)

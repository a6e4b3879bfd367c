"""Haystacks: the text the needles hide in, as token blocks (needles go between blocks).

- `noise`: RULER's repeated-noise haystack ("The grass is green. The sky is blue. ..."), the
  passkey filler, one block repeated.
- a document source (`--dataset`, the loader of hf_posext/data/): the first document long
  enough, cut at line ends, so a needle never splits a word or a line.
Blocks are tokenised separately, so a prompt's length is known in tokens without re-encoding.
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
    blocks: tuple[tuple[int, ...], ...]
    repeat: bool            # noise: the one block repeats without end
    fingerprint: str

    def take(self, budget: int) -> list[tuple[int, ...]]:
        """The first blocks whose tokens fit in `budget`."""
        out, used, i = [], 0, 0
        while True:
            if not self.repeat and i >= len(self.blocks):
                return out
            block = self.blocks[i % len(self.blocks)]
            if used + len(block) > budget:
                return out
            out.append(block)
            used += len(block)
            i += 1


def _encode(tokenizer, texts: list[str]) -> list[tuple[int, ...]]:
    return [tuple(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _digest(label: str, blocks) -> str:
    return hashlib.sha256(repr((label, blocks)).encode()).hexdigest()[:12]


def noise_haystack(tokenizer) -> Haystack:
    blocks = tuple(_encode(tokenizer, [tasks.NOISE]))
    if not blocks[0]:
        raise ValueError("the tokenizer turns the noise haystack into no tokens; use the model's "
                         "own tokenizer.")
    return Haystack(NOISE_NAME, blocks, True, _digest(NOISE_NAME, blocks))


def document_haystack(tokenizer, source: TextSource, tokens: int) -> Haystack:
    """The first document of `source` with at least `tokens` tokens (its first lines only are
    tokenised: what the longest prompt can hold)."""
    longest = 0
    for doc in load_documents(source, streaming=True):
        lines = doc.text.splitlines(keepends=True)
        blocks, total = [], 0
        for start in range(0, len(lines), 256):
            for ids in _encode(tokenizer, lines[start:start + 256]):
                if ids:
                    blocks.append(ids)
                    total += len(ids)
            if total >= tokens:
                label = f"{source.label}: {doc.name}"
                return Haystack(label, tuple(blocks), False, _digest(label, blocks))
        longest = max(longest, total)
    raise ValueError(f"no document of {source.label} has the {tokens} tokens the longest length "
                     f"needs (the longest has {longest}); use shorter --lengths or the noise "
                     "haystack.")


def load_haystack(tokenizer, name: str, tokens: int, **source) -> Haystack:
    if name == NOISE_NAME:
        return noise_haystack(tokenizer)
    return document_haystack(tokenizer, TextSource(name, **source), tokens)

"""Synthetic long-range examples mixed into the fine-tuning data (`data.synthetic`).

Long-context data recipes mix long documents with synthetic retrieval examples whose evidence sits
far from the question. Here each synthetic example is built from one packed training window (the
training documents' own text, never the evaluation's): a key-value fact is written early in the
window, the question about it and its answer end the window, and the document text fills the
rest. The collator then gives the example PoSE position ids (Zhu et al. 2023, arXiv 2309.10400)
whose chunk cuts keep the fact in the first chunk and the question in the last, with the last
position drawn in [min_span x target, target): the model reads a fact and is asked for it
thousands of positions later, at the memory cost of one short window (`pose.sample_spanning_position_ids`).

Which windows become synthetic: exactly round(share x n) of the n packed windows, chosen by
`random.Random(seed)`; each example's format, key, value and fact offset come from
`random.Random(seed * 1_000_003 + row)`, so the mix is a pure function of (windows, seed, config).

The haystack (`data.synthetic.haystacks`): by default the example is built in its own window's
document text. Naming other sources (source code: `embedded:python-stdlib`) makes each example draw
one of the listed haystacks, and for another source a packed window of it replaces the window's
text. A model asked for a number inside code tends to answer in the code's idiom (a quoted name
from the file) rather than the number; examples whose filler is code are what teach it otherwise
(docs/finetuning_measurements.md, "Retrieval in code"). With the default list the draws, and so
the mix, are unchanged.

Shorter examples (`data.synthetic.window`): each example keeps only the first `window` tokens of
its window, so long document windows (what lowers the perplexity cost past the trained length) can
sit beside examples laid out as in a short-window recipe (what found the needle far back); the
dataset then holds rows of two lengths, one per batch. Unset, every row is a full window.

Distractors (`data.synthetic.distractors`): other facts of the asked one's form in the same window,
so the answer has to be the asked key's value rather than any number written far back
(`build_example`). With 0, the default, no draw is added and the mix is the one without them.
Formats are this module's own wording: never the evaluation's needles (passkey's "The pass key
is ...", RULER's "One of the special magic numbers for ... is: ...", "VAR X = Y"), which a test
checks.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from ..data.facts import Format, draw_distractors, draw_fact, pieces
from ..errors import ConfigError
from ..evaluation.shared.data import tokenizer_fingerprint

NO_SPAN = -1                     # span columns of a plain document window
TRAINING_HAYSTACK = "training"   # data.synthetic.haystacks: the window's own document text

# The formats (data/facts.py builds their tokens).
FORMATS = {
    "code_sentence": Format("The code for {key} is {value}.",
                            "What is the code for {key}? The code for {key} is", " {value}.", "digits"),
    "remember_kv": Format("Remember this: {key}={value}",
                          "Recall what you were asked to remember. {key}=", "{value}", "digits"),
    "word_pair": Format("{key} goes together with the word {value}.",
                        "Which word goes together with {key}? It is the word", " {value}.", "word"),
}
LOSSES = ("answer", "window")
LONGEST_KEY, LONGEST_VALUE = "W" * 16, "9" * 7
MAX_DISTRACTORS = 16   # data.synthetic.distractors: each fact costs window tokens


def check_formats_fit(tokenizer, formats: Sequence[str], window: int, num_chunks: int,
                      distractors: int = 0) -> None:
    """Every format, with the longest key and value it can draw and its distractor facts, must
    leave room in the window for one token of document text per PoSE cut between the fact and
    the question."""
    for name in formats:
        fact, question, answer = pieces(tokenizer, FORMATS[name], LONGEST_KEY, LONGEST_VALUE)
        n = len(fact) * (1 + distractors) + len(question) + len(answer)
        if n + max(num_chunks - 1, 0) > window:
            raise ConfigError(f"data.synthetic.formats: {name!r} needs up to {n} tokens (fact"
                              f"{f' and {distractors} distractors' if distractors else ''} + question "
                              f"+ answer) plus {max(num_chunks - 1, 0)} of text, more than the "
                              f"{window}-token window; raise training.seq_len (and data.synthetic.window "
                              f"if set) or drop the "
                              f"format{' or lower data.synthetic.distractors' if distractors else ''}.")


def build_example(window_ids: Sequence[int], tokenizer, format_name: str, rng: random.Random,
                  num_chunks: int, distractors: int = 0) -> dict:
    """One synthetic example of len(window_ids) tokens: document text, the fact within the first
    W/16 tokens (without distractors), document text, the question, the answer. Returns input_ids and the span columns
    (fact_start, fact_end, question_start, answer_start: token indices).

    With `distractors` = d > 0, d more facts of the same format (other keys, other values) are
    written too, and the d + 1 facts sit at random offsets of the document text with the asked
    one at a random rank among them: the answer is bound to its key, not to "the fact near the
    start" (where the asked one would always be otherwise). The PoSE cut falls after the asked
    fact (`sample_spanning_position_ids`), so it is still up to the target length before the
    question, while a distractor after the cut sits near it: RULER's niah_multikey case, whose
    misses past the trained length are a distractor's value."""
    window, fmt = len(window_ids), FORMATS[format_name]
    text = tokenizer.decode(list(window_ids), skip_special_tokens=True)
    key, value = draw_fact(rng, fmt, text)
    fact, question, answer = pieces(tokenizer, fmt, key, value)
    others = [pieces(tokenizer, fmt, k, v)[0] for k, v in draw_distractors(rng, fmt, text, key, value, distractors)]
    room = window - len(fact) - sum(map(len, others)) - len(question) - len(answer)   # document tokens kept
    cuts = max(num_chunks - 1, 0)
    if room < cuts:
        raise ConfigError(f"data.synthetic: a {format_name!r} example ({window - room} tokens) does not fit "
                          f"the {window}-token window; raise training.seq_len.")
    if not others:
        before = rng.randint(0, min(room - cuts, window // 16))   # "early": first W/16
        offsets, rank = [before], 0
    else:   # text offsets of the d + 1 facts, leaving `cuts` text tokens after the last one
        offsets, rank = sorted(rng.randint(0, room - cuts) for _ in range(len(others) + 1)), rng.randrange(len(others) + 1)
    facts = others[:rank] + [fact] + others[rank:]
    ids, start, done = [], 0, 0
    for i, (offset, piece) in enumerate(zip(offsets, facts)):
        ids += list(window_ids[done:offset])
        done = offset
        if i == rank:
            start = len(ids)
        ids += piece
    ids += list(window_ids[done:room]) + question + answer
    return {"input_ids": ids, "fact_start": start, "fact_end": start + len(fact),
            "question_start": window - len(question) - len(answer), "answer_start": window - len(answer),
            "format": format_name}


def example_window(sc, window: int) -> int:
    """Tokens per synthetic example: data.synthetic.window, or the training window when unset."""
    return window if sc.window is None else min(sc.window, window)


def _plain(ids) -> dict:
    return {"input_ids": list(ids), "fact_start": NO_SPAN, "fact_end": NO_SPAN,
            "question_start": NO_SPAN, "answer_start": NO_SPAN, "format": "", "haystack": ""}


def chosen_rows(n: int, share: float, seed: int) -> set[int]:
    """Exactly round(share x n) of the n windows, chosen by the seed."""
    return set(random.Random(seed).sample(range(n), round(share * n)))


def mix_synthetic(packed, tokenizer, sc, *, seed: int, num_chunks: int, cache_dir=None, haystacks=None):
    """The packed windows (a `datasets.Dataset` with `input_ids`) with round(sc.share x n) of them
    replaced by synthetic examples; span columns added (NO_SPAN for document windows). `haystacks`
    maps each source of sc.haystacks other than "training" to its packed windows (same length).
    Cached next to the packed file under a fingerprint of the inputs."""
    from datasets.fingerprint import Hasher

    from .packing import cache_root
    plain = packed.with_format(None)
    window = len(plain[0]["input_ids"])
    short = example_window(sc, window)   # an example is cut from the front of its window
    check_formats_fit(tokenizer, sc.formats, short, num_chunks, sc.distractors)
    chosen, formats = chosen_rows(len(plain), sc.share, seed), list(sc.formats)
    others = {name: windows.with_format(None) for name, windows in (haystacks or {}).items()}
    missing = [h for h in sc.haystacks if h != TRAINING_HAYSTACK and h not in others]
    if missing or any(len(w[0]["input_ids"]) != window for w in others.values()):
        raise ValueError(f"mix_synthetic: give the packed {window}-token windows of {missing or list(others)}")
    key = Hasher.hash([plain._fingerprint, tokenizer_fingerprint(tokenizer), asdict(sc), seed, num_chunks,
                       {name: asdict(FORMATS[name]) for name in formats},
                       *[(name, w._fingerprint) for name, w in sorted(others.items())]])

    def make(batch, indices):
        rows = []
        for ids, i in zip(batch["input_ids"], indices):
            if i in chosen:
                rng = random.Random(seed * 1_000_003 + i)
                name = formats[rng.randrange(len(formats))]
                hay = sc.haystacks[rng.randrange(len(sc.haystacks))] if len(sc.haystacks) > 1 else sc.haystacks[0]
                if hay != TRAINING_HAYSTACK:   # another source's window takes this one's place
                    ids = others[hay][rng.randrange(len(others[hay]))]["input_ids"]
                rows.append({**build_example(ids[:short], tokenizer, name, rng, num_chunks, sc.distractors),
                             "haystack": hay})
            else:
                rows.append(_plain(ids))
        return {k: [r[k] for r in rows] for k in rows[0]}

    root = cache_root() if cache_dir is None else Path(cache_dir)
    mixed = plain.map(make, batched=True, with_indices=True, desc="synthetic mix",
                      cache_file_name=str(root / f"{key}-mix.arrow"), new_fingerprint=f"{key}-m")
    return mixed.with_format("torch", columns=[c for c in mixed.column_names if c not in ("format", "haystack")],
                             output_all_columns=True)

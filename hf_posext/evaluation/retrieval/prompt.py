"""A cell's prompts: every trial of a (task, length, depth) shares the head and the haystack up
to the depth (the `prefix`, prefilled once, `decode.py`); each trial's `suffix` holds its
needles, the rest of the haystack and its question.

Layout: head + pieces[:before] | needle 0 + ... + question, where the haystack has k pieces (as
many as fit beside the longest trial's needles, question and answer: the prompt and the tokens
generated stay within the cell's length, as RULER sizes its inputs by max_seq_length minus
tokens_to_generate), before = round(depth · k), needle 0 (the queried one) goes before piece
`before` and needle i of m before piece before + round(i · (k - before) / m): spread evenly to
the end.

A cell's layout (k, and the rope hold of a dynamic method) depends on the longest trial it
holds. Sequential looks run a cell's trials a block of seeds at a time (`blocks.py`), so
`layout_seeds` (all the seeds the cell may ever run) fixes it: every look's prompts are then the
fixed design's token for token (the same prefix at every look, which `decode.SharedPrefix`
serves from its cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .haystack import Haystack
from .tasks import Task, Trial, answer_text

# The layout's version, part of every cell's data hash (run.data_hash): a change to how prompts
# are laid out re-identifies the cells it changes instead of resuming rows made the old way.
# 2: the answer's tokens are reserved within the length (1 let them run past it).
LAYOUT = 2


@dataclass
class CellPrompts:
    prefix: list[int]
    suffixes: list[list[int]]
    trials: list[Trial]
    max_new_tokens: list[int]
    # per trial, [start, end) of the queried needle's tokens in prompt(i) (`probe.py` measures
    # the attention paid to them)
    needle_spans: list[tuple[int, int]] = field(default_factory=list)
    # the rope hold of the layout's trials when they are more than these (`subset`)
    hold: int | None = None
    head: int = 0   # the prompt's first tokens that are the task's head (its instruction)

    def prompt(self, i: int) -> list[int]:
        return self.prefix + self.suffixes[i]

    @property
    def hold_length(self) -> int:
        """Prompt + answer tokens of the longest trial: a dynamic method's frequencies are those
        of this length for every trial of the cell (so the shared prefix's cache is valid)."""
        if self.hold is not None:
            return self.hold
        return max(len(self.prefix) + len(s) + m for s, m in zip(self.suffixes, self.max_new_tokens))

    def subset(self, indices: list[int]) -> "CellPrompts":
        """These trials only, in the layout (and rope hold) of all of them."""
        pick = lambda xs: [xs[i] for i in indices]   # noqa: E731
        return CellPrompts(self.prefix, pick(self.suffixes), pick(self.trials), pick(self.max_new_tokens),
                           pick(self.needle_spans) if self.needle_spans else [], self.hold_length, self.head)

    def window(self, tokens: int) -> "CellPrompts":
        """The sliding-window baseline's prompts: each trial's head and the last tokens of the rest,
        as many as fit with its answer in `tokens` (the model's own window, ending where the answer
        starts: what a reader that cuts a long prompt from the left, keeping the instruction,
        asks). A needle farther back than the window is not in its prompt, so the attention
        diagnosis (`probe.py`), which reads the needle's place, has no spans here."""
        suffixes = []
        for i, m in enumerate(self.max_new_tokens):
            keep = tokens - self.head - m
            if keep < 1:
                raise ValueError(f"a window of {tokens} tokens cannot hold the task's instruction ({self.head} "
                                 f"tokens) and answer ({m}) with any of the haystack")
            suffixes.append(self.prompt(i)[self.head:][-keep:])
        return CellPrompts(self.prefix[:self.head], suffixes, self.trials, self.max_new_tokens, [], None, self.head)


def _ids(tokenizer, text: str, special: bool = False) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def min_tokens(tokenizer, trials: list[Trial], haystack: Haystack) -> int:
    """The shortest length that holds one haystack piece with every trial's needles and answer."""
    return (len(_ids(tokenizer, trials[0].head, True)) + max(map(len, haystack.pieces))
            + max(_beside_haystack(tokenizer, t) for t in trials))


def _answer_tokens(tokenizer, trial: Trial) -> int:
    """Generation stops at the answer's length: its tokens, one spare for a merge at the seam."""
    return len(_ids(tokenizer, answer_text(trial))) + 1


def _beside_haystack(tokenizer, trial: Trial) -> int:
    """A trial's tokens besides the head and the haystack: needles, question, answer."""
    return (sum(len(_ids(tokenizer, n)) for n in trial.needles) + len(_ids(tokenizer, trial.question))
            + _answer_tokens(tokenizer, trial))


def build_cell(tokenizer, task: Task, haystack: Haystack, length: int, depth: float,
               seeds, layout_seeds=None) -> CellPrompts:
    """The prompts of `seeds`, laid out for `layout_seeds` (a superset; default `seeds`)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1 (a fraction of the haystack), got {depth}")
    seeds = list(seeds)
    layout = seeds if layout_seeds is None else list(layout_seeds)
    if not set(seeds) <= set(layout):
        raise ValueError(f"seeds {sorted(set(seeds) - set(layout))} are not among the layout's seeds")
    trials = [task.trial(s) for s in layout]
    cell = place(tokenizer, trials, haystack, length, depth, task.name,
                 lambda: min_tokens(tokenizer, trials, haystack))
    return cell if layout == seeds else cell.subset([layout.index(s) for s in seeds])


def place(tokenizer, trials: list[Trial], haystack: Haystack, length: int, depth: float,
          what: str, needed) -> CellPrompts:
    """The prompts of `trials` (one head) at `length` and `depth` (the layout above)."""
    head = _ids(tokenizer, trials[0].head, special=True)
    reserve = max(_beside_haystack(tokenizer, t) for t in trials)
    pieces = haystack.take(length - len(head) - reserve)
    if not pieces:
        raise ValueError(f"length {length} is too short for a {what} prompt (needs at least "
                         f"{needed()} tokens with this tokenizer and haystack)")
    k = len(pieces)
    before = round(depth * k)
    prefix = head + [t for piece in pieces[:before] for t in piece]
    suffixes, max_new, spans = [], [], []
    for trial in trials:
        m = len(trial.needles)
        at: dict[int, list[tuple[int, str]]] = {}
        for i, needle in enumerate(trial.needles):
            at.setdefault(before + round(i * (k - before) / m), []).append((i, needle))
        suffix: list[int] = []
        for j in range(before, k + 1):
            for i, needle in at.get(j, []):
                ids = _ids(tokenizer, needle)
                if i == 0:   # the queried needle: where its tokens sit in the whole prompt
                    spans.append((len(prefix) + len(suffix), len(prefix) + len(suffix) + len(ids)))
                suffix += ids
            if j < k:
                suffix += pieces[j]
        suffixes.append(suffix + _ids(tokenizer, trial.question))
        max_new.append(_answer_tokens(tokenizer, trial))
    return CellPrompts(prefix, suffixes, trials, max_new, spans, head=len(head))

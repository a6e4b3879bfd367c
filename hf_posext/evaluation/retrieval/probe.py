"""Why a model misses a needle: for each trial of a cell, three measures of
one prompt, run as the suite runs it —

- the answer's loss: the negative log-likelihood of each token of the right answer (" " + the
  answers, as `tasks.answer_text` writes them, without its closing period), teacher-forced after
  the prompt: how far the right answer is from being generated. Its mean and its first token's
  leave out leading tokens that are only whitespace (SmolLM2 writes " 60494" as " ", "6", ...:
  the space is the format, the digits are the answer);
- the attention the prompt's last position (the one that predicts the answer's first token) pays
  to the queried needle's tokens (`CellPrompts.needle_spans`): per layer, the softmax weights on
  the span, summed over it and averaged over the heads; beside it the same for a control span of
  equal length at a fixed place far from the needle (`control_span`);
- the greedy answer (`decode.generate_trial`), scored by the suite's rule (`stats.score_trial`).

The prompt minus its last token is prefilled as the suite prefills it (SDPA; the cell's prefix
once, `decode.prefill`, each trial on a fork of its cache); the last token then runs alone under
transformers' eager attention with `output_attentions=True`, so each layer returns its weights as
[1, heads, 1, N]: one row, cheap at 16k, where a full eager forward would hold heads × N × N.
The switch is `PreTrainedModel.set_attn_implementation` (public in transformers 4.57 and 5.x;
for a model that cannot switch it only warns and keeps the old one, so the switch is checked),
and the model's own implementation is set back after the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch

from ...attention.continuation import continuation_attention
from ...generation import fixed_rope_scale
from .decode import CACHE_KWARG, SharedPrefix, fork, generate_trial, prefill
from .prompt import CellPrompts, _ids
from .stats import score_trial

ANSWER_TOKENS = 10   # greedy tokens kept: the answer and what the model writes around it


def check_attention(model) -> str:
    """The model's attention implementation, if the probe can read its weights as eager ones."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"the attention probe reads transformers' eager weights, but this model attends by "
                         f"{impl!r} (whose weights eager attention would not reproduce); load it with "
                         "attn_implementation='sdpa'.")
    return impl


@contextmanager
def eager_attention(model):
    """Within the block the model attends by transformers' eager attention (which returns its
    weights); its own implementation ("sdpa" or "eager") is set back after."""
    was = check_attention(model)
    if was == "eager":
        yield model
        return
    model.set_attn_implementation("eager")
    if model.config._attn_implementation != "eager":
        raise RuntimeError(f"{type(model).__name__} did not switch to eager attention "
                           "(set_attn_implementation left it as it was); its weights cannot be read.")
    try:
        yield model
    finally:
        model.set_attn_implementation(was)


def span_mass(attentions, start: int, end: int) -> list[float]:
    """Per layer, the weight the last query puts on keys [start, end): summed over the span,
    averaged over the heads. attentions: one [1, heads, queries, keys] tensor per layer."""
    return [float(a[0, :, -1, start:end].float().sum(-1).mean()) for a in attentions]


def control_span(span: tuple[int, int], length: int) -> tuple[int, int]:
    """A span as long as `span` at a fixed place far from it in a `length`-token prompt: at 3/4
    of the prompt, or at 1/4 when the needle starts past 3/5 of it (so depths 0 to 0.5 share one
    control place; away from the head's first tokens, where attention sinks, and from the
    question, which the last position reads)."""
    start, end = span
    n = end - start
    at = round((0.75 if start <= 0.6 * length else 0.25) * length)
    if (at < end and start < at + n) or at + n > length - 1:
        raise ValueError(f"a {length}-token prompt has no room for a {n}-token control span apart from "
                         f"the needle at [{start}, {end}); use a longer length.")
    return at, at + n


def _forward(model, ids: list[int], cache, **kwargs):
    """One forward of `ids` continuing `cache` (grown in place), all positions' logits."""
    x = torch.tensor([ids], device=next(model.parameters()).device)
    return model(x, use_cache=True, **{CACHE_KWARG: cache}, **kwargs)


def probe_trial(model, tokenizer, cell: CellPrompts, i: int, base, multi_answer: bool,
                answer_tokens: int = ANSWER_TOKENS) -> dict:
    """The three measures of trial `i` (module doc); `base`: the cache of the cell's prefix or
    None (left untouched)."""
    ids, trial = cell.prompt(i), cell.trials[i]
    start, end = cell.needle_spans[i]
    if trial.answers[0] not in tokenizer.decode(ids[start:end]):
        raise ValueError(f"the needle's span [{start}, {end}) does not hold its answer "
                         f"{trial.answers[0]!r}: the prompt is not laid out as prompt.place lays it out.")
    control = control_span((start, end), len(ids))
    with continuation_attention(model):
        cache = prefill(model, ids[:-1], fork(base) if base is not None else None)
    step = fork(cache)
    with eager_attention(model):
        out = _forward(model, ids[-1:], step, output_attentions=True)
    attentions = out.attentions
    if not attentions or any(a is None or a.shape[-1] != len(ids) for a in attentions):
        raise RuntimeError("the eager step returned no attention weights over the whole prompt.")
    answer = _ids(tokenizer, " " + ", ".join(trial.answers))
    logits = out.logits[0, -1:]
    if len(answer) > 1:   # the answer's later tokens, teacher-forced after its first ones
        with continuation_attention(model):
            logits = torch.cat([logits, _forward(model, answer[:-1], step).logits[0]])
    nll = torch.nn.functional.cross_entropy(logits.float(), torch.tensor(answer, device=logits.device),
                                            reduction="none").tolist()
    lead = next((j for j, t in enumerate(answer) if tokenizer.decode([t]).strip()), 0)
    with continuation_attention(model):
        text = tokenizer.decode(generate_trial(model, tokenizer, ids, answer_tokens, cache),
                                skip_special_tokens=True)
    needle, far = span_mass(attentions, start, end), span_mass(attentions, *control)
    score = score_trial(text, trial.answers, multi_answer)
    return {"seed": trial.seed, "prompt_tokens": len(ids), "needle_span": [start, end],
            "control_span": list(control), "answer": " ".join(trial.answers), "answer_tokens": len(answer),
            "nll": sum(nll[lead:]) / len(nll[lead:]), "nll_first": nll[lead], "nll_tokens": nll,
            "needle_mean": sum(needle) / len(needle), "needle_max": max(needle),
            "needle_max_layer": needle.index(max(needle)),
            "control_mean": sum(far) / len(far), "control_max": max(far),
            "output": " ".join(text.split()), "score": score, "correct": score == 1.0,
            "needle_mass": needle, "control_mass": far}


@torch.inference_mode()
def probe_cell(model, tokenizer, cell: CellPrompts, multi_answer: bool, *,
               shared: tuple[SharedPrefix, object] | None = None,
               answer_tokens: int = ANSWER_TOKENS, only: Sequence[int] | None = None) -> list[dict]:
    """`probe_trial` for every trial of the cell (or the indices in `only`: a rerun's missing
    seeds, probed in the same prompts as the whole cell's), its prefix prefilled once (`shared` =
    (holder, model-state key): extended from a shallower cell's, as `decode.answer_cell` does)."""
    check_attention(model)
    if len(cell.needle_spans) != len(cell.trials):
        raise ValueError("the cell has no needle spans; build it with retrieval.prompt.build_cell.")
    with fixed_rope_scale(model, cell.hold_length):
        base = None
        if len(cell.prefix) > 1:
            with continuation_attention(model):
                base = (shared[0].cache_of(model, cell.prefix, (shared[1], cell.hold_length))
                        if shared is not None else prefill(model, cell.prefix))
        return [probe_trial(model, tokenizer, cell, i, base, multi_answer, answer_tokens)
                for i in (range(len(cell.trials)) if only is None else only)]

"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2).

A five-digit key is hidden at a chosen depth of repetitive filler text; the model is asked for it
and decodes greedily. Accuracy is the share of seeds whose first number in the answer equals the
key. The prompt is assembled from separately tokenised pieces, so its length is controlled in
tokens: prefix + filler × k₁ + needle + filler × k₂ + question, as long as fits in `length`.
Keys come from `random.Random(seed)`, so a rerun gives the same prompts and the same numbers.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Sequence

import torch

from ..generation import generate as fixed_scale_generate
from ..patcher import is_patched, unpatch
from .loss import PeakMemory
from ..patcher import trained_length
from .grid import apply_method, knobs_for, method_factors
from .perplexity import rope_signature

PREFIX = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
          "memorize it. I will quiz you about the important information there.\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "What is the pass key? The pass key is"
MAX_NEW_TOKENS = 12  # enough for " 12345." with one token per digit


def passkey_for_seed(seed: int) -> int:
    return random.Random(seed).randint(10000, 99999)


@dataclass
class PasskeyPrompt:
    input_ids: list[int]
    key: int
    needle_start: int  # token index where the needle begins


def build_prompt(tokenizer, length: int, depth: float, key: int) -> PasskeyPrompt:
    """A prompt of at most `length` tokens with the needle after round(depth·k) filler blocks."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1 (a fraction of the filler), got {depth}")
    enc = lambda text, special=False: tokenizer(text, add_special_tokens=special)["input_ids"]
    prefix, filler = enc(PREFIX, special=True), enc(FILLER)
    needle, question = enc(NEEDLE.format(key=key)), enc(QUESTION)
    fixed = len(prefix) + len(needle) + len(question)
    k = (length - fixed) // len(filler)
    if k < 1:
        raise ValueError(f"length {length} is too short for a passkey prompt (needs at least "
                         f"{fixed + len(filler)} tokens with this tokenizer)")
    before = round(depth * k)
    ids = prefix + filler * before
    start = len(ids)
    ids += needle + filler * (k - before) + question
    return PasskeyPrompt(ids, key, start)


def first_number(text: str) -> int | None:
    m = re.search(r"\d+", text)
    return int(m.group()) if m else None


def greedy_answer(model, tokenizer, input_ids: list[int]) -> str:
    """Greedy decoding, with a dynamic method's scale fixed for the whole call."""
    device = next(model.parameters()).device if any(True for _ in model.parameters()) else "cpu"
    ids = torch.tensor([input_ids], device=device)                 # [1, T]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = fixed_scale_generate(model, ids, MAX_NEW_TOKENS, do_sample=False, pad_token_id=pad,
                               attention_mask=torch.ones_like(ids))
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def evaluate_passkey(model, tokenizer, *, methods: Sequence[str], lengths: Sequence[int],
                     depths: Sequence[float], seeds: Sequence[int], factors: Sequence = ("auto",),
                     store=None, model_name: str = "model", dtype: str = "", device: str = "cpu",
                     answer_fn: Callable | None = None, reuse_identical: bool = True,
                     progress: bool = True, knobs: dict | None = None) -> list[dict]:
    """Passkey accuracy for every (method, factor, length, depth), over `seeds`.

    answer_fn(model, tokenizer, input_ids) -> decoded answer text; defaults to greedy decoding.
    Rows are written to `store` as each cell finishes; cells it holds are skipped (resume).
    reuse_identical: a cell whose rotary cos/sin over prompt + answer positions equal an earlier
    cell's (same length, depth, seeds) would decode the same tokens: its answers are copied and
    the row says so in `same_as` (see `perplexity.rope_signature`)."""
    from tqdm.auto import tqdm

    answer_fn = answer_fn or greedy_answer
    trained = trained_length(model) if hasattr(model, "config") else max(lengths)
    cells = [(method, spec, s, length, float(d))
             for length in sorted(set(lengths))
             for method, spec, s in method_factors(methods, factors, length, trained)
             for d in depths]
    rows, seeds = [], list(seeds)
    done: dict[tuple, dict] = {}   # (length, depth, signature) -> the row that computed it
    for row in (store.rows if store is not None else []):
        if row.get("rope_signature"):
            done.setdefault((int(row["length"]), float(row["depth"]), row["seeds_list"],
                             row["rope_signature"]), row)
    bar = tqdm(cells, desc="passkey cells", unit="cell", disable=not progress)
    for method, spec, s, length, depth in bar:
        key = "|".join(map(str, (model_name, method, f"{s:.6g}", length, f"{depth:g}",
                                 ",".join(map(str, seeds)), dtype)))
        bar.set_postfix_str(f"{method} s={s:g} L={length} depth={depth:g}")
        if store is not None and store.has(key):
            rows.append(store.get(key))
            continue
        answers, outputs, correct, signature, source, peak = [], [], 0, "", None, None
        seeds_list = ",".join(map(str, seeds))
        started = time.perf_counter()
        try:
            prompts = [build_prompt(tokenizer, length, depth, passkey_for_seed(seed)) for seed in seeds]
            if hasattr(model, "config"):
                apply_method(model, method, s, knobs_for(method, knobs or {}))
                # Every total length decoded (prompts may differ by a token across keys), so a
                # dynamic method's frequencies are compared at each length it will really use.
                totals = sorted({len(p.input_ids) + MAX_NEW_TOKENS for p in prompts})
                signature = "+".join(rope_signature(model, n) for n in totals)
            if reuse_identical and signature:
                source = done.get((length, depth, seeds_list, signature))
            if source is not None:
                correct, answers = source["correct"], source["answers"].split()
                outputs = source.get("outputs", "").split(" | ")
            else:
                with PeakMemory(device) as peak:
                    for prompt in prompts:
                        text = answer_fn(model, tokenizer, prompt.input_ids)
                        outputs.append(" ".join(text.split())[:40])   # the raw answer, one line
                        got = first_number(text)
                        correct += int(got == prompt.key)
                        answers.append(f"{prompt.key}:{'' if got is None else got}")
        finally:
            if hasattr(model, "config") and is_patched(model):
                unpatch(model)
        prompt_tokens = max(len(p.input_ids) for p in prompts)
        row = {"model": model_name, "method": method, "factor": s, "factor_spec": spec,
               "length": length, "prompt_tokens": prompt_tokens, "depth": depth,
               "seeds": len(seeds), "seeds_list": seeds_list, "correct": correct,
               "accuracy": correct / len(seeds), "answers": " ".join(answers),
               "outputs": " | ".join(outputs),
               "seconds": round(time.perf_counter() - started, 3),
               "peak_rss_mb": round(peak.peak_mb, 1) if peak else None, "trained_length": trained,
               "dtype": dtype, "device": str(device), "rope_signature": signature,
               "same_as": f"{source['method']} s={source['factor']:g}" if source else "",
               "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "key": key}
        if signature:
            done.setdefault((length, depth, seeds_list, signature), row)
        if store is not None:
            store.add(row)
        rows.append(row)
    return rows

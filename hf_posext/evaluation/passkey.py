"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2).

A five-digit key is hidden at a chosen depth of repetitive filler text; the model is asked for it
and decodes greedily. Accuracy is the share of seeds whose first number in the answer equals the
key. The prompt is assembled from separately tokenised pieces, so its length is controlled in
tokens: prefix + filler × k₁ + needle + filler × k₂ + question, as long as fits in `length`.
Keys come from `random.Random(seed)`, so a rerun gives the same prompts and the same numbers.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..generation import generate as fixed_scale_generate
from ..patcher import trained_length
from .grid import Cell, knobs_for, method_factors, run_grid
from .identity import model_dtype, run_identity
from .inputs import check_device
from .loss import PeakMemory

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


def _encode(tokenizer, text: str, special: bool = False) -> list[int]:
    return tokenizer(text, add_special_tokens=special)["input_ids"]


def build_prompt(tokenizer, length: int, depth: float, key: int) -> PasskeyPrompt:
    """A prompt of at most `length` tokens with the needle after round(depth·k) filler blocks."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be between 0 and 1 (a fraction of the filler), got {depth}")
    prefix, filler = _encode(tokenizer, PREFIX, special=True), _encode(tokenizer, FILLER)
    needle, question = _encode(tokenizer, NEEDLE.format(key=key)), _encode(tokenizer, QUESTION)
    fixed = len(prefix) + len(needle) + len(question)
    if not filler or not needle:
        raise ValueError("the tokenizer turns the passkey's filler or needle text into no tokens; "
                         "use the model's own tokenizer (a folder with tokenizer files).")
    k = (length - fixed) // len(filler)
    if k < 1:
        raise ValueError(f"length {length} is too short for a passkey prompt (needs at least "
                         f"{fixed + len(filler)} tokens with this tokenizer)")
    before = round(depth * k)
    ids = prefix + filler * before
    start = len(ids)
    ids += needle + filler * (k - before) + question
    return PasskeyPrompt(ids, key, start)


def prompt_fingerprint(tokenizer) -> str:
    """The data hash of a passkey run: the pieces `build_prompt` assembles, as this tokenizer
    encodes them. A prompt is a function of these, the length, the depth and the key, and the
    last three are in each cell's key; so the hash does not depend on which other cells a run
    asks for, and a later run with more lengths or depths resumes the cells already there."""
    pieces = [_encode(tokenizer, PREFIX, special=True), _encode(tokenizer, FILLER),
              _encode(tokenizer, QUESTION),
              *(_encode(tokenizer, NEEDLE.format(key=k)) for k in (10000, 12345, 67890, 99999))]
    return hashlib.sha256(repr(pieces).encode()).hexdigest()[:12]


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


def passkey_cells(methods, lengths, depths, seeds, factors, trained: int, knobs=None,
                  skip=()) -> list[Cell]:
    """Cells in run order: by length, then method (`none` first), then depth; `skip`: (method,
    length, s) cells left out (`inputs.check_cells`)."""
    seeds_text = ",".join(map(str, seeds))
    return [Cell(method, spec, s, length, "passkey", knobs_for(method, knobs or {}),
                 {"depth": float(d), "seeds_list": seeds_text, "seeds": len(seeds),
                  "max_new_tokens": MAX_NEW_TOKENS})
            for length in sorted(set(lengths))
            for method, spec, s in method_factors(methods, factors, length, trained)
            if (method, length, s) not in set(skip)
            for d in depths]


def evaluate_passkey(model, tokenizer, *, methods: Sequence[str], lengths: Sequence[int],
                     depths: Sequence[float], seeds: Sequence[int], factors: Sequence = ("auto",),
                     store=None, model_name: str = "model", dtype: str | None = None,
                     device: str = "cpu", answer_fn: Callable | None = None,
                     reuse_identical: bool = True, progress: bool = True,
                     knobs: dict | None = None, fingerprint: str | None = None,
                     ranks=None, skip=()) -> list[dict]:
    """Passkey accuracy for every (method, factor, length, depth), over `seeds`.

    answer_fn(model, tokenizer, input_ids) -> decoded answer text; defaults to greedy decoding.
    Rows are written to `store` as each cell finishes; cells whose key it holds are skipped
    (resume). reuse_identical: a cell whose rotary cos/sin over prompt + answer positions and
    attention equal an earlier cell's (same length, depth, seeds) would decode the same tokens:
    its answers are copied and the row says so in `same_as` (see `grid.run_grid`). skip:
    (method, length, s) cells left out (`inputs.check_cells` under `--methods all`)."""
    seeds = list(seeds)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {seeds} repeat a seed; each seed must count once.")
    if dtype not in (None, "", "auto") and model_dtype(model) != dtype:
        raise ValueError(f"dtype={dtype!r} but the model runs in {model_dtype(model)}.")
    check_device(device, "device=")
    answer_fn = answer_fn or greedy_answer
    trained = trained_length(model)
    cells = passkey_cells(methods, lengths, depths, seeds, factors, trained, knobs, skip)
    prompts = {(n, d): [build_prompt(tokenizer, n, d, passkey_for_seed(seed)) for seed in seeds]
               for n in set(lengths) for d in {c.extra["depth"] for c in cells}}
    identity = run_identity(model, fingerprint=fingerprint, device=device,
                            data_hash=prompt_fingerprint(tokenizer))
    base_row = {"model": model_name, "trained_length": trained}

    def forward_lengths(cell: Cell) -> list[int]:
        # Every total length decoded (prompts may differ by a token across keys), so a dynamic
        # method's frequencies are compared at each length it will really use.
        return [len(p.input_ids) + MAX_NEW_TOKENS for p in prompts[(cell.length, cell.extra["depth"])]]

    def compute(cell: Cell) -> dict:
        answers, outputs, correct = [], [], 0
        cell_prompts = prompts[(cell.length, cell.extra["depth"])]
        with PeakMemory(device) as peak:
            for prompt in cell_prompts:
                text = answer_fn(model, tokenizer, prompt.input_ids)
                outputs.append(" ".join(text.split())[:40])   # the raw answer, one line
                got = first_number(text)
                correct += int(got == prompt.key)
                answers.append(f"{prompt.key}:{'' if got is None else got}")
        return {"prompt_tokens": max(len(p.input_ids) for p in cell_prompts), "correct": correct,
                "accuracy": correct / len(seeds), "answers": " ".join(answers),
                "outputs": " | ".join(outputs), "peak_rss_mb": round(peak.peak_mb, 1)}

    return run_grid(model, cells, identity=identity, base_row=base_row, compute=compute,
                    result_fields=("prompt_tokens", "correct", "accuracy", "answers", "outputs"),
                    forward_lengths=forward_lengths, store=store, reuse=reuse_identical,
                    ranks=ranks, progress=progress, desc="passkey cells")

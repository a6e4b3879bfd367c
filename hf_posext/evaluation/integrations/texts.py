"""Perplexity across context lengths of texts given in Python: what the `evaluate` module
(hf_posext/evaluation/integrations/long_context_perplexity.py) calls, usable without it.

    from hf_posext.evaluation.integrations.texts import evaluate_texts
    out = evaluate_texts([open("book.txt").read()], "embedded:smollm2-135m",
                         lengths=[4096, 16384], methods=["yarn"], factors=[2])

Every argument is checked before the tokenizer or the model loads; then the texts with enough
tokens for the longest length are kept (the truncate rule: the same texts at every length),
and the grid runs through `evaluate_perplexity`. Returns columns (one entry per row) in the
layout `evaluate` modules return.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ...data.embedded import load_model, load_tokenizer
from ...errors import ConfigError
from ...rope.knobs import factor_spec
from ..shared.data import TokenCache, scored_bytes, select_documents
from ..shared.grid import canonical, check_knobs
from ..perplexity.run import evaluate_perplexity
from ..shared.settings import PerplexityGrid, RunInfo

COLUMNS = ("method", "factor", "length", "protocol", "knobs", "perplexity", "tokens",
           "bits_per_byte", "ratio_to_sliding", "ratio_to_sliding_beyond_L", "ratio_to_unpatched")


def check_text_inputs(texts: Any, lengths: Any, methods: Any, factors: Any, knobs: Any,
                 dtype: str, max_docs: Any) -> PerplexityGrid:
    """The grid these arguments ask for; ConfigError naming the argument otherwise."""
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts \
            or not all(isinstance(t, str) for t in texts):
        raise ConfigError("data must be a non-empty list of strings (one document each).")
    if isinstance(lengths, (int, str)) or not lengths or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 2 for n in lengths):
        raise ConfigError(f"lengths must be a list of integers >= 2 (tokens), got {lengths!r}.")
    if isinstance(factors, str) or not factors or not isinstance(factors, Sequence):
        raise ConfigError(f"factors must be a list of numbers >= 1 and/or 'auto', got {factors!r}.")
    for f in factors:
        try:
            factor_spec(f)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"factors must be a list of numbers >= 1 and/or 'auto': {err}.") from None
    if isinstance(methods, str):
        raise ConfigError(f"methods must be a list of names, e.g. [{methods!r}].")
    try:
        names = [canonical(m) for m in methods]
        check_knobs(names, knobs or {})
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err)) from None
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}.")
    if max_docs is not None and (isinstance(max_docs, bool) or not isinstance(max_docs, int)
                                 or max_docs < 1):
        raise ConfigError(f"max_docs must be a positive integer or None, got {max_docs!r}.")
    try:
        return PerplexityGrid(methods=names, lengths=list(lengths), factors=list(factors),
                              knobs=knobs)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def evaluate_texts(texts: Sequence[str], model: str, lengths: Sequence[int],
                   methods: Sequence[str] = (), factors: Sequence = ("auto",),
                   knobs: dict | None = None, max_docs: int | None = None,
                   dtype: str = "float32", device: str = "cpu",
                   gguf_file: str | None = None) -> dict[str, list]:
    """Perplexity of `texts` under `model` (a local folder, a Hub id, or the embedded default)
    for each method in `methods` (the unpatched model always included) at each length, with the
    sliding-window baseline beyond the trained length and its ratios (docs/evaluation.md)."""
    grid = check_text_inputs(texts, lengths, methods, factors, knobs, dtype, max_docs)
    tokenizer = load_tokenizer(model, gguf_file)
    try:
        docs = select_documents(texts, TokenCache(tokenizer), grid.tokens_needed(), max_docs)
    except ValueError as err:
        raise ConfigError(f"data: {err}") from None
    loaded = load_model(name=model, gguf_file=gguf_file, dtype=getattr(torch, dtype)).to(device).eval()
    rows = evaluate_perplexity(loaded, docs.docs, grid, progress=False,
                               run=RunInfo(model_name=model, dataset="texts",
                                           data_hash=docs.fingerprint, device=device),
                               text_bytes=scored_bytes(tokenizer, docs.docs))
    return {c: [r.get(c) for r in rows] for c in COLUMNS}

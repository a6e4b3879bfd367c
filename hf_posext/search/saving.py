"""The saved result of a search: the best point as a checkpoint in its most portable exact form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..patcher import patch, trained_length, unpatch
from ..rope.compat import get_rope_parameters, text_config
from ..rope.longrope import longrope_dict
from .run import SearchResult
from .space import SEED_METHODS

SHORT_FACTORS = ("same", "identity")


def save_best(model, tokenizer, result: SearchResult, out: str | Path, target_length: int,
              short_factors: str = "same") -> dict[str, Any]:
    """Save model + tokenizer under `out` with the best config in its most portable exact form:
    a rope-only method's own form when the best is an unchanged seed (e.g. transformers' `yarn`),
    else transformers' `longrope`. Returns the rope dict written.

    `short_factors`: "same" (the searched factors at every length: one rope, whatever the
    length, as every engine and a KV cache expect) or "identity" (LongRoPE §3.3's separate set
    for contexts <= L, here plain RoPE: a sequence within L then runs the unpatched frequencies,
    only cos/sin x attention_factor differs; always a `longrope` config, since no other type
    has two sets). transformers switches sets by each forward's length; hf_posext.generate
    holds one set for a whole generation (generation.py)."""
    if short_factors not in SHORT_FACTORS:
        raise ValueError(f"short_factors must be one of {SHORT_FACTORS}, got {short_factors!r}")
    config = text_config(model.config)
    trained = trained_length(model)
    factor = target_length / trained
    if result.source in SEED_METHODS and short_factors == "same":
        patch(model, result.source, factor)
    else:
        short = None if short_factors == "same" else [1.0] * len(result.factors)
        rope = longrope_dict(result.factors, result.attention_factor, 1.0, trained, factor,
                             short_factors=short)
        patch(model, "longrope", factor, **{k: rope[k] for k in ("short_factor", "long_factor",
                                                                 "attention_factor")})
    try:
        model.save_pretrained(out)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        return get_rope_parameters(config)
    finally:
        unpatch(model)

"""The markdown table of the decoder families found in transformers (docs/families.md shows it;
tests/test_family_table.py holds the page equal to `family_table(family_verdicts)`).

Each row is read from the code: the family's facts (rope/families.py), hf_posext's verdict
(registry.refusal, families_support), and the rope types the family's own config class accepts,
tried on its default config through transformers' own validation (`validate_rope`); the last
column, what the real engines did with the family's own tiny model, is given by the caller
(docs/families.md: from hf_posext/portability/measured_engines.json, `make engine-table`
rewrites both).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from transformers.utils import logging as hf_logging

from .compat import GLOBAL_LAYER_TYPE, fill_head_dim, get_rope_parameters, head_size, set_rope_parameters
from .families import Family, all_families
from .families_support import ATTENTION_BLOCKERS, attention_blocker

_NATIVE = {"linear": {"factor": 2.0}, "dynamic": {"factor": 2.0},
           "yarn": {"factor": 2.0, "original_max_position_embeddings": 4096},
           "llama3": {"factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 4096}}


def _default_config(fam: Family) -> Any:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[fam.model_type]()
    except Exception:  # a config that needs arguments: its facts still come from the code
        return None


def _accepts(config, rope_type: str, keys: dict[str, Any], dim: int) -> bool:
    """Whether the family's config validation takes `rope_type` (in its full-attention entry)."""
    probe = copy.deepcopy(config)
    fill_head_dim(probe)   # as the patcher does first (Mixtral's head_dim None)
    base = get_rope_parameters(probe)
    if rope_type == "longrope":
        keys = {"short_factor": [1.0] * (dim // 2), "long_factor": [2.0] * (dim // 2),
                "original_max_position_embeddings": 4096, "factor": 2.0}
    try:
        set_rope_parameters(probe, {**base, "rope_type": rope_type, **keys})
    except Exception:
        return False
    return True


def _rope_layers(fam: Family) -> str:
    if fam.chunked and fam.nope_layers:
        return "chunked-attention layers; NoPE layers (`no_rope_layers`) carry none"
    if fam.nope_layers:
        return "all but the NoPE layers (`no_rope_layers`)"
    if fam.rope_if:
        return f"where `{fam.rope_if}`; the others NoPE"
    if fam.per_layer_type:
        return f"per layer type: `{GLOBAL_LAYER_TYPE}` extended, the others keep theirs"
    return "all attention layers"


def _rotary_dim(fam: Family, config) -> str:
    if fam.mla:
        return "`qk_rope_head_dim` (MLA)"
    if fam.heterogeneous or config is None:
        return "per layer" if fam.heterogeneous else "head_dim × partial_rotary_factor"
    partial = get_rope_parameters(config).get("partial_rotary_factor",
                                              getattr(config, "partial_rotary_factor", None))
    return "head_dim" if partial in (None, 1.0) else f"head_dim × {partial:g}"


def _row(fam: Family, engines: Callable[[str], str]) -> str:
    from .registry import refusal   # registry imports this package's modules at import time

    config = _default_config(fam)
    native = "?"
    if config is not None and fam.shared and not fam.heterogeneous:
        try:
            dim = int(head_size(getattr(config, "head_dim", None), config.hidden_size,
                                config.num_attention_heads))
            types = [t for t in (*_NATIVE, "longrope") if _accepts(config, t, _NATIVE.get(t, {}), dim)]
            native = ", ".join(types) or "default only"
        except Exception:
            native = "?"
    why = refusal(fam.model_type)
    blocker = attention_blocker(fam)
    notes = []
    if fam.softmax_from_rope:
        notes.append("softmax scale × get_mscale(s, mscale_all_dim)², reset by patch")
    if why is None:
        yes = "yes, when every layer type has the same rope" if fam.per_layer_type else "yes"
        notes.append("attention methods: " + (yes if blocker is None else
                                              f"no ({ATTENTION_BLOCKERS[blocker][0]})"))
    status = "extended" if why is None else f"refused: {why}"
    cells = [f"`{fam.model_type}`", _rope_layers(fam), _rotary_dim(fam, config), fam.layout,
             native, status, "; ".join(notes), engines(fam.model_type)]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def family_table(engines: Callable[[str], str] = lambda model_type: "") -> str:
    """Every found family, one row each, in transformers' causal-LM table order. `engines`:
    the last column's text for a model type; docs/families.md passes
    `hf_posext.portability.measured.family_verdicts` (the real engines' measurement; rope sits
    below portability, so it is handed in rather than imported)."""
    rows = ["| family (model_type) | rope layers | rotary dim | layout | native rope types | "
            "hf_posext | note | engines (measured) |", "|---|---|---|---|---|---|---|---|"]
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()   # default configs warn about their own defaults
    try:
        rows += [_row(fam, engines) for fam in all_families()]
    finally:
        hf_logging.set_verbosity(verbosity)
    return "\n".join(rows)

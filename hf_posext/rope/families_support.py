"""What hf_posext does with each found family (rope/families.py): extend it or say why not, and
which attention-level methods its attention can take.

Every reason is one line, read from the family's own code; `registry.refusal` adds the explicit
exceptions found by reading transformers' modules by hand.
"""

from __future__ import annotations

from typing import Any

from .compat import GLOBAL_LAYER_TYPE, IS_V5
from .families import Family


def refusal_from_code(fam: Family) -> str | None:
    """Why hf_posext cannot extend a found family's rope exactly (None: it can)."""
    if not fam.shared:
        return (f"its rotary class {', '.join(fam.rotary_classes)} does not build its frequencies "
                "from transformers' shared rope functions (ROPE_INIT_FUNCTIONS and the config's "
                "rope dict), which is how hf_posext extends a model")
    if fam.private_rotary:
        return ("its rotary modules are built from private copies of the config (one per rope "
                "base), which a patched config does not reach")
    if fam.heterogeneous:
        return ("its config sets head_dim and head counts per layer (per_layer_config), while "
                "hf_posext's rope types read one rotary dim per rope dict")
    if fam.rope_labels and GLOBAL_LAYER_TYPE not in fam.rope_labels:
        return (f"its rope dict is nested by {', '.join(fam.rope_labels)}, not by attention layer "
                "type, and no long-context config of it says which entry to scale")
    return None


# Why the attention-level methods (hf_posext/attention) cannot run on a family's attention:
# (short label for the family table, the one-line reason). The kernel replaces the softmax
# attention of every layer, re-rotating queries and keys of the half-split layout by the plain
# rope of the config's (global) rope dict.
ATTENTION_BLOCKERS: dict[str, tuple[str, str]] = {
    "sinks": ("attention sinks", "its attention adds learned sinks to the softmax (gpt-oss style "
              "`sinks` / `s_aux`), which hf_posext's attention kernel does not take"),
    "mla": ("MLA", "it uses multi-head latent attention: rope is on the qk_rope_head_dim part of "
            "each head only, and its softmax scale comes from the rope dict; the attention "
            "kernel re-rotates whole heads"),
    "chunked": ("chunked attention", "its rope layers attend within chunks (attention_chunk_size) "
                "and its global layers carry no rope, while the methods' position maps assume "
                "causal attention with rope on every layer"),
    "nope": ("NoPE layers", "its NoPE layers (no_rope_layers) carry no rope, and the attention "
             "methods re-rotate every layer's queries and keys"),
    "rope_if": ("NoPE layers", "its attention rotates queries and keys only on some layers (the "
                "others are NoPE), and the attention methods re-rotate every layer"),
    "layout": ("not half-split", "its rotary layout is not half-split; the attention kernel "
               "re-rotates the half-split layout (rotate_half)"),
    "by_layer": ("per-layer rope", "its sliding-window layers use another rope than its "
                 "full-attention layers, and the attention methods re-rotate every layer with the "
                 "full-attention rope"),
}


def attention_blocker(fam: Family | None, config: Any = None) -> str | None:
    """The key of ATTENTION_BLOCKERS that keeps the attention methods off a family (None: they
    run). With a config, also its per-layer-type rope entries."""
    if fam is None:
        return None
    for key, found in (("sinks", fam.sinks), ("mla", fam.mla), ("chunked", fam.chunked),
                       ("nope", fam.nope_layers), ("rope_if", fam.rope_if is not None),
                       ("layout", fam.layout != "half-split")):
        if found:
            return key
    if config is not None and IS_V5 and _differs_by_layer(config):
        return "by_layer"
    return None


def attention_refusal(fam: Family | None, config: Any = None) -> str | None:
    """The one-line reason the attention methods cannot run on a family (None: they can)."""
    key = attention_blocker(fam, config)
    if key == "layout" and fam is not None:
        return f"its rotary layout is {fam.layout}; " + ATTENTION_BLOCKERS[key][1].split("; ")[1]
    if key == "rope_if" and fam is not None:
        return (f"its attention rotates queries and keys only where `{fam.rope_if}` (the other "
                "layers are NoPE), and the attention methods re-rotate every layer")
    return None if key is None else ATTENTION_BLOCKERS[key][1]


def _differs_by_layer(config) -> bool:
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or not isinstance(params.get(GLOBAL_LAYER_TYPE), dict):
        return False
    full = params[GLOBAL_LAYER_TYPE]
    keys = ("rope_theta", "partial_rotary_factor")
    return any(isinstance(p, dict) and any(p.get(k) != full.get(k) for k in keys)
               or p is None for t, p in params.items() if t != GLOBAL_LAYER_TYPE)

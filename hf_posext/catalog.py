"""Every method name hf_posext knows: the rope methods (hf_posext/rope) + the attention-level ones
(hf_posext/attention). Built here, above both, so neither subpackage imports the other's names
(`rope.config` used to import `attention.config` only to build this tuple)."""

from __future__ import annotations

from .attention.config import ATTENTION_METHODS
from .rope import config as _rope_config

METHODS: tuple[str, ...] = _rope_config.ROPE_METHODS + ATTENTION_METHODS


def canonical_method(method: str) -> str:
    """Resolve aliases (`dynamic` -> `dynamic_ntk`) over every method; unknown names raise a
    ValueError listing `METHODS` (read at call time, so names added later count too)."""
    return _rope_config.canonical_method(method, METHODS)

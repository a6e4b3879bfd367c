"""Attention modules whose softmax scale transformers derives from the rope dict at construction.

DeepSeek-V2/V3 and the families that copy their attention compute, once in `__init__`
(`DeepseekV3Attention`): `self.scaling = yarn_apply_mscale(config.rope_parameters,
qk_head_dim ** -0.5)`, which multiplies the softmax scale by get_mscale(factor, mscale_all_dim)²
for a non-default rope dict with `mscale_all_dim`. A checkpoint loaded from an extended config gets
it at construction; a loaded model patched in memory gets it here, from the patched config, by the
family's own `yarn_apply_mscale` (found in the attention module's modeling module, as
`families.Family.softmax_from_rope` found the assignment). Per attention module of one model:
nothing global changes, and `restore` puts the constructed values back (`unpatch`, a failed patch).
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def _recompute(module: torch.nn.Module):
    """The family's `yarn_apply_mscale` when `module` is an attention module that takes its
    softmax scale from it, else None."""
    fn = getattr(sys.modules.get(type(module).__module__), "yarn_apply_mscale", None)
    if fn is None or not hasattr(module, "scaling") or not hasattr(module, "qk_head_dim"):
        return None
    return fn


def snapshot(model: torch.nn.Module) -> list[tuple[Any, float]]:
    """(attention module, its softmax scale) for every such module of `model`."""
    modules: list[Any] = [m for m in model.modules() if _recompute(m) is not None]
    return [(m, m.scaling) for m in modules]


def apply(model: torch.nn.Module, config) -> None:
    """Set each such module's scale from `config`'s rope dict, exactly as its `__init__` does."""
    module: Any
    for module in model.modules():
        fn = _recompute(module)
        if fn is not None:
            module.scaling = fn(config.rope_parameters, module.qk_head_dim ** (-0.5))


def restore(saved: list[tuple[Any, float]]) -> None:
    for module, scaling in saved:
        module.scaling = scaling

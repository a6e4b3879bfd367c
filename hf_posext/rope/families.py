"""The decoder families of the installed transformers, found in its own modules, and their rope.

A family is a model type of transformers' causal-LM table (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`)
whose modeling module defines a `*RotaryEmbedding` class built for that type's config class (the
annotation of its `config` argument) that follows the shared pattern of `LlamaRotaryEmbedding`:
frequencies from `ROPE_INIT_FUNCTIONS` and the config's rope dict. Such a module is rebuilt by
`hf_posext.patch` from a patched config exactly as transformers builds it at load time.

What else a family does with its rope is read from the same code (`Family`): which layers carry
it (per-layer-type rope dicts, NoPE layers), its rotary dim (partial, MLA), its layout, and what
its attention adds (a softmax scale read from the rope dict, attention sinks, chunked attention).

Lazy and cached: `family(model_type)` imports one modeling module (already imported when a model
of that type exists; about 0.1 s, tests/test_family_table.py bounds it); `all_families()`
imports every causal-LM modeling module of transformers, once per process (measured here: 4 s
on an idle 2-core machine, 14 s on a loaded one), and only the family table and iterating
`SUPPORTED_MODEL_TYPES` need it. `import hf_posext` runs none of this (tested).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

import torch


@dataclass(frozen=True)
class Family:
    """One decoder family: its rotary classes and what its code does with rope."""

    model_type: str
    rotary_classes: tuple[str, ...]
    module: str                 # the modeling module's name
    shared: bool                # the rotary class builds from ROPE_INIT_FUNCTIONS + the rope dict
    per_layer_type: bool        # one rope dict per attention layer type (Gemma 3, OLMo 3)
    nope_layers: bool           # `no_rope_layers`: layers without rope (SmolLM3, Llama 4)
    chunked: bool               # chunked local attention (Llama 4's `attention_chunk_size`)
    mla: bool                   # multi-head latent attention: rope on `qk_rope_head_dim` only
    sinks: bool                 # learned attention sinks in the softmax (gpt-oss)
    softmax_from_rope: bool     # attention softmax scale from the rope dict (`yarn_apply_mscale`)
    layout: str                 # "half-split", "interleaved", "interleaved (rope_interleave)", ...
    private_rotary: bool        # rotary modules built from private config copies (per-layer theta)
    rope_labels: tuple[str, ...]  # a rope dict nested by labels that are not attention layer types
    heterogeneous: bool         # per-layer config overrides (`per_layer_config`: head_dim per layer)
    rope_if: str | None         # the attention's condition for rotating (other layers: NoPE)


def _modeling_module(model_type: str) -> ModuleType | None:
    """The module of the model type's causal-LM class (imported on first use, as transformers'
    auto classes do); None when transformers has none or it cannot be imported here."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config_class = CONFIG_MAPPING[model_type]
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[config_class]
    except Exception:  # unknown type, a missing optional dependency, a broken import
        return None
    return sys.modules.get(model_class.__module__) or importlib.import_module(model_class.__module__)


def _config_class(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def _fields(config_class) -> set[str]:
    """The config's declared settings (5.x dataclass fields; 4.x `__init__` arguments)."""
    if dataclasses.is_dataclass(config_class):
        return {f.name for f in dataclasses.fields(config_class)}
    return set(inspect.signature(config_class.__init__).parameters)


def _built_for(cls, config_class) -> bool:
    """Whether a rotary class's `config` argument is annotated with this config class."""
    try:
        parameter = inspect.signature(cls.__init__).parameters.get("config")
    except (TypeError, ValueError):
        return False
    annotation = getattr(parameter, "annotation", None)
    return annotation is config_class or annotation == config_class.__name__


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def follows_shared_pattern(cls) -> bool:
    """LlamaRotaryEmbedding's pattern: the init function is `ROPE_INIT_FUNCTIONS[rope_type]`
    read from the config's rope dict (5.x `rope_parameters`, 4.x `rope_scaling`), and the
    frequencies live in `inv_freq` buffers (one, or one per layer type)."""
    src = _source(cls)
    return ("ROPE_INIT_FUNCTIONS" in src and ("rope_parameters" in src or "rope_scaling" in src)
            and "inv_freq" in src)


def _layout(module: ModuleType, fields: set[str], src: str) -> str:
    """How a head's rotary dims pair up, from the module's own `rotate_half` run on 0..7:
    half-split (x_i with x_{i+d/2}, Llama) or interleaved (x_{2i} with x_{2i+1}, GPT-J)."""
    if "rope_interleave" in fields:  # DeepSeek-V3: a config switch, on by default
        return "interleaved (rope_interleave)"
    if re.search(r"view_as_complex|torch\.polar", src):
        return "interleaved (complex)"
    rotate = getattr(module, "rotate_half", None)
    if rotate is None and hasattr(module, "apply_rotary_pos_emb_interleave"):
        return "interleaved"   # DeepSeek's pairs (x0, x1), (x2, x3), ... with no switch (HY-V4 in 5.25)
    if rotate is None:
        return "half-split" if re.search(r"torch\.chunk\(x, 2, dim=-1\)", src) else "unknown"
    x = torch.arange(8.0)
    try:
        out = rotate(x)
    except Exception:
        return "unknown"
    if torch.equal(out, torch.cat([-x[4:], x[:4]])):
        return "half-split"
    if torch.equal(out, torch.stack([-x[1::2], x[0::2]], dim=-1).flatten()):
        return "interleaved"
    return "other"


def _rope_condition(src: str) -> str | None:
    """The condition under which the attention rotates queries and keys, when it does so under one
    (EXAONE 4: `self.sliding_window is None or self.is_sliding`, its global layers NoPE;
    SmolLM3: `self.use_rope`)."""
    for found in re.finditer(r"\n(\s+)if ([^\n]*?):[^\n]*\n\1\s+[^\n]*=\s*apply_rotary\w*\(", src):
        if "interleave" not in found.group(2):   # DeepSeek's layout switch: rotated either way
            return found.group(2)
    return None


@cache
def family(model_type: str) -> Family | None:
    """The family of `model_type`, or None when transformers has no rotary class for it."""
    module = _modeling_module(model_type)
    if module is None:
        return None
    config_class = _config_class(model_type)
    classes: list[Any] = [obj for name, obj in vars(module).items()
               if name.endswith("RotaryEmbedding") and inspect.isclass(obj)
               and obj.__module__ == module.__name__ and _built_for(obj, config_class)]
    if not classes:
        return None
    fields, src = _fields(config_class), _source(module)
    names = tuple(c.__name__ for c in classes)
    per_layer = any("layer_type" in inspect.signature(c.forward).parameters for c in classes)
    # a rotary module built from something other than the model's config: a private copy
    private = any(re.search(rf"(?<!class )\b{n}\((?!\s*(config=)?(self\.)?config\s*[,)])", src) for n in names)
    return Family(
        model_type=model_type, rotary_classes=names, module=module.__name__,
        shared=all(follows_shared_pattern(c) for c in classes),
        per_layer_type=per_layer,
        nope_layers="no_rope_layers" in fields,
        chunked="attention_chunk_size" in fields,
        mla="qk_rope_head_dim" in fields,
        sinks=bool(re.search(r"self\.sinks\s*=|\bs_aux\s*=", src)),
        # DeepseekV3Attention.__init__: self.scaling = yarn_apply_mscale(config.rope_parameters, ...)
        softmax_from_rope=bool(re.search(r"self\.scaling = yarn_apply_mscale\(config\.rope_parameters,"
                                         r" self\.qk_head_dim \*\* \(-0\.5\)\)", src)),
        layout=_layout(module, fields, src),
        private_rotary=private,
        rope_labels=tuple(getattr(config_class, "_rope_type_labels", None) or ()),
        heterogeneous="per_layer_config" in _source(config_class),
        rope_if=_rope_condition(src))


def causal_lm_types() -> tuple[str, ...]:
    """Every model type of transformers' causal-LM table."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return tuple(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


@cache
def all_families() -> tuple[Family, ...]:
    """Every decoder family with a rotary class, in the causal-LM table's order."""
    found = (family(t) for t in causal_lm_types())
    return tuple(f for f in found if f is not None)

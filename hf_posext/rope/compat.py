"""The one version shim: read and write rope settings in transformers 4.x and 5.x layouts (and
switch layer checkpointing, renamed in 5.x).

5.x: `config.rope_parameters = {"rope_type", "rope_theta", <type's keys>}`.
4.x: `config.rope_scaling = {"rope_type", <type's keys>}` (None for default RoPE) and
     `config.rope_theta` as a separate attribute.
Everything else in hf_posext speaks the 5.x layout (a flat dict that includes rope_theta).
"""

from __future__ import annotations

import copy
from typing import Any

import transformers
from packaging.version import Version

TRANSFORMERS_VERSION = Version(transformers.__version__)
IS_V5 = TRANSFORMERS_VERSION.major >= 5


def text_config(config):
    """The decoder config (multimodal wrappers keep it under `text_config`)."""
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get is not None else config


# 5.x models with separate local and global rope settings (Gemma 3) nest the rope dict by
# layer type; the global layers' entry is the one an extension changes (as Gemma 3's own
# long-context configs scale only it). In 4.x the same model keeps the global rope flat
# (`rope_scaling` + `rope_theta`) and the local base apart (`rope_local_base_freq`).
GLOBAL_LAYER_TYPE = "full_attention"


def _nested_key(config, layer_type: str | None = None) -> str | None:
    params = getattr(config, "rope_parameters", None) if IS_V5 else None
    if isinstance(params, dict) and isinstance(params.get(GLOBAL_LAYER_TYPE), dict):
        return layer_type or GLOBAL_LAYER_TYPE
    return None


def get_rope_parameters(config, layer_type: str | None = None) -> dict[str, Any]:
    """A copy of the rope settings as one flat dict with `rope_type` and `rope_theta`;
    empty for a config without RoPE (GPT-2). Per-layer-type configs: the global layers' dict
    (or `layer_type`'s)."""
    if IS_V5:
        params = copy.deepcopy(getattr(config, "rope_parameters", None) or {})
        nested = _nested_key(config, layer_type)
        if nested:
            params = params[nested] or {}
    else:
        params = copy.deepcopy(getattr(config, "rope_scaling", None) or {})
        if getattr(config, "rope_theta", None) is not None:
            params["rope_theta"] = config.rope_theta
    if not params and getattr(config, "rope_theta", None) is None:
        return {}
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    return params


def set_rope_parameters(config, params: dict[str, Any]) -> None:
    """Write a flat rope dict (as returned by `get_rope_parameters`) into the config, in place,
    and run transformers' validation for it (which calls ours for hf_posext's types)."""
    params = copy.deepcopy(params)
    if IS_V5:
        nested = _nested_key(config)
        if nested and params.get("rope_type") == "yarn" and params.get("truncate") is False:
            # modeling_rope_utils `_compute_yarn_parameters` reads `truncate` from the top level
            # of rope_parameters, never from a layer type's entry: it would run truncated
            raise ValueError("truncate=False cannot be written into a per-layer-type rope dict: "
                             "transformers' yarn reads truncate from the top level of "
                             "rope_parameters only, so these layers would run truncate=True.")
        if nested:  # only the global layers' entry changes
            params = {**copy.deepcopy(config.rope_parameters), nested: params}
        config.rope_parameters = params
        config.validate_rope()
    else:
        from transformers.modeling_rope_utils import rope_config_validation

        config.rope_theta = params["rope_theta"]
        config.rope_scaling = v4_scaling(params)
        rope_config_validation(config)
    write_both_layouts(config, params)


def v4_scaling(params: dict[str, Any]) -> dict[str, Any] | None:
    """4.x `rope_scaling`: the flat dict without rope_theta; None for plain RoPE."""
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling.get("rope_type") == "default" and scaling.get("partial_rotary_factor") == 1.0:
        # 1.0 is every 4.x config's default; 4.57's Phi3Config refuses any rope_scaling that is
        # not longrope, so plain RoPE must be written as None there
        del scaling["partial_rotary_factor"]
    return None if scaling.get("rope_type") == "default" and len(scaling) == 1 else scaling


def write_both_layouts(config, params: dict[str, Any]) -> None:
    """Make `save_pretrained` write the rope in both layouts, whichever version runs
    (docs/portability.md, "Both layouts"): 4.x reads only `rope_scaling` + `rope_theta`; 5.x
    reads `rope_scaling` first (`convert_rope_params_to_dict`) and `rope_parameters` otherwise.

    Both versions serialise `config.__dict__`. In 5.x `rope_scaling` is a property over
    `rope_parameters`, so the 4.x copy goes into `__dict__` directly (reading the attribute still
    goes through the property); in 4.x `rope_parameters` is an attribute it does not use."""
    params = copy.deepcopy(params)
    if IS_V5:
        # per-layer-type dicts (Gemma 3): 4.x keeps the global rope flat and the local base apart
        flat = params.get(GLOBAL_LAYER_TYPE, params) if isinstance(params.get(GLOBAL_LAYER_TYPE),
                                                                   dict) else params
        local = params.get("sliding_attention") if flat is not params else None
        config.__dict__["rope_theta"] = flat["rope_theta"]
        config.__dict__["rope_scaling"] = v4_scaling(flat)
        if isinstance(local, dict) and "rope_theta" in local:
            config.__dict__["rope_local_base_freq"] = local["rope_theta"]
    else:
        config.rope_parameters = params


def fill_head_dim(config) -> None:
    """transformers 4.x Mistral configs keep `head_dim=None` when the checkpoint omits it, and
    4.x's own rope functions then fail (`None * partial_rotary_factor`). Write the value it
    stands for (hidden_size // num_attention_heads, per the config's docstring)."""
    if "head_dim" in config.__dict__ and config.head_dim is None:
        config.head_dim = config.hidden_size // config.num_attention_heads


def head_size(head_dim, hidden_size, num_attention_heads) -> int:
    """head_dim, else hidden_size / num_attention_heads (transformers' default); a config whose
    head count cannot split hidden_size (0, negative, not a whole number) is named, not a
    ZeroDivisionError."""
    if head_dim:
        return head_dim
    heads = num_attention_heads
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 \
            or isinstance(hidden_size, bool) or not isinstance(hidden_size, int):
        raise ValueError(f"config num_attention_heads={heads!r} must be a positive integer (head_dim "
                         f"= hidden_size {hidden_size!r} / heads); restore the saved value.")
    return hidden_size // heads


def rotary_dim(config, layer_type: str | None = None) -> int:
    """d in the RoPE formulas: head_dim × partial_rotary_factor, as transformers computes it."""
    head_dim = head_size(getattr(config, "head_dim", None), getattr(config, "hidden_size", None),
                         getattr(config, "num_attention_heads", None))
    factor = get_rope_parameters(config, layer_type).get("partial_rotary_factor",
                                             getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    return int(head_dim * factor)


def checkpointing(model, enable: bool) -> None:
    """Checkpoint (non-reentrant) or stop checkpointing the model's layers: transformers 5.x
    renamed `gradient_checkpointing_*` to `activation_checkpointing_*` (the old names warn and go
    in 6.0); 4.57 has only the old ones."""
    new = hasattr(model, "activation_checkpointing_enable")
    if enable and new:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif enable:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        (model.activation_checkpointing_disable if new else model.gradient_checkpointing_disable)()

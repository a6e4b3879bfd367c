"""The `from_pretrained` hook: load a Llama/Mistral checkpoint extended, or already extended.

Every transformers keyword (dtype, device_map, gguf_file, attn_implementation, revision, ...)
passes through unchanged; only the method's own knobs are taken out, by name.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, AutoModelForCausalLM

from . import attention
from .compat import get_rope_parameters, text_config, write_both_layouts
from .config import PASSTHROUGH_TYPES, RopeExtensionConfig, method_of_rope_type
from .patcher import patch
from .portable import BLOCK
from .registry import SUPPORTED_MODEL_TYPES, check_supported

# Keywords that belong to the method, not to transformers.
METHOD_KNOBS = {"beta_fast", "beta_slow", "mscale_coefficient", "attention_factor",
                "original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                "short_factor", "long_factor", *attention.config.ALL_KNOBS}
_SPEC_KNOBS = {"beta_fast", "beta_slow", "mscale_coefficient", "attention_factor",
               "original_max_position_embeddings"}
# The subset of from_pretrained keywords AutoConfig understands, for the early type check.
_CONFIG_KWARGS = {"revision", "token", "cache_dir", "gguf_file", "local_files_only", "subfolder",
                  "trust_remote_code", "force_download", "proxies"}


def _check_config_early(name_or_path, hf_kwargs: dict[str, Any]):
    """Fail before loading weights when the architecture or its rope type is unsupported."""
    config = text_config(AutoConfig.from_pretrained(
        name_or_path, **{k: v for k, v in hf_kwargs.items() if k in _CONFIG_KWARGS}))
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        what = ("uses RoPE but is not supported yet" if get_rope_parameters(config)
                else "has no rotary position embedding (RoPE) to extend")
        raise ValueError(f"{name_or_path}: model_type {model_type!r} {what}. hf_posext supports "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}.")
    rope_type = get_rope_parameters(config).get("rope_type", "default")
    if rope_type not in ("default", *PASSTHROUGH_TYPES) and method_of_rope_type(rope_type) is None:
        raise ValueError(f"{name_or_path}: unknown rope_type {rope_type!r} in its config.")
    return config


def from_pretrained(name_or_path, method: str | RopeExtensionConfig | None = None,
                    factor: float | None = None, **kwargs: Any):
    """Load an `AutoModelForCausalLM`, extended with `method` when given.

    With no method, a checkpoint saved extended (by hf_posext or with transformers' own rope
    types) loads as saved. With a method, the model is loaded, then `patch`ed:
    `max_position_embeddings=` is then the target length (instead of `factor`) and the method's
    knobs (beta_fast, beta_slow, mscale_coefficient, attention_factor,
    original_max_position_embeddings) are taken by name. Everything else goes to
    `AutoModelForCausalLM.from_pretrained` unchanged.
    """
    knobs = {k: kwargs.pop(k) for k in list(kwargs) if k in METHOD_KNOBS}
    if method is None:
        if knobs or factor is not None:
            given = sorted(knobs) + (["factor"] if factor is not None else [])
            raise ValueError(f"{given} need a method: pass method='yarn' (or another of "
                             "hf_posext.METHODS), or drop them to load the checkpoint as saved.")
    else:
        if attention.is_attention_method(method):
            pass  # checked against the checkpoint's trained length below, still before loading
        elif isinstance(method, str) and method.lower() not in PASSTHROUGH_TYPES:
            # unknown names, bad factors and knobs the method does not use fail before loading
            RopeExtensionConfig(method, 1.0 if factor is None else factor,
                                **{k: v for k, v in knobs.items() if k in _SPEC_KNOBS})
        knobs["max_position_embeddings"] = kwargs.pop("max_position_embeddings", None)
    config = _check_config_early(name_or_path, kwargs)
    if method is not None and (attention.is_attention_method(method) or "logn" in knobs):
        trained = attention.saved_trained_length(config.__dict__) or config.max_position_embeddings
        attention.split(method, {k: v for k, v in knobs.items() if k != "max_position_embeddings"},
                        trained)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    attention.after_load(model, explicit="attn_implementation" in kwargs)
    check_supported(model)
    if kwargs.get("gguf_file"):
        _drop_spent_gguf_quantizer(model)
    if method is not None:
        patch(model, method, factor, **knobs)
    elif getattr(text_config(model.config), BLOCK, None) is not None:
        # transformers 5.x keeps only rope_parameters after loading: restore the 4.x pair so
        # that re-saving writes both layouts again (docs/portability.md, "Both layouts")
        config = text_config(model.config)
        write_both_layouts(config, get_rope_parameters(config))
    return model


def _drop_spent_gguf_quantizer(model) -> None:
    """A GGUF checkpoint dequantized to float on load (as on CPU without GGUF kernels) still
    carries its quantizer, and transformers then refuses `save_pretrained`. When no weight was
    kept packed, the model is an ordinary float model: detach the quantizer so an extended
    model can be saved as safetensors."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or getattr(quantizer, "packed_modules", None):
        return
    if any("Gguf" in type(m).__name__ for m in model.modules()):
        return
    quantizer.remove_quantization_config(model)

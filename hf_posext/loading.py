"""The `from_pretrained` hook: load a supported RoPE checkpoint extended, or already extended.

Every transformers keyword (dtype, device_map, gguf_file, attn_implementation, revision, ...)
passes through unchanged; only the method's own knobs are taken out, by name.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoModelForCausalLM

from . import attention
from .rope import dynamic
from .rope.compat import get_rope_parameters, rotary_dim, text_config, write_both_layouts
from .catalog import KNOB_HELP
from .rope.config import PASSTHROUGH_TYPES, RopeExtensionConfig, method_of_rope_type
from .rope.knobs import NATIVE_TRAINED_KEY, RENAMED, TARGET_LENGTH, TRAINED_LENGTH
from .errors import ConfigError, refuse_renamed
from .patcher import apply_to_config, patch, plan_for_config
from .portability.portable import ENTRY, logical_rope
from .rope.registry import (SUPPORTED_MODEL_TYPES, UNSUPPORTED_MODEL_TYPES, WHERE_LISTED,
                            check_supported, rotary_modules)

# Keywords that belong to the method, not to transformers.
METHOD_KNOBS = {*KNOB_HELP, *(k for keys in PASSTHROUGH_TYPES.values() for k in keys if k != "factor")}
# The subset of from_pretrained keywords AutoConfig understands, for the early type check.
_CONFIG_KWARGS = {"revision", "token", "cache_dir", "gguf_file", "local_files_only", "subfolder",
                  "trust_remote_code", "force_download", "proxies"}


def check_config_early(name_or_path, hf_kwargs: dict[str, Any]):
    """Fail before loading weights when the architecture or its rope type is unsupported.
    Returns the (text) config."""
    # spelled as a local path (a Hub id is `org/name`, never starting with these)
    if isinstance(name_or_path, (str, os.PathLike)) \
            and str(name_or_path).startswith((".", "/", "~", os.sep)) \
            and not Path(name_or_path).expanduser().exists():
        raise ConfigError(f"{name_or_path}: no such folder; pass a saved model folder or a Hub id.")
    try:
        full = AutoConfig.from_pretrained(
            name_or_path, **{k: v for k, v in hf_kwargs.items() if k in _CONFIG_KWARGS})
    except (OSError, ValueError) as err:   # transformers' message spans lines: keep the first
        first = next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
        raise ConfigError(f"{name_or_path}: cannot read its config ({first.strip()}); pass a folder "
                          "with a valid config.json or a Hub id.") from None
    except ArithmeticError as err:   # e.g. num_attention_heads 0: the config class divides by it
        raise ConfigError(f"{name_or_path}: its config.json cannot be read ({err}: a size or count "
                          "such as num_attention_heads is 0); restore the saved values.") from None
    config = text_config(full)
    model_type = getattr(full, "model_type", None)  # what the loaded model will report
    if model_type not in SUPPORTED_MODEL_TYPES or model_type in UNSUPPORTED_MODEL_TYPES:
        what = (f"cannot be extended: {UNSUPPORTED_MODEL_TYPES[model_type]}"
                if model_type in UNSUPPORTED_MODEL_TYPES else
                "uses RoPE but is not supported" if get_rope_parameters(config)
                else "has no rotary position embedding (RoPE) to extend")
        raise ValueError(f"{name_or_path}: model_type {model_type!r} {what}. {WHERE_LISTED}.")
    rope_type = get_rope_parameters(config).get("rope_type", "default")
    if rope_type not in ("default", *PASSTHROUGH_TYPES) and method_of_rope_type(rope_type) is None:
        raise ValueError(f"{name_or_path}: unknown rope_type {rope_type!r} in its config.")
    _check_saved_rope(name_or_path, config)
    if "attn_implementation" not in hf_kwargs:
        attention.check_entry(name_or_path, config)
    return config


def _check_saved_rope(name_or_path, config) -> None:
    """A hand-edited config fails here, naming the key, instead of loading and giving non-finite
    logits later: a non-finite rope number, the two layouts of a local config.json disagreeing
    (transformers reads one, other engines the other), or a rope edited against the hf_posext
    entry (portable.logical_rope raises)."""
    rope = get_rope_parameters(config)
    for key, value in rope.items():
        numbers = value if isinstance(value, list) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            raise ConfigError(f"{name_or_path}: config.json rope {key}={value!r} is not finite; "
                              "restore the saved value (or re-save the model with hf_posext).")
    omp = rope.get(NATIVE_TRAINED_KEY)
    if omp is not None:
        try:
            TRAINED_LENGTH.check(omp, None)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{name_or_path}: config.json rope {NATIVE_TRAINED_KEY}="
                              f"{omp!r}: {err}; restore the saved value.") from None
    raw_path = Path(str(name_or_path)) / "config.json"
    if raw_path.is_file():
        try:
            raw = json.loads(raw_path.read_text())
        except ValueError as err:
            raise ConfigError(f"{raw_path} is not valid JSON ({err}); restore the file.") from None
        raw = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
        a, b = raw.get("rope_scaling"), raw.get("rope_parameters")
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) & set(b) - {"rope_theta", "type"}):
                if a[key] != b[key] and not (isinstance(a[key], (int, float)) and isinstance(b[key], (int, float))
                                             and math.isclose(a[key], b[key], rel_tol=1e-12)):
                    raise ConfigError(f"{raw_path}: rope_scaling[{key!r}]={a[key]!r} disagrees with "
                                      f"rope_parameters[{key!r}]={b[key]!r}; make both the same "
                                      "(transformers 5 reads rope_parameters, 4.x rope_scaling).")
    decoder = text_config(config)
    if getattr(decoder, ENTRY, None) is not None:
        try:  # an entry edited against the rope config (or the reverse)
            logical_rope(decoder, get_rope_parameters(decoder), rotary_dim(decoder))
        except ValueError as err:   # name the file the entry came from, as the checks above do
            raise ConfigError(f"{raw_path if raw_path.is_file() else name_or_path}: {err}") from None


def _refuse_misspelt_knobs(kwargs: dict[str, Any]) -> None:
    """transformers turns unknown from_pretrained keywords into config attributes without a
    word, so a misspelt knob (`beta_fst=64`) would be dropped silently: refuse near misses."""
    names = METHOD_KNOBS | {TARGET_LENGTH.name, "factor", "method"}
    for key in kwargs:
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.85)
        if close and key not in names:
            raise TypeError(f"Unknown keyword {key!r}; did you mean {close[0]!r}?")


def from_pretrained(name_or_path, method: str | RopeExtensionConfig | None = None,
                    factor: float | None = None, **kwargs: Any):
    """Load an `AutoModelForCausalLM`, extended with `method` when given.

    With no method, a checkpoint saved extended (by hf_posext or with transformers' own rope
    types) loads as saved. With a method, the model is loaded, then `patch`ed:
    `target_length=` is then the target length T (instead of `factor`) and the method's
    knobs (beta_fast, beta_slow, truncate, mscale_coefficient, attention_factor, mscale,
    mscale_all_dim, finetuned, trained_length; llama3/longrope's own) are taken by name. Everything else
    goes to `AutoModelForCausalLM.from_pretrained` unchanged. Every argument error is raised
    before any weight loads (the patch is planned and validated on the config first).
    """
    if method is not None:   # without one, transformers' keys are its config overrides
        refuse_renamed("from_pretrained", kwargs, RENAMED)
    knobs = {k: kwargs.pop(k) for k in list(kwargs) if k in METHOD_KNOBS}
    target = kwargs.pop(TARGET_LENGTH.name, None)
    if method is None and (knobs or factor is not None or target is not None):
        given = sorted(knobs) + (["factor"] if factor is not None else []) + \
            ([TARGET_LENGTH.name] if target is not None else [])
        raise ValueError(f"{given} need a method: pass method='yarn' (or another of "
                         "hf_posext.METHODS), or drop them to load the checkpoint as saved.")
    _refuse_misspelt_knobs(kwargs)
    config = check_config_early(name_or_path, kwargs)
    if method is not None:
        # Every argument error before any weight loads: plan the patch on the config and let
        # transformers validate the result on a copy (what `patch` will do to the model).
        probe = copy.deepcopy(config)
        apply_to_config(probe, plan_for_config(config, method, factor, target, knobs),
                        dict(config.__dict__))
    model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    attention.after_load(model, explicit="attn_implementation" in kwargs)
    check_supported(model)
    if kwargs.get("gguf_file"):
        _drop_spent_gguf_quantizer(model)
    if method is not None:
        patch(model, method, factor, target_length=target, **knobs)
    else:  # loaded as saved
        config = text_config(model.config)
        if getattr(config, ENTRY, None) is not None:
            # transformers 5.x keeps only rope_parameters after loading: restore the 4.x pair so
            # that re-saving writes both layouts again (docs/portability.md, "Both layouts")
            write_both_layouts(config, get_rope_parameters(config))
        # a dynamic rope (transformers' `dynamic` too) becomes history-free (hf_posext.rope.dynamic)
        for _, _, module in rotary_modules(model):
            dynamic.make_history_free(module)
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

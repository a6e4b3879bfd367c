"""The one registry: methods -> RoPE math, hf_posext's rope types -> transformers, and the
model types the patcher supports (keyed by `config.model_type`, as Liger-Kernel keys its own).

`register()` runs on `import hf_posext`. It only *adds* entries (`ntk`, `ntk_by_parts`,
`dynamic_yarn`) to transformers' `ROPE_INIT_FUNCTIONS` and their validators; transformers' own
types are never replaced, so models that do not use ours are untouched.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import modeling_rope_utils

from . import dynamic, methods
from .compat import IS_V5, get_rope_parameters, rotary_dim
from .config import RopeExtensionConfig, method_of_rope_type
from .units import REGISTERED_ROPE_TYPES, STATIC_METHODS, UNITS

# model_type -> name of its rotary embedding class in transformers. Every one builds its rotary
# module from ROPE_INIT_FUNCTIONS and config's rope dict (4.57 and 5.23), and each is tested
# with a tiny random config (tests/test_families.py).
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "LlamaRotaryEmbedding",
    "mistral": "MistralRotaryEmbedding",
    "qwen2": "Qwen2RotaryEmbedding",
    "qwen3": "Qwen3RotaryEmbedding",
    "gemma2": "Gemma2RotaryEmbedding",
    "gemma3_text": "Gemma3RotaryEmbedding",
    "olmo2": "Olmo2RotaryEmbedding",
    "granite": "GraniteRotaryEmbedding",
    "gpt_neox": "GPTNeoXRotaryEmbedding",  # partial rotary: d = head_dim · rotary_pct
    "stablelm": "StableLmRotaryEmbedding",  # partial rotary, one rotary module per layer too
    "phi3": "Phi3RotaryEmbedding",  # static methods saved in their longrope form (LONGROPE_ONLY)
}
# Model types whose config accepts no rope type but plain RoPE and `longrope`: static methods
# are saved there in their exact longrope form (hf_posext/rope/longrope.py; static NTK stays a plain
# theta change), dynamic ones are refused with this reason.
LONGROPE_ONLY: dict[str, str] = {
    "phi3": ("transformers' Phi3Config accepts only rope_type 'longrope' (5.x refuses any other "
             "type; 4.57 and 5.x rewrite a saved 'yarn' to 'longrope' on load), and a dynamic "
             "method has no longrope form: its frequencies follow the current length. Use a "
             f"static method ({', '.join(STATIC_METHODS)}) or an attention-level one"),
}
# On 4.x, where even the longrope form cannot be saved (reason); NTK's plain theta change can.
LONGROPE_REFUSED_V4: dict[str, str] = {} if IS_V5 else {
    "phi3": ("transformers 4.57's Phi3Config reloads a longrope config only as exactly {type, "
             "short_factor, long_factor} and derives the attention factor from "
             "max_position_embeddings, so the explicit attention_factor that makes the longrope "
             "form exact cannot be saved. Use transformers 5.x, or 'ntk' (a plain theta change)"),
}
# Rotary modules that keep their own rope: Gemma 3's sliding-window layers use a local base
# (rope_local_base_freq) that its long-context configs never scale. In 4.57 that is a second
# module built from a private config copy (`rotary_emb_local`); in 5.x it is the
# "sliding_attention" entry of the per-layer-type rope dict, which `compat` leaves alone.
LOCAL_ROTARY: dict[str, tuple[str, ...]] = {"gemma3_text": ("rotary_emb_local",)}
# RoPE families that use the shared machinery but cannot be extended, and why.
UNSUPPORTED_MODEL_TYPES: dict[str, str] = {}
if not IS_V5:
    UNSUPPORTED_MODEL_TYPES["olmo2"] = (
        "transformers 4.57's Olmo2Config accepts only rope_scaling {'type': 'linear' or "
        "'dynamic', 'factor'} and refuses any other rope config on load, so an extended OLMo 2 "
        "checkpoint could not be reloaded. Use transformers 5.x, where OLMo 2 is supported")

def compute(spec: RopeExtensionConfig, dim: int, base: float, seq_len: int | torch.Tensor | None = None,
            device=None) -> methods.Freqs:
    """inv_freq [dim/2] (float32) and the cos/sin scale of `spec` for a rotary dim and base."""
    if isinstance(seq_len, torch.Tensor):
        seq_len = int(seq_len.max().item())
    return UNITS[spec.method].compute(spec, dim, base, seq_len, device)


def _rope_init_fn(config, device=None, seq_len=None, layer_type=None, **_: Any):
    """transformers' ROPE_INIT_FUNCTIONS contract: (config, device, seq_len) -> (inv_freq, scale).
    5.x per-layer-type modules (Gemma 3) pass the layer type whose rope dict to read."""
    rope = get_rope_parameters(config, layer_type)
    spec = RopeExtensionConfig.from_rope_dict(rope, config.max_position_embeddings)
    if seq_len is None and spec.is_dynamic:
        dynamic.hook_module_under_construction(config)
    return compute(spec, rotary_dim(config, layer_type), float(rope["rope_theta"]), seq_len, device)


def _validate_v5(self, rope_parameters: dict, ignore_keys=None) -> None:
    """5.x config validator (`_validate_<type>_rope_parameters`): strict, raises on bad values."""
    RopeExtensionConfig.from_rope_dict(rope_parameters, getattr(self, "max_position_embeddings", None))


def _validate_v4(config, ignore_keys=None) -> None:
    """4.x validator (`ROPE_VALIDATION_FUNCTIONS`)."""
    RopeExtensionConfig.from_rope_dict(get_rope_parameters(config), config.max_position_embeddings)


def register() -> None:
    """Add hf_posext's rope types to transformers (idempotent; never overrides a foreign entry)."""
    table = modeling_rope_utils.ROPE_INIT_FUNCTIONS
    for rope_type in REGISTERED_ROPE_TYPES:
        assert method_of_rope_type(rope_type) is not None
        current = table.get(rope_type)
        if current is not None and current is not _rope_init_fn:
            raise RuntimeError(f"transformers already defines rope_type {rope_type!r}; hf_posext "
                               "will not replace it. Please report this with your versions.")
        table[rope_type] = _rope_init_fn
        if IS_V5:
            from transformers.configuration_utils import PreTrainedConfig

            setattr(PreTrainedConfig, f"_validate_{rope_type}_rope_parameters", _validate_v5)
        else:
            modeling_rope_utils.ROPE_VALIDATION_FUNCTIONS[rope_type] = _validate_v4  # type: ignore[attr-defined]  # 4.x only; checked against 5.x


def rotary_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """Every (parent, attribute name, rotary embedding module) inside `model` that an extension
    applies to (for a supported type: its rotary class, without the local ones)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    wanted = SUPPORTED_MODEL_TYPES.get(model_type)
    local = LOCAL_ROTARY.get(model_type, ())
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            kind = type(child).__name__
            if (kind == wanted if wanted else kind.endswith("RotaryEmbedding")) and name not in local:
                found.append((parent, name, child))
    return found


def _unsupported_reason(model: torch.nn.Module, rope: dict) -> str | None:
    """Why a RoPE model cannot be extended by hf_posext, when that can be told from the model."""
    if "mrope_section" in rope or "mrope_section" in (rope.get("rope_scaling") or {}):
        return ("it uses multimodal RoPE (mrope_section): frequencies are split across temporal, "
                "height and width position axes, and the scaling rules here are defined for one "
                "text position axis")
    for _, _, module in rotary_modules(model):
        if not dynamic.slots(module) or not hasattr(module, "config"):
            return (f"its rotary module {type(module).__name__} does not build its frequencies "
                    "from transformers' shared rope functions (ROPE_INIT_FUNCTIONS and the "
                    "config's rope dict), which is how hf_posext extends a model")
    return None


def check_supported(model: torch.nn.Module) -> None:
    """Raise a clear error unless `model` is a RoPE model of a supported architecture."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if config is None:
        raise TypeError(f"hf_posext.patch expects a transformers model with a .config, got "
                        f"{type(model).__name__}")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type in SUPPORTED_MODEL_TYPES and model_type not in UNSUPPORTED_MODEL_TYPES:
        if not rotary_modules(model):
            raise ValueError(f"{type(model).__name__} ({model_type}) has no rotary embedding "
                             "module; was it built by a transformers version hf_posext supports?")
        return
    if not rotary_modules(model):
        raise ValueError(f"model_type {model_type!r} ({type(model).__name__}) has no rotary position "
                         "embedding (RoPE) to extend: it uses another kind of position encoding. "
                         f"hf_posext extends RoPE models of these types: {supported}.")
    reason = UNSUPPORTED_MODEL_TYPES.get(model_type) or _unsupported_reason(model, get_rope_parameters(config))
    if reason:
        raise ValueError(f"model_type {model_type!r} uses RoPE but hf_posext cannot extend it: "
                         f"{reason}. Supported: {supported}.")
    raise ValueError(f"model_type {model_type!r} uses RoPE but is not supported by hf_posext yet "
                     f"(supported: {supported}). Add it to "
                     "hf_posext.rope.registry.SUPPORTED_MODEL_TYPES once its rotary module is tested.")

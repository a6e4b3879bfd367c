"""Tiny random models of any found family (hf_posext/rope/families.py), and the same model built
by transformers alone with a native rope dict: the two sides of tests/test_families_found.py and
tests/test_families_new.py. Hidden 64, vocab 128, 4 layers (hybrid families: one of them a
rope attention layer), a few tiny experts for MoE families, trained length L = 64."""

import copy
import dataclasses
import inspect

import torch
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from hf_posext.rope.compat import GLOBAL_LAYER_TYPE

L, BASE = 64, 10_000.0
SMALL = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, intermediate_size_mlp=128,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=128, max_position_embeddings=L, n_routed_experts=4, num_experts=4,
             num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=16,
             q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1,
             topk_group=1, first_k_dense_replace=1, sliding_window=16, attention_chunk_size=16,
             shared_expert_intermediate_size=32, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# what one family needs beyond SMALL to build small and run (read from its config class)
OVERRIDES = {
    "bamba": {"attn_layer_indices": [1]},
    "bailing_hybrid": {"layer_group_size": 2},
    "gemma3_text": {"layer_types": ["sliding_attention", "full_attention"] * 2},
    "gemma3n_text": {"num_kv_shared_layers": 0, "vocab_size_per_layer_input": 128, "layer_types": ["sliding_attention", "full_attention"] * 2},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"] * 2,
                         "position_embedding_type": "rope"},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"] * 2},
    "mimo_v2_flash": {"head_dim": 48},   # partial 0.334: an even rotary dim (16)
    "zamba2": {"layers_block_type": ["mamba", "hybrid"] * 2, "use_mem_rope": True},
    "zaya": {"num_experts_per_tok": 1},
}


def _fields(config_class) -> set[str]:
    if dataclasses.is_dataclass(config_class):
        return {f.name for f in dataclasses.fields(config_class)}
    return set(inspect.signature(config_class.__init__).parameters)


def tiny_config(model_type: str, rope: dict | None = None, **extra):
    config_class = CONFIG_MAPPING[model_type]
    names = _fields(config_class)
    kwargs = {k: v for k, v in SMALL.items() if k in names}
    if "qk_rope_head_dim" in names:   # MLA: one key per head, head_dim is the rope part
        kwargs.pop("head_dim", None)
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    kwargs.update(OVERRIDES.get(model_type, {}))
    kwargs.update(extra)
    if rope is not None:
        kwargs["rope_parameters"] = rope
    return config_class(attn_implementation="eager", **kwargs)


def build(model_type: str, rope: dict | None = None, seed: int = 0, **extra):
    config = tiny_config(model_type, rope, **extra)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def plain_rope(model_type: str, **extra) -> dict:
    """The family's default rope dict made plain RoPE at BASE (a long-context default such as
    gpt-oss's yarn is dropped); a per-layer-type dict keeps its bases, with plain RoPE in its
    full-attention entry."""
    rope = copy.deepcopy(tiny_config(model_type, **extra).rope_parameters)
    if isinstance(rope.get(GLOBAL_LAYER_TYPE), dict):
        full = rope[GLOBAL_LAYER_TYPE]
        rope[GLOBAL_LAYER_TYPE] = {"rope_type": "default", "rope_theta": full.get("rope_theta", BASE),
                                   **{k: v for k, v in full.items() if k == "partial_rotary_factor"}}
        return rope
    return {"rope_type": "default", "rope_theta": BASE,
            **{k: v for k, v in rope.items() if k == "partial_rotary_factor"}}


def native(plain: dict, **entry) -> dict:
    """`plain` with transformers' own rope type in it: the full-attention entry of a
    per-layer-type dict (the layers long-context configs scale), else the dict itself."""
    rope = copy.deepcopy(plain)
    if isinstance(rope.get(GLOBAL_LAYER_TYPE), dict):
        rope[GLOBAL_LAYER_TYPE] = {**rope[GLOBAL_LAYER_TYPE], **entry}
        return rope
    return {**rope, **entry}


def tokens(n: int = 3 * L) -> torch.Tensor:
    return ((torch.arange(n)[None] * 5) % 128)


def logits(model, n: int = 3 * L) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens(n)).logits.float()


def theta(plain: dict) -> float:
    """The base of the rope an extension changes (the full-attention entry's, if nested)."""
    return plain.get(GLOBAL_LAYER_TYPE, plain)["rope_theta"]

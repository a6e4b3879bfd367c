"""SGLang's DualChunkAttention against hf_posext's `dual_chunk` (docs/portability.md, "Dual Chunk
Attention in SGLang").

One engine runs DCA: SGLang, from a `dual_chunk_attention_config` entry in config.json (read from
SGLang's source, main as stored in the public source index, late 2026; no CPU build, so this is
re-derived, never run here):

- `python/sglang/srt/layers/rotary_embedding/factory.py` `get_rope`: with the entry, the rotary
  embedding is `DualChunkRotaryEmbedding(head_size, rotary_dim, max_position, base, ...,
  chunk_size, local_size)`: `rope_scaling` is not read at all (plain RoPE on `rope_theta`).
- `python/sglang/srt/layers/rotary_embedding/rope_variant.py` `DualChunkRotaryEmbedding`: with
  c = chunk_size − local_size, keys at `j mod c` (a table of `max_position_embeddings` rows),
  queries at `i mod c` (intra), `min(i mod c + c, chunk_size)` (successive), and the successive
  position of c − 1, `min(2c − 1, chunk_size)` (inter) — ChunkLlama's (An et al. 2024,
  HKUNLP/ChunkLlama) and hf_posext's maps (attention/positions.py `dual_chunk_*`), same c.
- `python/sglang/srt/layers/attention/dual_chunk_flashattention_backend.py`: reads `chunk_size`
  (default 8192), `local_size` (1024), `original_max_position_embeddings` (0) and the sparse
  keys; intra-chunk keys causal, the previous chunk and all earlier chunks unmasked, the three
  parts merged by their log-sum-exp (hf_posext's plan, attention/plans.py). With
  `original_max_position_embeddings` > 0 it scales keys and the softmax by
  max(1, 0.1·ln(n / original_max_position_embeddings) + 1) (Qwen2.5-1M's length scaling, not in
  ChunkLlama); with 0 its prefill indexes a scaling factor it never set (`scaling_factor[i]` on
  None: TypeError). So hf_posext writes `original_max_position_embeddings` = the served length:
  the factor is 1 for every sequence the server accepts.
- The backend is chosen automatically when the entry is present (server_args post-process
  `_attention_backend_dual_chunk`; another `--attention-backend` is refused); CUDA only
  (`attn_backend_support`: hardware ["cuda"]).
- Model files that pass the entry to `get_rope`: read `qwen2_moe.py` (Qwen2MoeDecoderLayer) and
  `jet_nemotron.py` (on Qwen2Model); the Qwen3 attention of a later model file raises
  NotImplementedError for it; Qwen2 / Qwen3 / Qwen3-MoE per SGLang PR 5358 (Qwen2.5-1M). Llama's
  model file was not seen reading it: without the entry in `get_rope` the backend's five-way
  query split (`torch.split(q, q.shape[-1] // 5)`) does not hold, so other model types are
  refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..attention.config import AttentionExtensionConfig

CONFIG_KEY = "dual_chunk_attention_config"
SGLANG_MODEL_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


def _spec(attention: dict[str, Any]) -> AttentionExtensionConfig:
    # the saved entry's fields the config class declares (its knobs come from the units)
    names = {f.name for f in dataclasses.fields(AttentionExtensionConfig)}
    return AttentionExtensionConfig(**{k: v for k, v in attention.items() if k in names})


def why_not(cfg: dict[str, Any], target) -> str | None:
    """Why SGLang cannot run `target` (verdicts.Meaning) by DCA for this config, else None."""
    attention = target.attention or {}
    if attention.get("method") != "dual_chunk":
        return f"SGLang runs only Dual Chunk Attention, not {attention.get('method')!r}"
    if target.spec is not None:
        return (f"SGLang's DualChunkRotaryEmbedding reads no rope_scaling (factory.py get_rope): "
                f"the rope method {target.spec.method!r} under dual_chunk would be lost")
    if _spec(attention).logn:
        return "SGLang's DCA has no log-n query scaling (logn=True)"
    if cfg.get("model_type") not in SGLANG_MODEL_TYPES:
        return (f"SGLang's {cfg.get('model_type')!r} model file passes no {CONFIG_KEY} to get_rope "
                f"(DCA model types: {', '.join(SGLANG_MODEL_TYPES)})")
    return None


def dca_entry(cfg: dict[str, Any], target) -> dict[str, Any]:
    """The `dual_chunk_attention_config` SGLang runs as hf_posext's dual_chunk (ValueError: why
    not): chunk_size = ours, local_size = our local_window, original_max_position_embeddings =
    the served length (max_position_embeddings), so the backend's length scaling stays 1."""
    reason = why_not(cfg, target)
    if reason:
        raise ValueError(f"export refused: the attention-level method 'dual_chunk' runs only in "
                         f"SGLang's Dual Chunk Attention, and there {reason}.")
    spec = _spec(target.attention)
    return {"chunk_size": spec.chunk_size, "local_size": spec.local_window,
            "original_max_position_embeddings": int(cfg["max_position_embeddings"])}


def sglang_config(cfg: dict[str, Any], target) -> dict[str, Any]:
    """`cfg` with the entry SGLang reads (export --target sglang)."""
    return {**cfg, CONFIG_KEY: dca_entry(cfg, target)}


def sglang_reading(cfg: dict[str, Any], target) -> tuple[str, str]:
    """(status, detail) of SGLang on a dual_chunk checkpoint: exact when config.json's entry
    makes SGLang run the same DCA, lost without an entry, different otherwise."""
    given = cfg.get(CONFIG_KEY)
    if not isinstance(given, dict):
        return "lost", (f"no {CONFIG_KEY} entry: runs plain attention, 'dual_chunk' is lost "
                        "(hf-posext export PATH OUT --target sglang writes it)")
    reason = why_not(cfg, target)
    if reason:
        return "different", reason
    want = dca_entry(cfg, target)
    L_served = int(cfg["max_position_embeddings"])
    chunk, local = given.get("chunk_size", 8192), given.get("local_size", 1024)
    orig = given.get("original_max_position_embeddings", 0)
    if (chunk, local) != (want["chunk_size"], want["local_size"]):
        return "different", (f"{CONFIG_KEY} chunk_size {chunk}, local_size {local}; the checkpoint "
                             f"means chunk_size {want['chunk_size']}, local_window {want['local_size']}")
    if not orig or orig <= 0:
        return "broken", (f"{CONFIG_KEY} has no original_max_position_embeddings: SGLang's prefill "
                          "indexes a scaling factor it did not set (TypeError)")
    if orig < L_served:
        return "different", (f"past original_max_position_embeddings {orig} SGLang scales attention "
                             f"by 0.1·ln(n/{orig}) + 1 (Qwen2.5-1M), which hf_posext's dual_chunk "
                             "does not")
    return "exact", (f"SGLang's dual_chunk_flash_attn backend (CUDA only), chunk {chunk}, local "
                     f"{local}")

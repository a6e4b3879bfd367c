"""Stage 1b of the recipe: the extended model, LoRA, and the PoSE/plain collator (the tokenizer
comes from data/embedded.load_tokenizer, the loader every command shares)."""

from __future__ import annotations

import torch

from ..data import embedded
from ..errors import ConfigError
from ..portability.portable import method_spec
from ..rope.compat import checkpointing, text_config
from .pose import PoseCollator


def load_recipe_model(mc, extend: bool = True):
    """The model of a ModelConfig `mc`, extended with its method and factor (or not, for the
    unpatched baseline)."""
    kwargs = {"dtype": getattr(torch, mc.dtype)}
    if mc.attn_implementation:
        kwargs["attn_implementation"] = mc.attn_implementation
    method, factor, knobs = (mc.method, mc.factor, dict(mc.knobs)) if extend else (None, None, {})
    return embedded.load_model(method, factor, name=mc.name, **knobs, **kwargs)


def special_id(tokenizer, setting: str | None, which: str) -> int | None:
    """data.bos_token / eos_token: None = no token, "auto" = the tokenizer's, else a token string."""
    if setting is None:
        return None
    if setting == "auto":
        return getattr(tokenizer, f"{which}_token_id")
    ids = tokenizer.convert_tokens_to_ids(setting)
    if ids is None or tokenizer.convert_ids_to_tokens(ids) != setting:
        raise ValueError(f"data.{which}_token {setting!r} is not a token of this tokenizer.")
    return ids


def extended_length(model) -> int:
    """factor x trained length, read back from the model's rope config (through its portable
    form: `ntk` is saved as plain RoPE with a raised theta and the `hf_posext` entry). Without a
    rope method (plain RoPE, an attention-level method) it is max_position_embeddings."""
    mconf = text_config(model.config)
    spec = method_spec(mconf)
    if spec is None:
        return int(mconf.max_position_embeddings)
    return int(round(spec.factor * spec.trained_length))


def check_window_fits_target(cfg) -> int:
    """The PoSE target (pose.target, or factor x the trained length read from the checkpoint's
    config alone: the embedded model's is known), checked against the window before any weight
    loads; `build_collator` reads the loaded model's own figure later."""
    mc, window = cfg.model, cfg.training.seq_len
    target = cfg.pose.target
    if target is None:
        if mc.name.startswith("embedded:"):
            trained = embedded.TRAINED_CONTEXT
        else:
            from transformers import AutoConfig
            conf = text_config(AutoConfig.from_pretrained(mc.name))
            spec = method_spec(conf)
            trained = spec.trained_length if spec else conf.max_position_embeddings
        target = int(round(mc.factor * trained))
    if window > target:
        raise ConfigError(f"training.seq_len ({window}) is longer than the PoSE target ({target} = "
                          "pose.target, or model.factor x the trained length); lower training.seq_len "
                          "or raise model.factor / pose.target.")
    return target


def build_collator(cfg, model, log=print) -> PoseCollator:
    """PoSE windows spanning the extended length (pose.enabled), else plain positions 0..seq_len-1."""
    t, sc = cfg.training, cfg.data.synthetic
    target = extended_length(model)
    synthetic = dict(min_span=sc.min_span, answer_only=sc.loss == "answer")
    if cfg.pose.enabled:
        pose_target = cfg.pose.target or target
        log(f"PoSE: windows of {t.seq_len} tokens, position ids spanning {pose_target}")
        return PoseCollator(t.seq_len, pose_target, cfg.pose.num_chunks, t.seed, **synthetic)
    if t.seq_len < target:
        log(f"note: training at {t.seq_len} tokens, below the extended length {target} "
            "(pose.enabled would spread positions over it)")
    return PoseCollator(t.seq_len, None, 1, t.seed, **synthetic)


def apply_lora(model, lc):
    """Wrap in a peft LoRA adapter; embeddings and norms trained in full (LongLoRA §3.3)."""
    from peft import LoraConfig as PeftLoraConfig, get_peft_model
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in lc.target_modules if t not in names]
    if missing:
        raise ValueError(f"lora.target_modules {missing} are not module names of this model.")
    model = get_peft_model(model, PeftLoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                                                 target_modules=list(lc.target_modules),
                                                 task_type="CAUSAL_LM"))
    for name, param in model.named_parameters():
        if any(key in name for key in lc.trainable):
            param.requires_grad_(True)
    return model


def prepare_for_training(model, cfg):
    """Gradient checkpointing (non-reentrant), LoRA, train mode."""
    if cfg.training.gradient_checkpointing:
        checkpointing(model, True)
        model.config.use_cache = False
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
    return model.train()

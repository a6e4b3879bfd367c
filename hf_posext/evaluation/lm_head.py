"""A causal LM's logits from its decoder's hidden states, a chunk of positions at a time, exactly
as the family's own transformers forward computes them.

Long-context scoring never builds the `[T × V]` logits (32k tokens × 49,152 vocab in float32 is
6.4 GB): it runs the decoder once and applies the head to chunks (perplexity/loss.py, the
searches, the fine-tuning loss). Most families' head is one linear layer, but some post-process
its output, and a plain `lm_head(h)` would then score other logits than the model's: Granite
divides by `logits_scaling` 16, Cohere multiplies by `logit_scale` 0.0625, Gemma 2 soft-caps at
30. `LOGIT_TAILS` lists what each such family's `*ForCausalLM.forward` does after its decoder,
read from transformers' modeling files (named per entry); `LMHead(model)` applies it, and
`check_lm_head` compares the result with the model's own logits on a short probe before any
long run, so a family whose forward does something this table does not know is refused, not
scored wrong.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100  # the label value transformers (and F.cross_entropy) skip


def _base(model: Any) -> Any:
    """The transformers model a PEFT wrapper holds (its adapters in place), else the model."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


# Any, not torch.nn.Module: torch types every submodule attribute as `Tensor | Module`.
def decoder_and_head(model: Any) -> tuple[Any, Any]:
    """(decoder stack returning hidden states, output linear layer) of a transformers causal LM
    (of the model a PEFT wrapper holds, its adapters in place)."""
    model = _base(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    # the decoder under the base-model prefix (`gpt_neox`), else `.model` (Llama 4's text model
    # keeps `model` although its prefix names `language_model`)
    decoder = getattr(model, getattr(model, "base_model_prefix", "model"), None) or getattr(model, "model", None)
    if head is None or decoder is None or decoder is model:
        raise TypeError(f"{type(model).__name__} is not a causal LM with a decoder and an LM head "
                        "(expected e.g. LlamaForCausalLM: .model and .lm_head).")
    return decoder, head


@dataclass(frozen=True)
class Tail:
    """What a family's forward does around its output linear layer W:
    logits = softcap(W(prefix(h · scale_in)) · scale_out), softcap(x) = c·tanh(x / c)."""
    scale_in: float = 1.0
    scale_out: float = 1.0
    softcap: float | None = None
    prefix: Any = None            # a module applied to h before W (ModernBERT's prediction head)


def _softcap(m) -> Tail:  # gemma2 / gemma3 / gemma3n / vaultgemma / nanochat: modeling_*.py
    return Tail(softcap=m.config.final_logit_softcapping)   # `logits = tanh(logits / cap) * cap`


LOGIT_TAILS: dict[str, Callable[[Any], Tail]] = {
    # modeling_cohere / cohere2 / cohere2_moe: `logits = logits * self.logit_scale`
    "cohere": lambda m: Tail(scale_out=m.logit_scale),
    "cohere2": lambda m: Tail(scale_out=m.logit_scale),
    "cohere2_moe": lambda m: Tail(scale_out=m.logit_scale),
    # modeling_granite / granitemoe*: `logits = logits / self.config.logits_scaling`
    "granite": lambda m: Tail(scale_out=1 / m.config.logits_scaling),
    "granitemoe": lambda m: Tail(scale_out=1 / m.config.logits_scaling),
    "granitemoehybrid": lambda m: Tail(scale_out=1 / m.config.logits_scaling),
    "granitemoeshared": lambda m: Tail(scale_out=1 / m.config.logits_scaling),
    # modeling_hyperclovax: `logits = self.lm_head(hidden_states) * self.config.logits_scaling`
    "hyperclovax": lambda m: Tail(scale_out=m.config.logits_scaling),
    # modeling_minicpm3: `hidden_states = hidden_states / self.config.logits_scaling` before lm_head
    "minicpm3": lambda m: Tail(scale_in=1 / m.config.logits_scaling),
    # modeling_falcon_h1: `logits = self.lm_head(hidden_states) * self.model.lm_head_multiplier`
    "falcon_h1": lambda m: Tail(scale_out=m.model.lm_head_multiplier),
    # modeling_modernbert_decoder: `logits = self.decoder(self.lm_head(hidden_states))`, where
    # lm_head is a dense + activation + norm prediction head and `decoder` the output linear layer
    "modernbert-decoder": lambda m: Tail(prefix=m.lm_head),
    **{t: _softcap for t in ("gemma2", "gemma3_text", "gemma3n_text", "vaultgemma", "nanochat")},
}


class LMHead:
    """`LMHead(model)(h)`: float32 logits `[c, V]` of hidden states `h` `[c, H]`, the family's
    tail applied; gradients flow through it (the searches and the fine-tuning loss use it)."""

    def __init__(self, model: Any):
        model = _base(model)
        self.model_type = getattr(model.config, "model_type", "")
        _, self.linear = decoder_and_head(model)
        self.tail = LOGIT_TAILS.get(self.model_type, lambda m: Tail())(model)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        t = self.tail
        if t.scale_in != 1.0:
            h = h * t.scale_in
        if t.prefix is not None:
            h = t.prefix(h)
        bias = getattr(self.linear, "bias", None)
        logits = F.linear(h.float(), self.linear.weight.float(), bias.float() if bias is not None else None)
        if t.scale_out != 1.0:
            logits = logits * t.scale_out
        if t.softcap is not None:
            logits = torch.tanh(logits / t.softcap) * t.softcap
        return logits


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@torch.no_grad()
def check_lm_head(model: Any, tokens: int = 16) -> LMHead:
    """The model's LMHead, after checking once per model object that decoder + LMHead give the
    logits of the model's own forward on a short probe (`tokens` ids spread over its vocabulary).
    Raises ValueError naming the family when they differ: its forward post-processes the logits
    in a way LOGIT_TAILS does not know, and every chunked score would be wrong."""
    head = LMHead(model)
    if model in _CHECKED:
        return head
    decoder, _ = decoder_and_head(model)
    device = head.linear.weight.device
    vocab = head.linear.weight.shape[0]
    ids = (torch.arange(tokens, device=device) * 7919 % vocab)[None]   # [1, tokens], spread ids
    training = model.training
    model.eval()                                                        # no dropout in the probe
    try:
        own = model(input_ids=ids, use_cache=False).logits[0].float()   # [tokens, V]
        mine = head(decoder(input_ids=ids, use_cache=False).last_hidden_state[0])
    finally:
        model.train(training)
    # float32 models agree to rounding; half-precision logits are rounded to ~3 significant digits
    rel = 1e-4 if head.linear.weight.dtype == torch.float32 else 2e-2
    if not torch.allclose(mine, own, rtol=rel, atol=rel * float(own.abs().max().clamp(min=1.0))):
        raise ValueError(
            f"{type(model).__name__} ({head.model_type!r}): the logits of its decoder and LM head differ "
            f"from its own forward's by up to {float((mine - own).abs().max()):.3g}, so its forward "
            "post-processes the logits in a way hf_posext's chunked scoring does not know "
            "(hf_posext/evaluation/lm_head.py LOGIT_TAILS lists the ones it does); scores from it would "
            "be wrong. Please report the family; a tail read from its modeling file makes it work.")
    _CHECKED[model] = True
    return head


def chunked_nll_sum(head: LMHead, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Sum of -log p(targets[t]) over positions t (IGNORE_INDEX skipped) from hidden states
    `hidden` [T, H], float32 and differentiable. Each chunk's logits are recomputed in the backward
    pass (torch.utils.checkpoint), so at most one chunk's [chunk × V] logits exist at a time,
    forward or backward; divide by the count of scored targets for transformers' mean loss."""
    total = hidden.new_zeros((), dtype=torch.float32)

    def piece(h, t):
        return F.cross_entropy(head(h), t, reduction="sum", ignore_index=IGNORE_INDEX)

    for i in range(0, targets.numel(), chunk):
        total = total + checkpoint(piece, hidden[i:i + chunk], targets[i:i + chunk], use_reentrant=False)
    return total

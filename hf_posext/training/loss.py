"""The training loss: transformers' own (`model(**batch).loss`, over the full `[b, n, V]` logits),
or, with `training.loss_chunk` > 0, the same mean next-token cross-entropy with the LM head and
the loss applied to chunks of positions and recomputed in the backward pass
(evaluation/lm_head.py `chunked_nll_sum`), so the logits never exist whole. At a 4,096-token
window and SmolLM2's 49,152-token vocabulary they are 805 MB in float32, and the loss's
log-softmax and the logits' gradient are two more tensors of that size; at a 32k window, 6.4 GB
each. The decoder and the head run as separate modules, which DistributedDataParallel and FSDP
would not see, so the recipe refuses the setting on more than one process (recipe.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..evaluation.lm_head import IGNORE_INDEX, LMHead, chunked_nll_sum, decoder_and_head


def training_loss(model, batch: dict[str, torch.Tensor], chunk: int = 0) -> torch.Tensor:
    """Mean cross-entropy of the next token over the labelled positions of `batch` (input_ids,
    labels, attention_mask, position_ids: [b, n]; labels IGNORE_INDEX where not trained)."""
    if not chunk:
        return model(**batch).loss
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    decoder, _ = decoder_and_head(model)
    hidden = decoder(**inputs, use_cache=False).last_hidden_state              # [b, n, H]
    # the target at position t is label t+1, as transformers' ForCausalLMLoss shifts them
    targets = F.pad(batch["labels"][:, 1:], (0, 1), value=IGNORE_INDEX)       # [b, n]
    total = chunked_nll_sum(LMHead(model), hidden.flatten(0, 1), targets.flatten(), chunk)
    return total / (targets != IGNORE_INDEX).sum()

"""Shared helpers for the evaluation tests: tiny random models, a character tokenizer, and stand-ins
for `--dtype auto`'s timing probe."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


def tiny_model(kind: str = "llama", seed: int = 0, **overrides):
    """The tiny model; `overrides` change its config (e.g. max_position_embeddings, its L)."""
    torch.manual_seed(seed)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**{**TINY, **overrides})).eval()
    return MistralForCausalLM(MistralConfig(**{**TINY, **overrides})).eval()


def random_doc(n: int, seed: int = 0, vocab: int = 128) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, vocab, size=n).astype(np.int32)


def char_tokenizer():
    """One token per character (printable ASCII + newline): 99 ids, fits the tiny vocab of 128.
    Built locally with `tokenizers`, no Hub access."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


def tiny_checkpoint(path, **overrides):
    """A tiny Llama (its config changed by `overrides`) and the character tokenizer saved as a
    local checkpoint folder."""
    tiny_model(**overrides).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


# --dtype auto's timing probe, stood in (tests/test_auto_dtype.py, tests/test_retrieval.py)
def no_probe(shapes):
    pytest.fail("the probe ran")


def probe(float32, bfloat16):
    """A stand-in for the timing function: these seconds per dtype."""
    return lambda shapes: {"float32": float32, "bfloat16": bfloat16}

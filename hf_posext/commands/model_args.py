"""The model and tokenizer a command's flags name (`--model`, `--gguf-file`, `--revision`,
`--dtype`, `--attn-implementation`, `--device-map`, `--device`), shared by `eval`, `passkey`
and `search`."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from ..data.embedded import DEFAULT_MODEL, load_model, load_tokenizer
from ..loading import from_pretrained


def model_kwargs(args) -> dict:
    """transformers keyword arguments the flags name (dtype, revision, attention, device map)."""
    kwargs = {"dtype": "auto" if args.dtype == "auto" else getattr(torch, args.dtype)}
    for flag, key in (("revision", "revision"), ("attn_implementation", "attn_implementation"),
                      ("device_map", "device_map"), ("gguf_file", "gguf_file")):
        if getattr(args, flag, None):
            kwargs[key] = getattr(args, flag)
    return kwargs


def load_tokenizer_from(args):
    if args.model == DEFAULT_MODEL:
        return load_tokenizer()
    kwargs = {k: v for k, v in model_kwargs(args).items() if k in ("revision", "gguf_file")}
    return AutoTokenizer.from_pretrained(args.model, **kwargs)


def load_model_from(args):
    kwargs = model_kwargs(args)
    if args.model == DEFAULT_MODEL:
        model = load_model(**kwargs)
    else:
        model = from_pretrained(args.model, **kwargs)
    return (model if args.device_map else model.to(args.device)).eval()

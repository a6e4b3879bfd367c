"""The model and tokenizer a command's flags name (`--model`, `--gguf-file`, `--revision`,
`--dtype`, `--attn-implementation`, `--device-map`, `--device`), shared by `eval`, `passkey`
and `search`."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from ..data.embedded import resolve_model
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
    path, gguf = resolve_model(args.model, args.gguf_file)
    kwargs = {"revision": args.revision} if args.revision else {}
    return AutoTokenizer.from_pretrained(path, **kwargs, **({"gguf_file": gguf} if gguf else {}))


def load_model_from(args):
    kwargs = model_kwargs(args)
    path, kwargs["gguf_file"] = resolve_model(args.model, args.gguf_file)
    model = from_pretrained(path, **{k: v for k, v in kwargs.items() if v is not None})
    return (model if args.device_map else model.to(args.device)).eval()

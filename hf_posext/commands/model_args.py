"""The model and tokenizer a command's flags name (`--model`, `--gguf-file`, `--revision`,
`--dtype`, `--attn-implementation`, `--device-map`, `--device`), shared by `eval`, `passkey`
and `search`."""

from __future__ import annotations

import torch

from ..data.embedded import load_model, load_tokenizer


def model_kwargs(args) -> dict:
    """transformers keyword arguments the flags name (dtype, revision, attention, device map)."""
    kwargs = {"dtype": "auto" if args.dtype == "auto" else getattr(torch, args.dtype)}
    for flag, key in (("revision", "revision"), ("attn_implementation", "attn_implementation"),
                      ("device_map", "device_map")):
        if getattr(args, flag, None):
            kwargs[key] = getattr(args, flag)
    return kwargs


def load_tokenizer_from(args):
    return load_tokenizer(args.model, args.gguf_file, **({"revision": args.revision} if args.revision else {}))


def load_model_from(args):
    model = load_model(name=args.model, gguf_file=args.gguf_file, **model_kwargs(args))
    return (model if args.device_map else model.to(args.device)).eval()

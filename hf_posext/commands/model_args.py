"""The model and tokenizer a command's flags name (`--model`, `--gguf-file`, `--revision`,
`--dtype`, `--attn-implementation`, `--device-map`, `--device`), shared by `eval`, `passkey`
and `search`."""

from __future__ import annotations

import torch

from ..data.embedded import load_model, load_tokenizer


def model_kwargs(args) -> dict:
    """transformers keyword arguments the flags name (dtype, revision, attention, device map); a
    command without one of these flags (`search` has only --model, --gguf-file, --device) gets
    transformers' default for it and float32."""
    dtype = getattr(args, "dtype", "float32")
    kwargs = {"dtype": "auto" if dtype == "auto" else getattr(torch, dtype)}
    for flag, key in (("revision", "revision"), ("attn_implementation", "attn_implementation"),
                      ("device_map", "device_map")):
        if getattr(args, flag, None):
            kwargs[key] = getattr(args, flag)
    return kwargs


def load_tokenizer_from(args):
    revision = getattr(args, "revision", None)
    return load_tokenizer(args.model, args.gguf_file, **({"revision": revision} if revision else {}))


def load_model_from(args):
    model = load_model(name=args.model, gguf_file=args.gguf_file, **model_kwargs(args))
    return (model if getattr(args, "device_map", None) else model.to(args.device)).eval()


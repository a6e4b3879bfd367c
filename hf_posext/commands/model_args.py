"""The model and tokenizer a command's flags name (`--model`, `--gguf-file`, `--revision`,
`--dtype`, `--attn-implementation`, `--device-map`, `--device`), shared by `eval`, `passkey`
and `search`."""

from __future__ import annotations

import importlib.util

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


def bf16_matmul_cpu(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU flags name bfloat16 matrix instructions (AVX512-BF16 or AMX-BF16):
    there oneDNN runs bf16 matmuls natively; elsewhere bf16 is emulated and slower than float32."""
    try:
        with open(cpuinfo) as f:
            flags = {w for line in f if line.startswith("flags") for w in line.split()}
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def fast_dtype(device: str, cpuinfo: str = "/proc/cpuinfo", gguf: bool = False) -> str:
    """`--dtype auto` of the retrieval commands: bfloat16 on a GPU or a CPU with bf16 matmul
    instructions, float32 elsewhere, and float32 for a GGUF checkpoint where transformers keeps
    its weights packed (transformers/quantizers/quantizer_gguf.py, `update_dtype`: its kernels
    compute in float32, so bfloat16 only adds casts)."""
    if gguf and importlib.util.find_spec("transformers.quantizers.quantizer_gguf") is not None:
        return "float32"
    if device.startswith(("cuda", "xpu")):
        return "bfloat16"
    return "bfloat16" if device == "cpu" and bf16_matmul_cpu(cpuinfo) else "float32"

"""Block attention that also returns each row's log-sum-exp: the one primitive the kernel needs.

kernel.py runs each part of a plan as `block(q, k, v, mask, scale) -> (out, lse)` and merges the
parts by their log-sum-exp. Three implementations of that contract:

- `cpu_flash`: `aten._scaled_dot_product_flash_attention_for_cpu` (the kernel behind SDPA on CPU;
  returns (output, logsumexp); float additive mask; a row with every key masked gets output 0).
- `efficient`: `aten._scaled_dot_product_efficient_attention` with compute_log_sumexp=True, the
  CUDA memory-efficient kernel behind SDPA (it takes an additive bias, unlike the CUDA flash
  kernel). Its log-sum-exp is padded along the queries to a multiple of 32 (sliced here), and
  its bias must have a last-dim stride aligned to 16 elements: the bias is padded and sliced as
  SDPA's own `preprocess_mask` does (aten/src/ATen/native/transformers/attention.cpp).
  Not run on a GPU on the machine this was written on (no GPU): `make gpu-smoke` checks it.
- `math`: scores of one block at a time in float32, any device. On CPU it is selectable so the
  suite checks the same plan/merge math against `cpu_flash` and SDPA.

`auto` (the default) picks cpu_flash on CPU, efficient on CUDA, math elsewhere. The choice is per
call: `attend(..., backend=...)`, or the environment variable HF_POSEXT_ATTENTION_BACKEND read at
each forward (nothing process-wide is changed by hf_posext itself).
"""

from __future__ import annotations

import os

import torch

ENV = "HF_POSEXT_ATTENTION_BACKEND"
BACKENDS = ("auto", "cpu_flash", "efficient", "math")


def _cpu_flash(q, k, v, mask, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)


def _aligned(mask: torch.Tensor, shape) -> torch.Tensor:
    """The bias as the efficient kernel reads it: last dim padded to a multiple of 16 then sliced
    back (a view with an aligned row stride), broadcast to the full [B, H, R, K] shape."""
    K = mask.shape[-1]
    pad = -K % 16
    if pad:
        mask = torch.nn.functional.pad(mask, (0, pad))[..., :K]
    return mask.expand(shape)


def _efficient(q, k, v, mask, scale):
    bias = None if mask is None else _aligned(mask.to(q.dtype), (*q.shape[:-1], k.shape[-2]))
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, 0.0, False, scale=scale)
    return out, lse[..., :q.shape[-2]]


def _math(q, k, v, mask, scale):
    s = (q @ k.transpose(-1, -2)).float() * scale
    if mask is not None:
        s = s + mask
    lse = torch.logsumexp(s, dim=-1)
    return torch.nan_to_num(torch.softmax(s, dim=-1)).to(v.dtype) @ v, lse


_IMPL = {"cpu_flash": _cpu_flash, "efficient": _efficient, "math": _math}


def resolve(backend: str | None, device: torch.device):
    """The block function for `backend` (None: the environment variable, else `auto`) on `device`;
    a clear error for an unknown name or one the device cannot run, before any work."""
    name = backend if backend is not None else os.environ.get(ENV, "auto")
    name = name.strip().lower()
    if name not in BACKENDS:
        source = "backend" if backend is not None else ENV
        raise ValueError(f"{source}={name!r} is not an attention backend; use one of {', '.join(BACKENDS)}.")
    if name == "auto":
        name = {"cpu": "cpu_flash", "cuda": "efficient"}.get(device.type, "math")
    if name == "cpu_flash" and device.type != "cpu":
        raise ValueError(f"attention backend cpu_flash runs on CPU tensors only, these are on "
                         f"{device}; use auto, efficient (CUDA) or math.")
    if name == "efficient" and device.type != "cuda":
        raise ValueError(f"attention backend efficient is PyTorch's CUDA kernel, these tensors are "
                         f"on {device}; use auto, cpu_flash (CPU) or math.")
    return _IMPL[name]

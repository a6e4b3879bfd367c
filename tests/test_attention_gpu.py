"""CUDA checks of the attention methods (`make gpu-smoke`; skipped without a GPU). The `efficient`
backend (PyTorch's memory-efficient kernel with its log-sum-exp) against the `math` backend on the
same GPU, which tests/test_attention_backends.py checks against the CPU flash kernel and SDPA;
against the CPU result of the same model; and, where a method is the identity, against SDPA."""

import pytest
import torch
from conftest import TRAINED, tiny_model
from test_attention import CASES, factor

import hf_posext
from hf_posext.attention import AttentionExtensionConfig
from hf_posext.attention.kernel import attend
from hf_posext.attention.units import plan_for
from hf_posext.rope.methods import default_inv_freq

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (make gpu-smoke)")]


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("method,knobs", CASES[:-1])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_efficient_backend_equals_math_backend(method, knobs, dtype, tol):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4 if t == "q" else 2, 300, 64, generator=g).cuda().to(dtype) for t in "qkv")
    i, j = torch.arange(300)[:, None], torch.arange(300)[None, :]
    keep = torch.stack([((j <= i) & (j >= p))[None] for p in (0, 37)]).cuda()   # row 1 left-padded
    plan, inv = plan_for(AttentionExtensionConfig(method, TRAINED, **knobs)), default_inv_freq(64, 1e4, "cuda")
    for mask in (None, keep):
        want = attend(q, k, v, mask, 0.125, plan, inv, 0, chunk=100, backend="math")
        got = attend(q, k, v, mask, 0.125, plan, inv, 0, chunk=100, backend="efficient")
        torch.testing.assert_close(got[:, :, 40:].float(), want[:, :, 40:].float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("method,knobs", CASES)
def test_cuda_model_equals_cpu_model(tokens, method, knobs):
    cpu = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), method, factor(method), **knobs)
    want = logits(cpu, tokens)
    gpu = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), method, factor(method), **knobs).cuda()
    torch.testing.assert_close(logits(gpu, tokens.cuda()).cpu(), want, rtol=1e-3, atol=1e-3)


def test_identity_equals_sdpa_on_cuda(tokens):
    """STRING with W = S is plain RoPE: the patched model is the unpatched SDPA model."""
    sdpa = tiny_model("llama", attn_implementation="sdpa").cuda()
    patched = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "string",
                              shifted_offset=21, local_value=21).cuda()
    torch.testing.assert_close(logits(patched, tokens.cuda()), logits(sdpa, tokens.cuda()), rtol=1e-4, atol=1e-4)

"""The kernel's block backends (attention/backends.py) on CPU: the generic `math` block against
PyTorch's CPU flash kernel and against SDPA, its selection (argument, environment variable, clear
errors), and no process-wide thread setting in the forward path. CUDA: tests/test_attention_gpu.py."""

import pytest
import torch
import torch.nn.functional as F
from conftest import TRAINED, tiny_model
from test_attention import CASES, factor, logits

import hf_posext
from hf_posext.attention import AttentionExtensionConfig
from hf_posext.attention.backends import ENV
from hf_posext.attention.kernel import attend
from hf_posext.attention.units import plan_for
from hf_posext.rope.methods import default_inv_freq

pytestmark = pytest.mark.usefixtures("one_thread")


def qkv(Q=150, K=150, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4 if t == "q" else 2, Q if t == "q" else K, 16, generator=g) for t in "qkv")


def padding_keep(Q, K, pads=(0, 37)):
    """transformers' bool mask: causal, queries the last Q of K keys, row b left-padded by pads[b]."""
    i = torch.arange(K - Q, K)[:, None]
    j = torch.arange(K)[None, :]
    return torch.stack([((j <= i) & (j >= p))[None] for p in pads])       # [B, 1, Q, K]


@pytest.mark.parametrize("method,knobs", CASES[:-1])
@pytest.mark.parametrize("masked", [False, True])
def test_math_backend_equals_cpu_flash(method, knobs, masked):
    q, k, v = qkv()
    keep = padding_keep(150, 150) if masked else None
    plan, inv = plan_for(AttentionExtensionConfig(method, TRAINED, **knobs)), default_inv_freq(16, 1e4)
    want = attend(q, k, v, keep, 0.25, plan, inv, 0, chunk=33, backend="cpu_flash")
    got = attend(q, k, v, keep, 0.25, plan, inv, 0, chunk=33, backend="math")
    torch.testing.assert_close(got[:, :, 40:], want[:, :, 40:], rtol=1e-5, atol=1e-5)
    tail_keep = None if keep is None else keep[:, :, 140:]
    tail = attend(q[:, :, 140:], k, v, tail_keep, 0.25, plan, inv, 140, backend="math")   # cached
    torch.testing.assert_close(tail, want[:, :, 140:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["cpu_flash", "math"])
def test_identity_plan_equals_sdpa(backend):
    """STRING with W = S is plain RoPE (d − S + S = d): both parts together are SDPA, GQA included."""
    q, k, v = qkv()
    plan = plan_for(AttentionExtensionConfig("string", TRAINED, shifted_offset=20, local_value=20))
    got = attend(q, k, v, None, 0.25, plan, default_inv_freq(16, 1e4), 0, chunk=33, backend=backend)
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                          is_causal=True, scale=0.25)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method,knobs", [CASES[2], CASES[3], CASES[5], CASES[7]])
def test_environment_variable_selects_the_backend(monkeypatch, tokens, method, knobs):
    model = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), method, factor(method), **knobs)
    want = logits(model, tokens)
    monkeypatch.setenv(ENV, "math")
    torch.testing.assert_close(logits(model, tokens), want, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv(ENV, "no-such")
    with pytest.raises(ValueError, match=f"{ENV}='no-such' is not an attention backend"):
        logits(model, tokens)


@pytest.mark.parametrize("backend,message", [("efficient", "CUDA kernel"), ("flash2", "not an attention backend")])
def test_backend_errors_name_the_fix(backend, message):
    q, k, v = qkv(8, 8)
    plan = plan_for(AttentionExtensionConfig("rerope", TRAINED, window=4))
    with pytest.raises(ValueError, match=message):
        attend(q, k, v, None, 0.25, plan, default_inv_freq(16, 1e4), 0, backend=backend)


def test_forward_sets_no_thread_count(monkeypatch, tokens):
    """torch.set_num_threads is process-wide: a forward must not call it."""
    model = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "string",
                            shifted_offset=21, local_value=5)

    def refuse(n):
        raise AssertionError(f"the forward called torch.set_num_threads({n})")
    monkeypatch.setattr(torch, "set_num_threads", refuse)
    logits(model, tokens)


def test_efficient_wrapper_meets_the_cuda_kernel_contract(monkeypatch):
    """The CUDA op cannot run here; a stand-in holding to its contract (aten
    `_efficient_attention_forward`: bias in the query dtype, row stride aligned, full 4-D shape;
    log-sum-exp padded along the queries to a multiple of 32, padding rows garbage) checks what
    hf_posext does around it: alignment, broadcast, and slicing the log-sum-exp back."""
    from hf_posext.attention import backends

    def op(q, k, v, bias, compute_lse, dropout, causal, scale=None):
        assert compute_lse and not causal and dropout == 0.0
        assert bias.dtype == q.dtype and bias.shape == (*q.shape[:-1], k.shape[-2])
        assert bias.stride(-2) % 8 == 0                      # SDPA's preprocess_mask alignment
        out, lse = backends._math(q, k, v, bias, scale)
        pad = -lse.shape[-1] % 32
        return out, torch.cat([lse, torch.full((*lse.shape[:-1], pad), 7.0)], -1), None, None
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", op)
    q, k, v = qkv(30, 45)
    q = q[:, :2]                              # the kernel's GQA layout: query rows per key head
    mask = torch.zeros(1, 1, 30, 45).masked_fill(torch.rand(1, 1, 30, 45) < 0.3, float("-inf"))
    out, lse = backends._efficient(q, k, v, mask, 0.25)
    want_out, want_lse = backends._cpu_flash(q, k, v, mask, 0.25)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)

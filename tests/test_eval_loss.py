"""Chunked loss, the two protocols and token-weighted aggregation, against independent references:
transformers' own full-logits loss and brute-force per-token loops over prefixes."""

import math

import numpy as np
import pytest
import torch

from _evalkit import random_doc, tiny_model
from hf_posext.evaluation.perplexity.loss import IGNORE_INDEX, PeakMemory, causal_targets, chunked_nll
from hf_posext.evaluation.perplexity.run import sliding_nll, sliding_windows, truncate_nll


def _next_token_nll(model, context: torch.Tensor, target: int) -> float:
    """-log p(target | context) from a plain forward over the context alone (no chunking)."""
    with torch.no_grad():
        logits = model(context[None]).logits[0, -1].double()   # [V]
    return float(-torch.log_softmax(logits, -1)[target])


@pytest.mark.parametrize("kind", ["llama", "mistral"])
@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_chunked_loss_equals_full_logits_loss(kind, chunk):
    model = tiny_model(kind)
    ids = torch.as_tensor(random_doc(150, seed=1), dtype=torch.long)   # [T]
    nll, n = chunked_nll(model, ids, causal_targets(ids), chunk_size=chunk)
    with torch.no_grad():
        mean = model(ids[None], labels=ids[None]).loss.item()       # mean over T-1 shifted labels
    assert n == ids.numel() - 1
    assert nll / n == pytest.approx(mean, rel=1e-5)


def test_progress_bars_do_not_change_the_loss(monkeypatch):
    """The per-layer progress hook must not touch layer outputs (a forward hook that returns a
    value replaces the output: tqdm.update returns True whenever it redraws)."""
    import tqdm.auto

    class RedrawingBar(tqdm.auto.tqdm):  # redraws on every update, as a slow forward does
        def update(self, n=1):
            super().update(n)
            return True

    monkeypatch.setattr(tqdm.auto, "tqdm", RedrawingBar)
    model = tiny_model()
    ids = torch.as_tensor(random_doc(150, seed=4), dtype=torch.long)
    quiet = chunked_nll(model, ids, causal_targets(ids), chunk_size=16)
    shown = chunked_nll(model, ids, causal_targets(ids), chunk_size=16, progress=True)
    assert shown == quiet


def test_chunked_loss_skips_ignored_targets():
    model = tiny_model()
    ids = torch.as_tensor(random_doc(40, seed=2), dtype=torch.long)
    targets = torch.full_like(ids, IGNORE_INDEX)
    targets[10], targets[25] = 5, 77
    nll, n = chunked_nll(model, ids, targets, chunk_size=1)
    expected = _next_token_nll(model, ids[:11], 5) + _next_token_nll(model, ids[:26], 77)
    assert n == 2 and nll == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_truncate_is_token_weighted_over_documents():
    """Two documents, first L tokens each: exp(total NLL / tokens) from a per-token prefix loop."""
    model = tiny_model()
    docs = [random_doc(90, seed=3), random_doc(70, seed=4)]
    L = 48
    nll, n = truncate_nll(model, docs, L, chunk_size=5)
    total, count = 0.0, 0
    for doc in docs:
        d = torch.as_tensor(doc, dtype=torch.long)
        for t in range(1, L):                     # token t predicted from tokens 0..t-1
            total += _next_token_nll(model, d[:t], int(d[t]))
            count += 1
    assert n == count == 2 * (L - 1)
    assert math.exp(nll / n) == pytest.approx(math.exp(total / count), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("window,stride", [(32, 8), (32, 32), (40, 13)])
def test_sliding_window_equals_brute_force_loop(window, stride):
    """Each prediction position p is scored once, with context from the start of the first window
    that covers p (window ends: W, W+S, ..., n). Brute force: one prefix forward per token."""
    model = tiny_model()
    docs = [random_doc(100, seed=5), random_doc(77, seed=6)]
    nll, n = sliding_nll(model, docs, window, stride, chunk_size=3)
    total, count = 0.0, 0
    for doc in docs:
        d = torch.as_tensor(doc, dtype=torch.long)
        ends = list(range(window, len(d), stride)) + [len(d)]
        for p in range(len(d) - 1):
            end = next(e for e in ends if e > p)
            total += _next_token_nll(model, d[end - window:p + 1], int(d[p + 1]))
            count += 1
    assert n == count == (100 - 1) + (77 - 1)
    assert math.exp(nll / n) == pytest.approx(math.exp(total / count), rel=1e-5)


def test_sliding_with_stride_equal_window_is_truncate_and_independent_windows():
    model = tiny_model()
    W = 32
    doc = random_doc(3 * W, seed=7)
    # One window: sliding over the first W tokens is the truncate value at L = W.
    assert sliding_nll(model, [doc], W, W, eval_tokens=W) == \
        pytest.approx(truncate_nll(model, [doc], W), rel=1e-6)
    # Three disjoint windows: each scored with the plain full-logits path (window k's last
    # position predicts the first token of window k+1).
    d = torch.as_tensor(doc, dtype=torch.long)
    total = 0.0
    for k in range(3):
        window = d[k * W:(k + 1) * W]
        with torch.no_grad():
            logp = torch.log_softmax(model(window[None]).logits[0].double(), -1)   # [W, V]
        nxt = d[k * W + 1:min((k + 1) * W + 1, len(d))]
        total -= float(logp[torch.arange(len(nxt)), nxt].sum())
    nll, n = sliding_nll(model, [doc], W, W)
    assert n == 3 * W - 1 and nll == pytest.approx(total, rel=1e-5)


def test_token_weighting_differs_from_mean_of_window_perplexities():
    """The old docs-snippet bug: averaging per-window losses over windows of unequal scored
    counts is not the token-weighted value; make sure the data used above can tell them apart."""
    model = tiny_model()
    doc = torch.as_tensor(random_doc(100, seed=5), dtype=torch.long)
    per_window = []
    for start, end, first in sliding_windows(100, 32, 8):
        ids = doc[start:end]
        t = torch.full_like(ids, IGNORE_INDEX)
        lo, hi = first - start, min(end, 99) - start
        t[lo:hi] = doc[start + lo + 1:start + hi + 1]
        per_window.append(chunked_nll(model, ids, t))
    weighted = sum(a for a, _ in per_window) / sum(b for _, b in per_window)
    naive = np.mean([a / b for a, b in per_window])
    assert weighted == pytest.approx(sliding_nll(model, [doc.numpy()], 32, 8)[0] / 99, rel=1e-6)
    assert abs(weighted - naive) > 1e-4


def test_sliding_windows_cover_each_prediction_once():
    for n, W, S in [(100, 32, 8), (64, 64, 256 // 8), (97, 10, 10), (10, 10, 3)]:
        scored = []
        for start, end, first in sliding_windows(n, W, S):
            assert end - start == W and start >= 0 and end <= n
            scored += list(range(first, min(end, n - 1)))
        assert scored == list(range(n - 1))
    with pytest.raises(ValueError, match="unscored"):
        sliding_windows(100, 16, 32)
    with pytest.raises(ValueError, match="at least 64 tokens"):
        sliding_windows(50, 64, 8)


def test_peak_memory_sees_a_transient_allocation():
    with PeakMemory("cpu") as peak:
        x = torch.ones(64 * 2**20 // 4 * 4)   # 256 MiB, touched
        x += 1
        del x
    assert peak.increase_mb > 200
    with PeakMemory("cpu") as small:
        torch.ones(10)
    assert small.increase_mb < 50

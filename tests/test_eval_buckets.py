"""Per-position results: position buckets, one forward serving several lengths, the
derived columns (ratio beyond L, short-context regression, bits per byte, spread over documents)
and the NLL-vs-position plot.

References are independent of the evaluator: transformers' own loss (`model(ids, labels=...)`,
which averages the shifted cross-entropy itself) and per-token losses from the model's full
logits, on separate forwards of each length.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _evalkit import random_doc, tiny_model
from conftest import tiny_model as tiny_model_with

import hf_posext
from hf_posext.evaluation.perplexity import run as P
from hf_posext.evaluation.perplexity.buckets import bucket_edges, curve, doc_perplexities, nll_from
from hf_posext.evaluation.shared.identity import rope_prefix_stable
from hf_posext.evaluation.shared.results import format_table, plot_nll_by_position
from hf_posext.evaluation.shared.settings import PerplexityGrid
from hf_posext.evaluation.shared.store import ResultsStore
from hf_posext.rope.compat import IS_V5
from hf_posext.evaluation.shared.record import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")

L = 64                                  # the tiny models' trained length
DOCS = [random_doc(200, seed=21), random_doc(190, seed=22)]


def _token_losses(model, ids) -> torch.Tensor:
    """Per-token NLL of one separate forward, from the model's full logits: [n - 1]."""
    with torch.no_grad():
        logits = model(torch.as_tensor(ids, dtype=torch.long)[None]).logits[0].double()   # [n, V]
    return F.cross_entropy(logits[:-1], torch.as_tensor(ids[1:], dtype=torch.long), reduction="none")


def _reference_ppl(model, method, s, n, **knobs):
    """Perplexity of the first n tokens of DOCS from transformers' own loss, one forward each."""
    if method != "none":
        hf_posext.patch(model, method, s, **knobs)
    try:
        total = 0.0
        for d in DOCS:
            ids = torch.as_tensor(d[:n], dtype=torch.long)[None]
            with torch.no_grad():
                total += float(model(ids, labels=ids).loss) * (n - 1)   # mean over n - 1 targets
    finally:
        if method != "none":
            hf_posext.unpatch(model)
    return math.exp(total / (len(DOCS) * (n - 1)))


def test_bucket_edges_put_L_on_an_edge():
    assert bucket_edges(16384, 8192) == list(range(0, 16384 + 1, 512))
    assert 100 in bucket_edges(250, 100) and bucket_edges(250, 100)[-1] == 250
    assert bucket_edges(40, 64) == list(range(0, 40, 4)) + [40]


@pytest.mark.parametrize("method,knobs", [("linear", {}), ("yarn", {}), ("rerope", {"window": 32}),
                                          ("dual_chunk", {})])
def test_one_forward_serves_every_length_of_a_fixed_s(method, knobs):
    """A grid of lengths at a fixed s takes its shorter lengths from one forward at the longest
    (forward_length says so) and reproduces separate forwards' perplexities to 1e-4 relative."""
    model = tiny_model()
    lengths = [32, 64, 96, 160]
    rows = P.evaluate_perplexity(model, DOCS,
                                 PerplexityGrid(methods=[method], lengths=lengths, factors=[2.5],
                                                knobs={method: knobs} if knobs else None,
                                                baseline=False),
                                 progress=False, reuse_identical=False)
    for r in rows:
        assert r["forward_length"] == 160, r
        s = 1.0 if r["method"] == "none" else 2.5
        ref = _reference_ppl(model, r["method"], s, r["length"], **(knobs if r["method"] != "none" else {}))
        assert r["perplexity"] == pytest.approx(ref, rel=1e-4), (r["method"], r["length"])


def test_dynamic_methods_keep_one_forward_per_length(monkeypatch):
    model = tiny_model()
    calls = []
    real = P.truncate_positions
    monkeypatch.setattr(P, "truncate_positions", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    rows = P.evaluate_perplexity(model, DOCS,
                                 PerplexityGrid(methods=["dynamic_ntk"], lengths=[96, 160],
                                                factors=[2.5], baseline=False),
                                 progress=False, reuse_identical=False)
    dyn = [r for r in rows if r["method"] == "dynamic_ntk"]
    assert [r["forward_length"] for r in dyn] == [96, 160]
    assert sorted(calls) == [96, 160, 160]          # `none` shares one 160 forward; dynamic does not
    for r in dyn:
        assert r["perplexity"] == pytest.approx(_reference_ppl(model, "dynamic_ntk", 2.5, r["length"]), rel=1e-4)


def _reference_sliding_ppl(model, n, window, stride):
    """The sliding baseline over the first n tokens of DOCS by brute force: each prediction
    position p scored once, with context from the start of the first window (ends window,
    window + stride, ..., n) that covers it, one separate forward per window."""
    total, count = 0.0, 0
    for d in DOCS:
        ends = list(range(window, n, stride)) + [n]
        prev = 0
        for end in ends:
            losses = _token_losses(model, d[end - window:min(end + 1, n)])   # positions end-window..
            sel = losses[prev - (end - window):]
            total, count, prev = total + float(sel.sum()), count + sel.numel(), end
    assert count == len(DOCS) * (n - 1)
    return math.exp(total / count)


def test_the_baseline_takes_its_first_window_from_the_unpatched_forward(monkeypatch):
    """With the unpatched model in the grid at a longer length, the sliding baseline does not run
    its first window again (one window fewer per document) and still equals separate forwards."""
    model = tiny_model()
    windows = []
    real = P.token_nll
    monkeypatch.setattr(P, "token_nll", lambda m, ids, *a, **k: windows.append(ids.numel()) or real(m, ids, *a, **k))
    rows = P.evaluate_perplexity(model, DOCS,
                                 PerplexityGrid(methods=["yarn"], factors=[2.5], lengths=[96, 160],
                                                baseline_stride=16),
                                 progress=False, reuse_identical=False)
    base = {r["length"]: r for r in rows if r["protocol"] == "baseline"}
    assert sorted(base) == [96, 160]
    # window ends 64, 80, 96 and 64, 80, ..., 160: 3 + 7 windows per document, the first of each shared
    assert windows.count(L) == len(DOCS) * (2 + 6)
    assert sorted(n for n in windows if n != L) == [160] * 4      # none and yarn: one forward per document
    for n, r in base.items():
        assert r["perplexity"] == pytest.approx(_reference_sliding_ppl(model, n, L, 16), rel=1e-5)


def test_the_baseline_runs_every_window_when_the_unpatched_model_is_not_run(monkeypatch):
    """Only the cells this process computes share: a baseline whose unpatched rows were resumed
    (not planned here) runs all its windows."""
    model = tiny_model()
    windows = []
    real = P.token_nll
    monkeypatch.setattr(P, "token_nll", lambda m, ids, *a, **k: windows.append(ids.numel()) or real(m, ids, *a, **k))
    cells = PerplexityGrid(methods=["yarn"], factors=[2.5], lengths=[96], baseline_stride=8).cells(L)
    baseline = next(c for c in cells if c.protocol == "baseline")
    forwards = P.SharedForwards(model, DOCS)
    forwards.plan([baseline])
    per_doc, _ = forwards.positions(baseline)
    assert windows == [L] * (len(DOCS) * 5)           # window ends 64, 72, 80, 88, 96
    nll, n = P._total(per_doc)
    assert math.exp(nll / n) == pytest.approx(_reference_sliding_ppl(model, 96, L, 8), rel=1e-5)


def test_longrope_is_not_prefix_stable_and_static_methods_are():
    rope = {"rope_type": "longrope", "rope_theta": 10_000.0, "short_factor": [1.0] * 8,
            "long_factor": [3.0] * 8, "original_max_position_embeddings": L}
    longrope = (tiny_model_with(rope_parameters=rope, max_position_embeddings=4 * L) if IS_V5 else
                tiny_model_with(rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"},
                                max_position_embeddings=4 * L, original_max_position_embeddings=L))
    assert not rope_prefix_stable(longrope, 32, 160)     # short factors at 32, long at 160
    assert not rope_prefix_stable(hf_posext.patch(tiny_model(), "dynamic_yarn", 2.0), 32, 160)
    assert rope_prefix_stable(hf_posext.patch(tiny_model(), "yarn", 2.0), 32, 160)


def test_buckets_hold_the_per_position_losses():
    """Per bucket, per document, and past L: each equal to sums of the model's own per-token
    losses of a separate forward."""
    model = tiny_model()
    rows = P.evaluate_perplexity(model, DOCS,
                                 PerplexityGrid(methods=["linear"], lengths=[96, 160],
                                                factors=[2.5]),
                                 progress=False)
    r = next(x for x in rows if x["method"] == "linear" and x["length"] == 160)
    hf_posext.patch(model, "linear", 2.5)
    losses = [_token_losses(model, d[:160]) for d in DOCS]             # each [159]
    hf_posext.unpatch(model)
    edges = r["bucket_edges"]
    assert edges == bucket_edges(160, L) and L in edges
    for i in range(len(edges) - 1):
        ref = sum(float(x[edges[i]:edges[i + 1]].sum()) for x in losses)
        assert r["bucket_nll"][i] == pytest.approx(ref, rel=1e-5)
        assert r["bucket_tokens"][i] == len(DOCS) * len(range(edges[i], min(edges[i + 1], 159)))
    assert r["doc_nll"] == pytest.approx([float(x.sum()) for x in losses], rel=1e-5)
    assert r["doc_tokens"] == [159, 159] and len(doc_perplexities(r)) == 2
    past = nll_from(r, L)
    assert past[0] == pytest.approx(sum(float(x[L:].sum()) for x in losses), rel=1e-5)
    assert past[1] == 2 * (159 - L)
    # the baseline's buckets cover the same document positions, so a ratio past L exists
    base = next(x for x in rows if x["protocol"] == "baseline" and x["length"] == 160)
    assert base["bucket_edges"] == edges and sum(base["bucket_tokens"]) == 2 * 159
    want = math.exp(past[0] / past[1] - nll_from(base, L)[0] / nll_from(base, L)[1])
    assert r["ratio_to_sliding_beyond_L"] == pytest.approx(want, abs=1e-4)


def test_short_context_regression_and_bits_per_byte():
    model = tiny_model()
    text_bytes = lambda n: sum(len(bytes(int(t) % 90 + 32 for t in d[1:n])) for d in DOCS)  # 1 byte/token
    rows = P.evaluate_perplexity(model, DOCS,
                                 PerplexityGrid(methods=["yarn"], lengths=[32, 64, 128],
                                                factors=[2.0]),
                                 progress=False, text_bytes=text_bytes)
    none = {r["length"]: r for r in rows if r["method"] == "none" and r["protocol"] == "truncate"}
    for r in rows:
        if r["method"] == "yarn" and r["length"] <= L:
            assert r["ratio_to_unpatched"] == pytest.approx(r["perplexity"] / none[r["length"]]["perplexity"], abs=1e-4)
            assert r["perplexity"] != none[r["length"]]["perplexity"]   # s = 2 changes short prompts
        else:
            assert r["ratio_to_unpatched"] is None
        n = r["length"] if r["protocol"] != "sliding" else r["eval_tokens"]
        assert r["bytes"] == 2 * (n - 1)
        assert r["bits_per_byte"] == pytest.approx(math.log2(r["perplexity"]), rel=1e-9)  # 1 byte a token


def test_resume_keeps_the_buckets_and_reuses_them(tmp_path, monkeypatch):
    model = tiny_model()
    with ResultsStore(tmp_path, "perplexity") as store:
        first = P.evaluate_perplexity(model, DOCS,
                                      PerplexityGrid(methods=["yarn"], lengths=[96], factors=[2.0]),
                                      store=store, progress=False)
    calls = []
    real = P.truncate_positions
    monkeypatch.setattr(P, "truncate_positions", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    with ResultsStore(tmp_path, "perplexity", resume=True) as store:
        again = P.evaluate_perplexity(model, DOCS,
                                      PerplexityGrid(methods=["yarn"], lengths=[96, 160],
                                                     factors=[2.0]),
                                      store=store, progress=False)
    assert sorted(calls) == [160, 160]            # none and yarn at 160 only; 96 came from the file
    stored = read_rows(tmp_path / "perplexity.json")
    old = {r["key"]: r for r in first}
    for r in stored:
        assert sum(r["bucket_tokens"]) == r["tokens"] and r["doc_nll"]
        if r["key"] in old:
            assert r["bucket_nll"] == old[r["key"]]["bucket_nll"]
    assert any(r["ratio_to_sliding_beyond_L"] for r in again if r["length"] == 160)


def test_table_columns_and_position_plot(tmp_path):
    model = tiny_model()
    rows = P.evaluate_perplexity(model, DOCS,
                                 PerplexityGrid(methods=["yarn"], lengths=[32, 64, 128],
                                                factors=[2.0]),
                                 progress=False)
    text = format_table(rows)
    head = text.splitlines()[0]
    for column in ("ratio to sliding @128", "past 64", "≤64 vs none", "docs @128"):
        assert column in head, head
    yarn = next(r for r in rows if r["method"] == "yarn" and r["length"] == 128)
    line = next(x for x in text.splitlines() if x.startswith("yarn"))
    assert f"{yarn['ratio_to_sliding_beyond_L']:.3f}" in line
    worst = max(r["ratio_to_unpatched"] for r in rows if r["method"] == "yarn" and r["length"] <= L)
    assert f"{worst:.3f}" in line
    lo, hi = sorted(doc_perplexities(yarn))
    assert f"{lo:.2f}–{hi:.2f}" in line
    xs, ys = curve(yarn)
    assert len(xs) == len(yarn["bucket_nll"]) and all(y > 0 for y in ys)
    path = plot_nll_by_position(rows, tmp_path / "nll.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_position_plot_against_each_series_own_baseline(tmp_path, monkeypatch):
    """`baselines=`: the bottom panel is each series minus its own sliding window (fine-tuned arms
    are different models), not minus the one dashed baseline. An own baseline 0.25 nats a token
    below the shared one (every bucket's sum lowered by 0.25 x its tokens) moves the series' delta
    up by exactly 0.25."""
    from hf_posext.evaluation.shared import results
    model = tiny_model()
    rows = P.evaluate_perplexity(model, DOCS, PerplexityGrid(methods=["yarn"], lengths=[64, 128], factors=[2.0]),
                                 progress=False)
    yarn = next(r for r in rows if r["method"] == "yarn" and r["length"] == 128)
    base = next(r for r in rows if r["protocol"] == "baseline" and r["length"] == 128)
    own = {**base, "bucket_nll": [n - 0.25 * t for n, t in zip(base["bucket_nll"], base["bucket_tokens"])]}
    figures = []
    monkeypatch.setattr(results, "_save_figure", lambda fig, top, title, path: figures.append(fig) or path)
    for mapping in (None, {results._series_label(yarn): own}):
        results.plot_nll_by_position([yarn, base], tmp_path / "p.png", "t", baselines=mapping)
    (_, ys), (_, bs) = curve(yarn), curve(base)
    shared, mine = (fig.axes[1].get_lines()[0].get_ydata() for fig in figures)
    assert list(shared) == pytest.approx([y - b for y, b in zip(ys, bs)])
    assert list(mine) == pytest.approx([y - b + 0.25 for y, b in zip(ys, bs)])
    assert figures[1].axes[1].get_ylabel() == "Δ NLL vs its own sliding window"

"""The perplexity grid: rows, auto factors, reuse of identical cells, results files and resume,
and a run killed mid-way keeping its finished rows."""

import csv
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hf_posext
from _evalkit import random_doc, tiny_model
from hf_posext.evaluation.perplexity import run as ppl_mod
from hf_posext.evaluation.perplexity.run import evaluate_perplexity, truncate_nll
from hf_posext.evaluation.shared.settings import PerplexityGrid
from hf_posext.evaluation.shared.results import format_table, plot_perplexity
from hf_posext.evaluation.shared.store import ResultsStore
from hf_posext.evaluation.shared.record import read_rows

DOCS = [random_doc(160, seed=11), random_doc(200, seed=12)]


def test_grid_rows_match_direct_patched_evaluation():
    model = tiny_model()   # trained length 64
    rows = evaluate_perplexity(model, DOCS,
                               PerplexityGrid(methods=["linear", "yarn"], lengths=[32, 128]),
                               progress=False)
    got = {(r["method"], r["length"]): r for r in rows if r["protocol"] == "truncate"}
    assert set(got) == {(m, n) for m in ("none", "linear", "yarn") for n in (32, 128)}
    assert got[("yarn", 128)]["factor"] == 2.0 and got[("yarn", 32)]["factor"] == 1.0
    # Independent: patch by hand, score by hand.
    for method in ("linear", "yarn"):
        hf_posext.patch(model, method, 2.0)
        nll, n = truncate_nll(model, DOCS, 128)
        hf_posext.unpatch(model)
        assert got[(method, 128)]["perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-9)
        assert got[(method, 128)]["tokens"] == n == 2 * 127
    assert not hf_posext.is_patched(model)   # the grid leaves the model as it found it
    # Past the trained length the methods really differ from the unpatched model.
    assert got[("linear", 128)]["perplexity"] != got[("none", 128)]["perplexity"]


def test_identical_rope_cells_are_reused_and_equal_a_recompute():
    model = tiny_model()
    reused = evaluate_perplexity(model, DOCS,
                                 PerplexityGrid(methods=["linear", "ntk", "yarn", "dynamic_ntk"],
                                                lengths=[48]),
                                 progress=False)
    assert all(r["protocol"] == "truncate" for r in reused)   # no baseline within the trained length
    fresh = evaluate_perplexity(model, DOCS,
                                PerplexityGrid(methods=["linear", "ntk", "yarn", "dynamic_ntk"],
                                               lengths=[48]),
                                reuse_identical=False, progress=False)
    for a, b in zip(reused, fresh):
        assert a["method"] == b["method"]
        assert a["perplexity"] == pytest.approx(b["perplexity"], rel=1e-12)
        assert b["same_as"] == ""
    assert [r["same_as"] for r in reused] == ["", "none s=1", "none s=1", "none s=1", "none s=1"]
    # A real extension (s=2 at 128 > 64) is never reused.
    rows = evaluate_perplexity(model, DOCS, PerplexityGrid(methods=["linear"], lengths=[128]),
                               progress=False)
    assert rows[1]["same_as"] == ""


def test_plan_cells_order_auto_and_numeric_factors():
    cells = PerplexityGrid(["yarn", "linear"], [256, 64], ["auto", 2.0], ["truncate"],
                           baseline=False).cells(trained=64)
    got = [(c.method, c.factor, c.length) for c in cells]
    assert got == [("none", 1.0, 64), ("yarn", 1.0, 64), ("yarn", 2.0, 64), ("linear", 1.0, 64),
                   ("linear", 2.0, 64), ("none", 1.0, 256), ("yarn", 4.0, 256), ("yarn", 2.0, 256),
                   ("linear", 4.0, 256), ("linear", 2.0, 256)]


def test_results_files_resume_and_refusal(tmp_path, monkeypatch):
    model = tiny_model()
    with ResultsStore(tmp_path, "perplexity") as store:
        first = evaluate_perplexity(model, DOCS,
                                    PerplexityGrid(methods=["linear"], lengths=[32, 128],
                                                   baseline=False),
                                    store=store, progress=False)
    on_disk = read_rows(tmp_path / "perplexity.json")
    assert [r["key"] for r in on_disk] == [r["key"] for r in first]
    with open(tmp_path / "perplexity.csv") as f:
        table = list(csv.DictReader(f))
    assert [float(r["perplexity"]) for r in table] == pytest.approx([r["perplexity"] for r in first])
    with pytest.raises(ValueError, match="--resume"):
        ResultsStore(tmp_path, "perplexity")
    # Resume: finished cells are not recomputed; only the new length is.
    calls = []
    real = ppl_mod.truncate_positions
    monkeypatch.setattr(ppl_mod, "truncate_positions", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    with ResultsStore(tmp_path, "perplexity", resume=True) as store:
        again = evaluate_perplexity(model, DOCS,
                                    PerplexityGrid(methods=["linear"], lengths=[32, 128, 96],
                                                   baseline=False),
                                    store=store, progress=False)
    assert calls == [96, 96]   # none and linear at 96 (s = 1.5); 32 and 128 came from the files
    assert len(read_rows(tmp_path / "perplexity.json")) == 6
    assert [r["perplexity"] for r in again if r["length"] != 96] == [r["perplexity"] for r in first]
    # The file lists the rows in cell order (lengths ascending), whatever order they finished in.
    assert [r["length"] for r in read_rows(tmp_path / "perplexity.json")] == \
        [32, 32, 96, 96, 128, 128]


def test_table_and_plot(tmp_path):
    model = tiny_model()
    rows = evaluate_perplexity(model, DOCS,
                               PerplexityGrid(methods=["linear", "ntk"], lengths=[32, 64, 128]),
                               progress=False)
    text = format_table(rows)
    assert text.splitlines()[0].split()[:8] == ["method", "32", "64", "128", "ratio", "to", "sliding", "@128"]
    assert "none, sliding 64 window (stride 16)" in text     # the baseline is a row of the table
    none128 = next(r for r in rows if r["method"] == "none" and r["length"] == 128)
    base128 = next(r for r in rows if r["protocol"] == "baseline")
    assert text.splitlines()[2].split()[3:5] == [f"{none128['perplexity']:.2f}",
                                                 f"{none128['perplexity'] / base128['perplexity']:.3f}"]
    path = plot_perplexity(rows, tmp_path / "p.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


# the last two: a flat curve, exactly and up to rounding (an IndexError before, on a tiny fine-tuned arm)
@pytest.mark.parametrize("lo,hi", [(24.4, 80.0), (30.3, 33.0), (2.0, 5000.0), (1.01, 1.02), (7.5, 7.5),
                                   (1.0, 1.0000000001)])
def test_log_ticks_span_the_data(lo, hi):
    from hf_posext.evaluation.shared.results import log_ticks
    ticks = log_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 2 <= len(ticks) <= 9
    assert ticks == sorted(set(ticks))
    assert ticks[-1] / ticks[0] < 2.5 * hi / lo   # no decade of empty axis around the data


KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from _evalkit import random_doc, tiny_model
    from hf_posext.evaluation.perplexity import run as P
    from hf_posext.evaluation.shared.settings import PerplexityGrid
    from hf_posext.evaluation.shared.store import ResultsStore
    calls = []
    real = P.truncate_positions
    def dying(*a, **k):
        calls.append(1)
        if len(calls) == 2:   # linear@128 (none@64 and none@128 share the first forward): die mid-cell
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)
    P.truncate_positions = dying
    docs = [random_doc(160, seed=11), random_doc(200, seed=12)]
    P.evaluate_perplexity(tiny_model(), docs, PerplexityGrid(["linear"], [64, 128]),
                          store=ResultsStore({out!r}, "perplexity"), progress=False)
""")


@pytest.mark.slow
def test_killed_run_keeps_finished_rows_and_resume_completes(tmp_path):
    script = KILLED_RUN.format(tests=str(Path(__file__).parent), out=str(tmp_path))
    # a generous limit: on a loaded machine the import alone can take a minute; not a speed check
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr
    # Cells: none@64 (computed), linear@64 (s=1: reused), none@128 (computed), linear@128 (killed).
    rows = read_rows(tmp_path / "perplexity.json")
    assert [(r["method"], r["length"]) for r in rows] == [("none", 64), ("linear", 64), ("none", 128)]
    with open(tmp_path / "perplexity.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    with ResultsStore(tmp_path, "perplexity", resume=True) as store:
        done = evaluate_perplexity(tiny_model(), DOCS,
                                   PerplexityGrid(methods=["linear"], lengths=[64, 128]),
                                   store=store, progress=False)
    assert [(r["method"], r["length"], r["protocol"]) for r in done] == [
        ("none", 64, "truncate"), ("linear", 64, "truncate"), ("none", 128, "truncate"),
        ("linear", 128, "truncate"), ("none", 128, "baseline")]
    assert len(read_rows(tmp_path / "perplexity.json")) == 5

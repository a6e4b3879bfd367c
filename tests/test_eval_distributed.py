"""Distributed evaluation: under `torchrun` with 2 gloo ranks on CPU, `hf-posext eval`
and `passkey` share the cells out and rank 0 writes one results file equal to a single-process
run's (timings aside); resume works across ranks.

`torchrun --nproc_per_node 2` with ACCELERATE_USE_CPU=true is the launch that really starts two
ranks on a CPU machine (accelerate's own launcher with --cpu starts one)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hf_posext.evaluation.shared.record import read_rows
from _evalkit import char_tokenizer, tiny_model

# How a cell was run, not what it is: times, and which shared forward its losses came from (a
# run split over ranks, or resumed with more lengths, shares forwards differently; the numbers
# then agree to float rounding, compared with `_same` below).
TIMING = {"seconds", "finished_at", "peak_rss_mb", "peak_increase_mb", "forward_length"}
NUMBERS = {"perplexity", "nll", "bucket_nll", "doc_nll", "ratio_to_sliding", "bits_per_byte",
           "ratio_to_sliding_beyond_L", "ratio_to_unpatched"}
ROOT = Path(__file__).resolve().parents[1]


def _argv(kind, model, out, data, lengths):
    if kind == "eval":
        return ["eval", "--model", str(model), "--dataset", str(data), "--lengths", lengths,
                "--methods", "linear,yarn,ntk", "--max-docs", "2", "--out", str(out),
                "--no-progress", "--no-plot"]
    return ["passkey", "--model", str(model), "--lengths", lengths, "--methods", "yarn",
            "--depths", "0,1", "--trials", "2", "--out", str(out), "--no-progress", "--no-plot"]


def _driver(runs) -> str:
    """A script that calls the CLI for each argv in turn, in one process (or one per rank)."""
    return textwrap.dedent(f"""
        import sys
        import hf_posext.cli as cli
        for argv in {runs!r}:
            code = cli.main(argv)
            if code:
                sys.exit(code)
    """)


def _launch(script, tmp_path, ranks: int):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "ACCELERATE_USE_CPU": "true", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    path = tmp_path / f"driver{ranks}.py"
    path.write_text(script)
    cmd = [sys.executable, str(path)] if ranks == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
         "--standalone", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def _same(rows, ref) -> bool:
    """Equal rows, the computed numbers to 1e-6 relative (another forward length sums in
    another order)."""
    assert len(rows) == len(ref)
    for a, b in zip(rows, ref):
        assert {k: v for k, v in a.items() if k not in NUMBERS} == \
            {k: v for k, v in b.items() if k not in NUMBERS}
        for k in NUMBERS & set(a):
            if b[k] is None:
                assert a[k] is None, k
            else:
                assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-4 if "ratio" in k else 0), k
    return True


def _rows(path):
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in read_rows(path)]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    tiny_model().save_pretrained(root / "model")
    char_tokenizer().save_pretrained(root / "model")
    lines = [json.dumps({"text": ("To be, or not to be, that is the question. " * 12)[:n]})
             for n in (500, 300)]
    (root / "docs.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.slow
def test_two_ranks_write_the_single_process_results_and_resume(assets, tmp_path):
    model, data = assets / "model", assets / "docs.jsonl"
    single = [_argv("eval", model, tmp_path / "one", data, "32,64,128"),
              _argv("passkey", model, tmp_path / "pk1", data, "400,500")]
    # Two ranks: a first run over part of the grid, then --resume over all of it.
    double = [_argv("eval", model, tmp_path / "two", data, "32,64"),
              _argv("eval", model, tmp_path / "two", data, "32,64,128") + ["--resume"],
              _argv("passkey", model, tmp_path / "pk2", data, "400,500")]
    _launch(_driver(single), tmp_path, 1)
    log = _launch(_driver(double), tmp_path, 2)
    # Both ranks computed cells, in every run.
    assert log.count("rank 0/2: computing") == 3 and log.count("rank 1/2: computing") == 3
    assert "rank 1/2: computing 0 of" not in log
    one, two = _rows(tmp_path / "one" / "perplexity.json"), _rows(tmp_path / "two" / "perplexity.json")
    assert len(one) == 13 and _same(two, one)
    assert _rows(tmp_path / "pk2" / "passkey.json") == _rows(tmp_path / "pk1" / "passkey.json")
    # Only rank 0 wrote: no stray temporary or per-rank files.
    assert sorted(p.name for p in (tmp_path / "two").iterdir() if not p.name.startswith(".")) == \
        ["perplexity.csv", "perplexity.json", "summary.json", "summary.md"]

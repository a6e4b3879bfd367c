"""benchmarks/needle_diagnosis.py as a command: its smoke run (a tiny random Llama) writes a row per
trial and the report, a rerun skips the cells done (and redoes them for new weights), and a bad
input is one error line before any model loads. Subprocesses importing torch: slow."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "needle_diagnosis.py"
pytestmark = pytest.mark.slow


def run(*argv, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_smoke_rows_report_resume_and_bad_inputs(tmp_path):
    out = tmp_path / "out"
    first = run("--smoke", "--out", out, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").open()]
    assert len(rows) == 4 and {r["task"] for r in rows} == {"single_needle", "niah_single"}   # 2 tasks x 2 seeds
    assert all(len(r["needle_mass"]) == 2 and r["needle_span"][1] - r["needle_span"][0]
               == r["control_span"][1] - r["control_span"][0] for r in rows)
    report = (out / "report.md").read_text()
    assert report.count("| tiny | 512 |") == 2 and "0/2" in report
    again = run("--smoke", "--out", out, cwd=tmp_path)     # every cell done: nothing recomputed
    assert again.returncode == 0 and "trials" not in again.stdout
    assert len((out / "rows.jsonl").read_text().splitlines()) == 4
    tiny = out / "smoke-model"
    more = run("--arms", f"tiny={tiny}", "--lengths", 512, "--depths", 0.5, "--seeds", "0,1,2", "--out", out,
               cwd=tmp_path)                                # a seed added: only it is probed, once a cell
    assert more.returncode == 0 and more.stdout.count(": 1 trials") == 2, more.stderr[-2000:]
    added = [json.loads(line) for line in (out / "rows.jsonl").open()][4:]
    assert sorted((r["task"], r["seed"]) for r in added) == [("niah_single", 2), ("single_needle", 2)]
    weights = next(tiny.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))   # "retrained"
    third = run("--smoke", "--out", out, cwd=tmp_path)
    assert third.returncode == 0 and third.stdout.count("trials") == 2          # both cells again
    assert len((out / "rows.jsonl").read_text().splitlines()) == 10
    assert (out / "report.md").read_text().count("| tiny | 512 |") == 2        # the new weights' rows only
    for argv, says in [(["--arms", f"x={tmp_path}/nowhere"], "no config.json"),
                       (["--arms", tiny, "--lengths", 4096], "past what arm smoke-model allows"),
                       (["--arms", tiny, "--tasks", "needle_in_a_box"], "unknown retrieval task"),
                       (["--arms", tiny, "--depths", 1.5], "depth"),
                       (["--arms", tiny, "--lengths", 64], "too short"),
                       (["--arms", f"a={tiny},a={tiny}"], "distinct labels")]:
        proc = run(*argv, "--out", tmp_path / "bad", cwd=tmp_path)
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert proc.returncode == 2 and len(errors) == 1 and says in errors[0], proc.stderr[-1500:]
        assert "Traceback" not in proc.stderr and not (tmp_path / "bad" / "rows.jsonl").exists()

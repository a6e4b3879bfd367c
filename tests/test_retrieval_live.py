"""The sequential run against the fixed design (hf_posext/evaluation/retrieval/designs.py, which
benchmarks/retrieval_live.py runs): the two command lines, the calls and the report, live and from
stored rows. Answers come from a stub (right or wrong by method and length), so the trials each
design runs and the calls follow from the rule's closed-form bounds, worked by hand below. The
script itself is run through its command line, on a tiny model."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _evalkit import TINY, char_tokenizer
from hf_posext import cli
from hf_posext.evaluation.retrieval.designs import (against_report, check_designs, design_commands,
                                                    fixed_estimate, live_report, same_text, without_rule)
from hf_posext.patcher import is_patched

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "retrieval_live.py"
COMMAND = "python benchmarks/retrieval_live.py"
RIGHT = {("none", 1): True, ("yarn", 1): True, ("none", 2): False, ("yarn", 2): True}


def stub(model, tokenizer, cell, reuse_prefix):
    size = round(len(cell.prompt(0)) / 700)
    right = RIGHT["yarn" if is_patched(model) else "none", size]
    return [(", ".join(t.answers) if right else "no idea") + f" (seed {t.seed})" for t in cell.trials]


def tiny_checkpoint(tmp_path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM
    path = tmp_path / "tiny"
    LlamaForCausalLM(LlamaConfig(**{**TINY, "max_position_embeddings": 1024})).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def stubbed(monkeypatch):
    from hf_posext.evaluation.retrieval import run, schedule
    monkeypatch.setattr(run, "answer_cell", stub)        # the fixed design's answers
    monkeypatch.setattr(schedule, "answer_cell", stub)   # the sequential looks'


@pytest.mark.parametrize("common, look, trials, says", [
    (["--trials", "4"], 4, 20, "--trials after `--`"),
    (["--look", "2"], 4, 20, "--look after `--`"),
    (["--out=x"], 4, 20, "--out after `--`"),
    ([], 3, 8, "--trials 8 is not a whole number of looks of --look 3"),
    ([], 0, 20, "need 1 <= look <= trials"),
    ([], 8, 4, "--trials 4 --look 8: need 1 <= look <= trials"),
    (["--dtype", "auto"], 4, 20, "--dtype auto after `--`"),
    (["--dtype=auto"], 4, 20, "--dtype auto after `--`"),
])
def test_bad_settings_are_refused(common, look, trials, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        check_designs(common, look, trials)


def test_live_run_trials_calls_and_report(tmp_path, stubbed):
    path, out = tiny_checkpoint(tmp_path), tmp_path / "live"
    common = ["--model", str(path), "--lengths", "700,1400", "--methods", "yarn", "--factor", "2",
              "--depths", "0,1", "--margin", "0.4", "--confidence", "0.9", "--boundary", "bonferroni"]
    commands = design_commands(common, 4, 8, out)   # looks of 4, at most 8 a cell; the fixed design 8
    assert commands["sequential"][-8:-3] == ["--trials", "8", "--look", "4", "--out"]
    assert commands["fixed"][-6:-3] == ["--trials", "8", "--out"]
    assert commands["fixed"][:commands["fixed"].index("--trials")] == ["retrieval", *common[:-4]]   # no rule
    for argv in commands.values():   # as the script runs them
        assert cli.main(argv) == 0
    text = live_report(out, f"{COMMAND} --out {out}", {}, 0.4)
    table = {tuple(c.strip() for c in line.split("|")[1:4]): [c.strip() for c in line.split("|")[4:12]]
             for line in text.splitlines() if line.startswith("| single_needle")}
    # bar = 16/16 - 0.4 = 0.6; Bonferroni 0.1 / 2 looks = 0.05 a look: 8/8 has lower bound
    # 0.05^(1/8) = 0.69 >= 0.6 (above after one look of 4 trials x 2 depths), 0/8 upper bound
    # 1 - 0.69 = 0.31 < 0.6 (below); the fixed design runs 8 x 2 depths a cell
    ref = table["single_needle", "none s=1", "700"]
    assert (ref[0], ref[2], ref[3], ref[5]) == ("16", "reference", "16", "reference")   # in full in both
    for (method, length), call in {("yarn s=2", "700"): "above", ("yarn s=2", "1400"): "above",
                                   ("none s=1", "1400"): "below"}.items():
        seq_n, _, seq_call, fix_n, _, fix_call, same, said = table["single_needle", method, length]
        assert (seq_n, seq_call, fix_n, fix_call, same, said) == ("8", call, "16", f"{call} (0.60)", "yes", "8/8")
    total = next(line for line in text.splitlines() if line.startswith("| all"))
    assert "**40** (62%)" in total and "| 64 |" in total      # 16 + 3 x 8 of 16 + 3 x 16
    assert total.endswith("| 40/40 |")                       # every trial both ran, by (depth, seed)
    assert f"Made by `{COMMAND} --out {out}`" in text and "resumed: see the rows' seconds" in text
    seq_rows = [{"depth": 0.0, "seeds_list": "0,1", "outputs": ["a", "b"]}, {"depth": 1.0, "seeds_list": "0", "outputs": ["c"]}]
    fix_rows = [{"depth": 0.0, "seeds_list": "0,1,2", "outputs": ["a", "x", "y"]}, {"depth": 1.0, "seeds_list": "0", "outputs": ["c"]}]
    assert same_text(seq_rows, fix_rows) == (2, 3)           # seed 1 at depth 0 differs
    assert without_rule(["--confidence", "0.9", "--lengths", "8k", "--boundary=exact"]) == ["--lengths", "8k"]


def test_against_reports_a_stored_sequential_run(tmp_path, stubbed):
    """A sequential run stored by the CLI, reported against stored fixed rows without running
    anything; the margin and --trials (the run's most) must be the run's own."""
    path = tiny_checkpoint(tmp_path)
    grid = ["--model", str(path), "--lengths", "700,1400", "--methods", "yarn", "--factor", "2", "--depths", "0,1",
            "--margin", "0.4", "--no-plot", "--no-progress"]
    out, fixed = tmp_path / "seq", tmp_path / "fixed"
    # the "committed" rows: 4 trials a depth; the sequential run: looks of 2, at most 8, with a budget of 12 trials then resumed
    assert cli.main(["retrieval", *grid, "--trials", "4", "--out", str(fixed)]) == 0
    seq = [*grid, "--sequential", "--trials", "8", "--look", "2", "--confidence", "0.9", "--out", str(out / "sequential")]
    assert cli.main(["retrieval", *seq, "--budget", "12"]) == 0
    assert cli.main(["retrieval", *seq, "--resume"]) == 0
    with pytest.raises(ValueError, match="not the margin 0.1: pass `-- --margin 0.4000`"):
        against_report(out, fixed, 8, COMMAND, 0.1)
    with pytest.raises(ValueError, match="run with --trials \\[8\\] \\(its most\\), not 20"):
        against_report(out, fixed, 20, COMMAND, 0.4)
    text = against_report(out, fixed, 8, COMMAND, 0.4)
    assert "lengths <= 1024) run in full" in text and "{" not in text
    table = {tuple(c.strip() for c in line.split("|")[1:4]): [c.strip() for c in line.split("|")[4:12]]
             for line in text.splitlines() if line.startswith("| single_needle")}
    assert table["single_needle", "none s=1", "700"][:4] == ["16", table["single_needle", "none s=1", "700"][1],
                                                             "reference", "8"]
    # bar 0.6; 0.9 exact over 4 looks of 2 trials x 2 depths: all-right or all-wrong cells stop early, well before 16
    for (method, length), call in {("yarn s=2", "700"): "above", ("yarn s=2", "1400"): "above",
                                   ("none s=1", "1400"): "below"}.items():
        seq_n, secs, seq_call, stored_n, stored_call, same, full, est = table["single_needle", method, length]
        assert (seq_call, stored_n, stored_call, same, full) == (call, "8", f"{call} (0.60)", "yes", "16")
        assert int(seq_n) < 16 and float(est) == pytest.approx(float(secs) / int(seq_n) * 16, abs=0.6)
    assert "| 64 |" in next(line for line in text.splitlines() if line.startswith("| all"))
    assert ("single_needle: the sequential run's reference 16/16, bar 0.60; the stored run's reference 8/8, "
            "bar 0.60 (margin 0.4)") in text


def test_the_fixed_designs_time_from_the_looks():
    """The first look as run (it prefilled the prefix, once, as the fixed design does), then every
    further trial at the cheapest look's pace; one look: that look's pace throughout."""
    rows = [{"look": 1, "trials": 4, "seconds": 47.6}, {"look": 1, "trials": 16, "seconds": 190.4},   # 238 s, 2 depths
            {"look": 2, "trials": 20, "seconds": 243.0}, {"look": 3, "trials": 20, "seconds": 219.0}]
    assert fixed_estimate(rows, 100) == pytest.approx(238.0 + 80 * 219.0 / 20)
    assert fixed_estimate(rows[:2], 100) == pytest.approx(238.0 * 5)
    assert fixed_estimate([], 100) == 0.0


def run_script(*argv: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=600)


@pytest.mark.slow
def test_the_script_runs_both_designs_then_reports_them_against_each_other(tmp_path):
    """`python benchmarks/retrieval_live.py` on a tiny random model: both designs live and their
    report; a second run without --resume refused, as are the script's own flags after `--`; then
    the stored sequential run reported against the fixed rows (`--against`, in a folder of its own)."""
    import shutil
    path, out = tiny_checkpoint(tmp_path), tmp_path / "live"
    common = ["--", "--model", str(path), "--lengths", "700,1400", "--methods", "yarn", "--factor", "2",
              "--depths", "0.5", "--dtype", "float32"]
    live = run_script("--out", str(out), "--trials", "4", "--look", "2", *common)
    assert live.returncode == 0, live.stderr
    text = (out / "report.md").read_text()
    assert "# Sequential trials against the fixed design, live" in text and "| single_needle | yarn s=2 | 1400 |" in text
    assert (out / "sequential" / "retrieval.json").is_file() and (out / "fixed" / "retrieval.json").is_file()
    again = run_script("--out", str(out), *common)
    assert again.returncode == 2 and "already holds runs" in again.stderr
    own = run_script("--out", str(tmp_path / "other"), *common, "--trials", "4")
    assert own.returncode == 2 and "--trials after `--`" in own.stderr
    mixed = run_script("--out", str(out), "--against", str(out / "fixed"), "--trials", "4")
    assert mixed.returncode == 2 and "holds a live comparison" in mixed.stderr
    shutil.copytree(out / "sequential", tmp_path / "stored" / "sequential")
    stored = run_script("--out", str(tmp_path / "stored"), "--against", str(out / "fixed"), "--trials", "4")
    old = run_script("--out", str(tmp_path / "old"), "--trials", "2", "--max-trials", "4", *common)
    assert old.returncode == 2 and "--max-trials is no longer a flag; use --trials" in old.stderr
    assert stored.returncode == 0, stored.stderr
    assert "# A stored sequential run against stored fixed-design rows" in (tmp_path / "stored" / "report.md").read_text()

"""One meaning of `--trials` for retrieval: a depth cell's most trials in both designs (the fixed
design runs all of them), `--look` the trials a depth per look of a sequential run; the old
`--max-trials` refused in one line naming both, so an old command fails instead of silently
meaning something else. Checked on the parsed flags (`retrieval_plan.plan_from`), the command
(nothing loads), and the benchmark scripts that take the same flags."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hf_posext.cli as cli
from hf_posext.commands import retrieval_plan
from hf_posext.evaluation.retrieval.schedule import SequentialResult, plan_text
from hf_posext.evaluation.retrieval.sequential import DEFAULT_LOOK, SequentialRule
from hf_posext.evaluation.retrieval.settings import DEFAULT_TRIALS
from hf_posext.evaluation.shared.inputs import InputError

ROOT = Path(__file__).resolve().parents[1]


def plan(*flags: str):
    return retrieval_plan.plan_from(cli.build_parser().parse_args(["retrieval", *flags]))


def test_trials_is_a_cells_most_and_look_the_trials_per_look():
    trials, p = plan("--trials", "20", "--look", "4", "--sequential")
    assert trials == 20 and p is not None
    assert (p.rule.look, p.rule.max_trials, p.rule.looks) == (4, 20, 5)
    assert p.rule.look_seeds(0, 1) == [0, 1, 2, 3] and p.rule.look_seeds(0, 5) == [16, 17, 18, 19]
    # the defaults: 20 a cell in both designs, looks of DEFAULT_LOOK
    assert plan()[0] == plan("--sequential")[0] == DEFAULT_TRIALS == 20
    assert plan("--budget", "30m")[1].rule == SequentialRule(DEFAULT_LOOK, DEFAULT_TRIALS)
    # a --trials that is not a whole number of looks: the last look is shorter (as before)
    _, p = plan("--sequential", "--trials", "10", "--look", "4")
    assert p.rule.looks == 3 and p.rule.look_seeds(0, 3) == [8, 9]


def test_the_fixed_design_is_unchanged():
    assert plan("--trials", "5") == (5, None)
    from hf_posext.commands.retrieval import retrieval_grid
    args = cli.build_parser().parse_args(["retrieval", "--trials", "5", "--lengths", "800"])
    trials, _ = retrieval_plan.plan_from(args)
    assert retrieval_grid(args, trials).trial_seeds() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("flags, message", [
    (["--look", "4"], "--look is for sequential trials; add --sequential (or --budget)."),
    (["--sequential", "--trials", "4", "--look", "8"],
     "--look 8 is more than --trials 4 (a cell's most); lower --look or raise --trials."),
    (["--budget", "10", "--trials", "3"], "--look 4 (the default) is more than --trials 3"),
    (["--sequential", "--trials", "0"], "--trials (a cell's most) must be at least 1, got 0."),
    # the old spelling's `--sequential --trials 4` (looks of 4 up to 20) would now be one look
    (["--sequential", "--trials", "4"], "--trials 4 with --look 4 is one look: a sequential run needs two or more"),
    (["--budget", "30m", "--trials", "8", "--look", "8"], "raise --trials (a cell's most, e.g. 20) or drop --sequential"),
])
def test_bad_look_settings_name_the_flag(flags, message):
    with pytest.raises(InputError) as error:
        plan(*flags)
    assert message in str(error.value)


@pytest.mark.parametrize("argv", [
    ["--trials", "4", "--max-trials", "20", "--sequential"],   # an old command: 4 a look, 20 a cell
    ["--sequential", "--max-trials", "8"],
    ["--max-trials=8"],
])
def test_max_trials_is_refused_in_one_line_naming_trials_and_look(argv, tmp_path, capsys, monkeypatch):
    from hf_posext.commands import model_args
    monkeypatch.setattr(model_args, "load_model_from", lambda args: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["retrieval", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert "--max-trials is no longer a flag; use --trials for a cell's most trials" in err
    assert "--look for the trials per look" in err
    assert not (tmp_path / "o").exists()


def test_help_shows_look_not_the_old_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["retrieval", "--help"])
    text = capsys.readouterr().out
    assert "--look" in text and "max-trials" not in text


def test_the_plan_line_reads_in_the_flags_words():
    rule = SequentialRule(look=4, max_trials=20)
    text = plan_text(SequentialResult([], [], {}, rule), None)
    assert text.startswith("sequential: looks of 4 trial(s) at each depth (--look), at most 20 a depth "
                           "(--trials; 5 looks)")


def run_script(name: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *argv], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("name, argv", [
    ("retrieval_live", ["--out", "x", "--trials", "4", "--max-trials", "20"]),
    ("retrieval_sequential", ["--max-trials", "20"]),
    ("retrieval_sequential", ["--block", "4"]),
    ("finetune_retrieval", ["--sequential", "--trials", "4", "--max-trials", "20"]),
])
def test_the_scripts_refuse_the_old_spelling(name, argv):
    """The benchmark scripts that take these flags refuse the old ones as the command does."""
    done = run_script(name, *argv)
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert "is no longer a flag; use --" in err and "--look" in err

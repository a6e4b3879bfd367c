"""`hf-posext lm-eval --model hf-posext-vllm`: the model_args become lm-eval's `vllm` ones with
the max_model_len and --hf-overrides `hf-posext serve --engine vllm` prints; what vLLM does not run
exactly is refused in one line before anything loads; without vLLM here, the command re-runs
itself in vLLM's Python ($HF_POSEXT_VLLM_PYTHON) with this checkout first on its path. lm-eval
on the real vLLM: tests/engines/test_retrieval_engines.py."""

import json
import os
import shlex
import stat
from pathlib import Path

import pytest

import hf_posext.cli as cli
from _evalkit import tiny_checkpoint

pytest.importorskip("lm_eval")
from hf_posext.evaluation.integrations.harness_vllm import vllm_model_args  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def serve_line(capsys, *argv) -> list[str]:
    assert cli.main(["serve", *argv, "--engine", "vllm"]) == 0
    return shlex.split(capsys.readouterr().out.strip())


def test_model_args_are_serves(tiny_dir, capsys):
    line = serve_line(capsys, str(tiny_dir), "--method", "yarn", "--factor", "4")
    # lm-eval's VLLM takes tensor_parallel_size / data_parallel_size itself (its DP: ray workers)
    got = vllm_model_args({"pretrained": str(tiny_dir), "method": "yarn", "factor": 4,
                           "dtype": "float32", "enforce_eager": True, "tensor_parallel_size": 2,
                           "data_parallel_size": 2})
    assert got == {"pretrained": str(tiny_dir), "dtype": "float32", "enforce_eager": True,
                   "tensor_parallel_size": 2, "data_parallel_size": 2,
                   "max_model_len": int(line[line.index("--max-model-len") + 1]),
                   "hf_overrides": json.loads(line[line.index("--hf-overrides") + 1])}
    # factor auto: s = max_length / L (64), as the `hf-posext` type reads it
    assert vllm_model_args({"pretrained": str(tiny_dir), "method": "yarn", "factor": "auto",
                            "max_length": 256})["max_model_len"] == 256
    # no method: the checkpoint as saved (its own length, no override)
    line = serve_line(capsys, str(tiny_dir))
    assert vllm_model_args({"pretrained": str(tiny_dir)}) == {
        "pretrained": str(tiny_dir), "max_model_len": int(line[line.index("--max-model-len") + 1])}


@pytest.mark.parametrize("model_args, message", [
    ("method=dynamic_ntk,factor=4", "vLLM does not run dynamic_ntk exactly: vLLM"),
    ("method=dual_chunk,factor=4", "reads no attention method"),
    ("method=yarn,factor=auto", "factor=auto needs max_length=N"),
    ("method=yarn,factor=2,max_length=1024", "max_length=1024 is past the 128 tokens"),
    ("method=yarn,factor=2,max_model_len=128", "max_model_len is what `hf-posext serve` derives"),
])
def test_refused_before_anything_loads(tiny_dir, model_args, message, capsys, monkeypatch):
    monkeypatch.setenv("HF_POSEXT_VLLM_PYTHON", "/no/such/python")
    with pytest.raises(SystemExit) as exc:
        cli.main(["lm-eval", "--model", "hf-posext-vllm", "--model_args",
                  f"pretrained={tiny_dir},{model_args}", "--tasks", "tiny_gen"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_runs_in_vllms_python(tiny_dir, tmp_path, monkeypatch):
    """Without vLLM here: the same command in $HF_POSEXT_VLLM_PYTHON, pretrained the folder,
    this checkout first on PYTHONPATH (a stand-in python records what it was given)."""
    record = tmp_path / "called.json"
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$PYTHONPATH\" \"$@\" > " + str(record) + "\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("HF_POSEXT_VLLM_PYTHON", str(fake))
    code = cli.main(["lm-eval", "--model", "hf-posext-vllm", "--model_args",
                     f"pretrained={tiny_dir},method=yarn,factor=4", "--tasks", "tiny_gen", "--limit", "2"])
    path, *argv = record.read_text().splitlines()
    assert code == 3                                  # its exit status is the command's
    assert path.split(os.pathsep)[0] == str(ROOT)
    assert argv[:4] == ["-m", "hf_posext.cli", "lm-eval", "--model"]
    assert json.loads(argv[argv.index("--model_args") + 1]) == {
        "pretrained": str(tiny_dir), "method": "yarn", "factor": 4}
    assert argv[-4:] == ["--tasks", "tiny_gen", "--limit", "2"]


def test_building_the_model_keeps_lm_evals_random_state():
    """lm-eval seeds `random`, builds the model, then RULER's samples from `random`: a model type
    that reseeds it (vLLM's seed) or draws from it must leave lm-eval's state, so both routes
    build the same prompts."""
    import random

    from hf_posext.evaluation.integrations.harness import lm_eval_random_state
    random.seed(0)
    expected = [random.random() for _ in range(3)]
    random.seed(0)
    with lm_eval_random_state():
        random.seed(1234)          # as vLLM's LLM(seed=...) does
        random.random()
    assert [random.random() for _ in range(3)] == expected

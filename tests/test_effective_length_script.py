"""benchmarks/effective_length_4x.py run as a command: bad input is refused in one line before any
model loads (the script's runs take an hour a cell, so a mistake must cost nothing)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _recipekit import ROOT

SCRIPT = ROOT / "benchmarks" / "effective_length_4x.py"


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_fine_tuned_arm_without_its_checkpoint_names_the_training_command():
    if (ROOT / "runs" / "cpu-smollm2-retrieval-4x" / "final").exists():
        pytest.skip("a trained 4x checkpoint is present in this checkout")
    done = run("run", "noise", "--method", "finetuned")
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert "no checkpoint at runs/cpu-smollm2-retrieval-4x/final" in error
    assert "recipes/cpu-smollm2-retrieval-4x.yaml" in error
    assert "Traceback" not in done.stderr and "+ hf-posext" not in done.stdout


def test_a_run_without_a_haystack_is_refused():
    done = run("run", "--method", "dpe")
    assert done.returncode == 2 and "run needs a haystack: noise, hamlet, code" in done.stderr

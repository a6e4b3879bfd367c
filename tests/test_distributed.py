"""Training with 2 ranks over gloo on the CPU, through accelerate's own launcher and
recipes/accelerate/cpu-ddp.yaml: the same examples, losses and weights as one rank with twice the
batch; every sequence used once per epoch across ranks; a run stopped mid-way (SIGTERM to rank 0
only) and resumed ends identical to an uninterrupted one; only rank 0 writes. One launch runs
the three 2-rank recipe runs in the same ranks, to keep this file fast."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _recipekit import (RECIPES, ROOT, SUBPROCESS_ENV, VENV_BIN, assert_same_run, checkpoint_steps,
                        final_weights, log_rows, make_assets, recipe_argv)
from hf_posext.training.data import epoch_order
from hf_posext.training.recipe import run
from hf_posext.training.recipe_config import parse_args
from hf_posext.evaluation.shared.record import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS, KILL_AT, SEQ = 11, 5, 64
COMMON = dict(training__seq_len=SEQ, training__max_steps=STEPS, training__save_every=4,
              training__warmup_steps=2, eval__enabled="false")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 2-rank launch (full run with evaluation, a run stopped at step 5, its resume) and the
    single-process references (batch 4; batch 2 x 2 accumulation steps)."""
    root = tmp_path_factory.mktemp("ddp")
    assets = make_assets(root / "assets", archs=("llama",))
    out = {name: root / name for name in ("full2", "cut2", "one4", "accum")}
    two = dict(COMMON, training__batch_size=2)
    jobs = [{"argv": recipe_argv(assets, out["full2"], **dict(two, eval__enabled="true"))},
            {"argv": recipe_argv(assets, out["cut2"], **two), "kill_rank0_at": KILL_AT},
            {"argv": recipe_argv(assets, out["cut2"], **two) + ["--resume"]}]
    reports = root / "reports"
    reports.mkdir()
    cmd = [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(RECIPES / "accelerate" / "cpu-ddp.yaml"),
           "--main_process_port", str(_free_port()), str(ROOT / "tests" / "_ddp_driver.py"),
           json.dumps(jobs), str(reports)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=SUBPROCESS_ENV)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg, _ = parse_args(recipe_argv(assets, out["one4"], **dict(COMMON, training__batch_size=4)))
    run(cfg)
    cfg, _ = parse_args(recipe_argv(assets, out["accum"], **dict(COMMON, training__batch_size=2,
                                                                  training__gradient_accumulation_steps=2)))
    run(cfg)
    ranks = [json.loads((reports / f"rank{r}.json").read_text()) for r in (0, 1)]
    return {"out": out, "ranks": ranks, "stdout": proc.stdout, "assets": assets}


@pytest.mark.slow
def test_two_ranks_really_ran(runs):
    for r, report in enumerate(runs["ranks"]):
        assert report["rank"] == r and report["world_size_env"] == 2
        assert report["jobs"][0]["world_size"] == 2 and report["jobs"][2]["world_size"] == 2


@pytest.mark.slow
def test_two_ranks_batch_b_equal_one_rank_batch_2b(runs):
    out = runs["out"]
    two, one = log_rows(out["full2"] / "train_log.csv"), log_rows(out["one4"] / "train_log.csv")
    assert len(two) == len(one) == STEPS
    for a, b in zip(two, one):
        assert (a["step"], a["lr"], a["tokens"]) == (b["step"], b["lr"], b["tokens"])
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-5)
        assert float(a["grad_norm"]) == pytest.approx(float(b["grad_norm"]), rel=1e-4)
    w2, w1 = final_weights(out["full2"]), final_weights(out["one4"])
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=k)
    start = load_file(str(runs["assets"] / "llama" / "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (w1[q] - start[q]).abs().max() > 1e-3       # the weights did move: the check can fail


def test_accumulation_equals_the_larger_batch(runs):
    """batch 2 x 2 micro-batches (accelerator.accumulate) = batch 4 in one step."""
    out = runs["out"]
    for a, b in zip(log_rows(out["accum"] / "train_log.csv"), log_rows(out["one4"] / "train_log.csv")):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-5)
    w, w1 = final_weights(out["accum"]), final_weights(out["one4"])
    for k in w1:
        torch.testing.assert_close(w[k], w1[k], rtol=1e-4, atol=1e-5, msg=k)


def test_every_sequence_used_once_per_epoch_across_ranks(runs):
    per_rank = [report["jobs"][0]["batches"] for report in runs["ranks"]]
    seen = {}   # global index -> (rank, sequence row)
    for rank, batches in enumerate(per_rank):
        assert len(batches) == STEPS
        for indices, rows in batches:
            assert len(indices) == 2
            for i, r in zip(indices, rows):
                assert i not in seen, f"example {i} used by ranks {seen[i][0]} and {rank}"
                seen[i] = (rank, r)
    assert sorted(seen) == list(range(4 * STEPS))          # no gap, no repeat across ranks
    # the number of packed sequences: 7 training documents x (400 tokens + EOS + BOS) // SEQ
    n = (7 * 402) // SEQ
    first_epoch = [seen[i][1] for i in range(n)]
    assert sorted(first_epoch) == list(range(n))          # each sequence exactly once
    assert first_epoch == epoch_order(n, 0, 0)            # in the seeded shuffled order
    assert {seen[i][0] for i in range(0, 4 * STEPS, 4)} == {0} and seen[2][0] == 1


def test_stopped_two_rank_run_resumes_identical(runs):
    """SIGTERM reached rank 0 only, at step 5: both ranks stopped at step 5 (a collective decision),
    saved, and the resumed run ends exactly where the uninterrupted one did."""
    cut_jobs = [report["jobs"][1] for report in runs["ranks"]]
    assert [j["code"] for j in cut_jobs] == [143, 143]
    assert [len(j["batches"]) for j in cut_jobs] == [KILL_AT, KILL_AT]
    resumed = [report["jobs"][2]["batches"] for report in runs["ranks"]]
    assert [len(b) for b in resumed] == [STEPS - KILL_AT] * 2
    assert list(checkpoint_steps(runs["out"]["cut2"]).values())[-1] == STEPS
    assert_same_run(runs["out"]["full2"], runs["out"]["cut2"])


def test_only_rank_0_writes_model_logs_and_results(runs):
    full = runs["out"]["full2"]
    # checkpoints are written into checkpoints/.partial_checkpoint_<i>, then renamed (atomic save)
    w0 = {Path(p).relative_to(full).as_posix().replace(".partial_checkpoint_", "checkpoint_")
          for p in runs["ranks"][0]["writes"] if p.startswith(str(full))}
    kept = list((full / "checkpoints").glob("checkpoint_*"))
    assert kept and all((ck / "manifest.json").is_file() for ck in kept)
    assert not list((full / "checkpoints").glob(".partial_*"))
    w1 = [p for p in runs["ranks"][1]["writes"] if p.startswith(str(full.parent))]
    for name in ("train_log.csv", "config.json", "final/model.safetensors", "final/tokenizer_config.json",
                 "final/config.json", "checkpoints/checkpoint_0/model.safetensors", "loss_curve.png"):
        assert name in w0, sorted(w0)
    assert any(p.startswith("eval/") and "results.json" in p for p in w0), sorted(w0)
    # rank 1 writes only its own RNG state into each checkpoint (accelerate's random_states_1.pkl)
    assert w1 and all(Path(p).name == "random_states_1.pkl" for p in w1), sorted(set(w1))
    results = read_rows(full / "eval" / "results.json")
    assert len(results) == 6 and len(log_rows(full / "train_log.csv")) == STEPS

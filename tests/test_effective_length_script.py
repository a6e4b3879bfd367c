"""benchmarks/effective_length_4x.py run as a command: bad input is refused in one line before any
model loads (the script's runs take an hour a cell, so a mistake must cost nothing)."""

from __future__ import annotations

import dataclasses
import re
import shlex
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


def test_a_second_seed_without_its_checkpoint_names_its_own_training_command():
    if (ROOT / "runs" / "cpu-smollm2-retrieval-4x-seed1" / "final").exists():
        pytest.skip("a trained seed-1 checkpoint is present in this checkout")
    for argv in (("run", "noise", "--method", "finetuned", "--seed", "1", "--task", "multi_key"), ("perplexity", "--seed", "1")):
        done = run(*argv)
        assert done.returncode == 2, argv
        error = done.stderr.strip().splitlines()[-1]
        assert "no checkpoint at runs/cpu-smollm2-retrieval-4x-seed1/final" in error
        assert "--training.seed 1 --output_dir runs/cpu-smollm2-retrieval-4x-seed1" in error
        assert "+ hf-posext" not in done.stdout


def test_the_distractor_arm_without_its_checkpoint_names_its_training_command():
    if (ROOT / "runs" / "cpu-smollm2-retrieval-4x-distractors" / "final").exists():
        pytest.skip("a checkpoint of the distractor mix is present in this checkout")
    done = run("run", "noise", "--method", "finetuned-distractors", "--task", "multi_key")
    assert done.returncode == 2 and "+ hf-posext" not in done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert "no checkpoint at runs/cpu-smollm2-retrieval-4x-distractors/final" in error
    assert ("recipes/cpu-smollm2-retrieval-4x.yaml --training.seq_len 1024 --training.max_steps 200 "
            "--data.synthetic.window null --data.synthetic.share 0.25 --data.synthetic.distractors 3 "
            "--output_dir runs/cpu-smollm2-retrieval-4x-distractors`") in error


def test_the_documents_control_without_its_checkpoint_names_its_training_command():
    """The perplexity control (the recipe without its mix) has its own folder and command."""
    if (ROOT / "runs" / "cpu-smollm2-retrieval-4x-documents" / "final").exists():
        pytest.skip("a checkpoint of the documents-only control is present in this checkout")
    done = run("perplexity", "--method", "finetuned-documents")
    assert done.returncode == 2 and "+ hf-posext" not in done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert "no checkpoint at runs/cpu-smollm2-retrieval-4x-documents/final" in error
    assert ("recipes/cpu-smollm2-retrieval-4x.yaml --training.seq_len 1024 --training.max_steps 200 "
            "--data.synthetic.window null --data.synthetic.share 0 "
            "--output_dir runs/cpu-smollm2-retrieval-4x-documents`") in error


@pytest.mark.parametrize("arm, folder", [("finetuned-1k-windows", "1k-windows"), ("finetuned-distractors", "distractors"),
                                         ("finetuned-documents", "documents"),
                                         ("finetuned-4k-windows", "4k-windows"),
                                         ("finetuned-4k-docs-1k-examples", "4k-docs-1k-examples"),
                                         ("finetuned-code", "code")])
def test_each_arms_printed_training_command_is_a_valid_recipe(arm, folder):
    """The command a missing checkpoint names must train that arm: the recipe's own parser and
    validation accept its flags, and the output folder is the one the script then reads."""
    if (ROOT / "runs" / f"cpu-smollm2-retrieval-4x-{folder}" / "final").exists():
        pytest.skip(f"a checkpoint of {arm} is present in this checkout")
    done = run("perplexity", "--method", arm)
    assert done.returncode == 2, done.stderr
    command = done.stderr.strip().splitlines()[-1].split("`")[1]
    assert command.startswith("accelerate launch --cpu --num_processes 1 recipes/finetune.py "), command
    from hf_posext.training.recipe_config import parse_args
    argv = shlex.split(command.split("recipes/finetune.py ", 1)[1])   # as a shell reads it (quoted lists)
    argv[argv.index("--config") + 1] = str(ROOT / argv[argv.index("--config") + 1])
    cfg, _ = parse_args(argv)
    assert cfg.output_dir == f"runs/cpu-smollm2-retrieval-4x-{folder}"
    if arm in ("finetuned-1k-windows", "finetuned-distractors", "finetuned-documents"):
        # the default before, as it trained: the 2x recipe of then (1k-token windows, a quarter
        # synthetic, whole examples, 200 steps) with its spans scaled to 4x (the two arms beside it
        # change one key of its mix)
        now, _ = parse_args(["--config", str(ROOT / "recipes" / "cpu-smollm2-retrieval.yaml")])
        two = dataclasses.replace(now, training=dataclasses.replace(now.training, seq_len=1024, max_steps=200, save_every=50))
        change = {"finetuned-1k-windows": {}, "finetuned-distractors": {"distractors": 3},
                  "finetuned-documents": {"share": 0.0}}[arm]
        mix = dataclasses.replace(two.data.synthetic, **{"share": 0.25, "window": None, **change})
        assert cfg.model == dataclasses.replace(two.model, factor=4.0)
        assert cfg.data == dataclasses.replace(two.data, synthetic=mix)
        assert (cfg.training, cfg.pose, cfg.lora) == (two.training, two.pose, two.lora)
    if arm == "finetuned-4k-windows":   # the same tokens as the 1k-window setting's 200 x 1,024
        assert (cfg.training.seq_len, cfg.training.max_steps, cfg.data.synthetic.share,
                cfg.data.synthetic.window) == (4096, 50, 0.5, None)
    if arm == "finetuned-code":   # the recipe with half its examples' haystacks code, nothing else changed
        now, _ = parse_args(["--config", str(ROOT / "recipes" / "cpu-smollm2-retrieval-4x.yaml")])
        mix = dataclasses.replace(now.data.synthetic, haystacks=["training", "embedded:python-stdlib"])
        assert cfg == dataclasses.replace(now, data=dataclasses.replace(now.data, synthetic=mix),
                                          output_dir="runs/cpu-smollm2-retrieval-4x-code")
    if arm == "finetuned-4k-docs-1k-examples":   # the 100-step 4k arm with only the examples cut to 1k
        assert (cfg.training.seq_len, cfg.training.max_steps, cfg.data.synthetic.share,
                cfg.data.synthetic.window) == (4096, 100, 0.5, 1024)


@pytest.mark.parametrize("argv, unread", [
    (("report", "--task", "multi_key"), "report does not read --task"),
    (("perplexity", "--method", "dpe"), "perplexity --method dpe: perplexity measures a fine-tuned checkpoint"),
    (("perplexity", "--method", "yarn"), "give one of finetuned, finetuned-1k-windows, finetuned-distractors"),
    (("reference", "code", "--seed", "2"), "reference does not read --seed"),
    (("run", "noise", "--method", "dpe", "--seed", "1"), "a seed names a fine-tuned checkpoint"),
    (("perplexity", "hamlet"), "perplexity reads held-out Hamlet only"),
    (("table", "noise"), "table reads every haystack's stored rows; give no haystack"),
    (("report", "--results", "elsewhere"), "report does not read --results"),
    (("perplexity", "--length", "16k"), "perplexity does not read --length"),
    (("perplexity", "--method", "self_extend-longlm", "--seed", "1"), "self_extend-longlm is training-free"),
    # a fixed grid runs to its end: a budget there would be ignored, so it is refused
    (("run", "noise", "--method", "baseline", "--budget", "1h"), "--budget 1h: `run --method baseline` at 32k asks a fixed grid"),
    (("run", "hamlet", "--method", "searched-needle", "--budget", "2h"), "asks a fixed grid of 2 needles a depth"),
    (("run", "code", "--length", "8k", "--budget", "1h"), "`run --method yarn` at 8k asks a fixed grid"),
    (("run", "noise", "--method", "baseline", "--length", "8k"), "the sliding baseline is the model's own window"),
])
def test_a_flag_the_step_does_not_read_is_refused(argv, unread):
    done = run(*argv)
    assert done.returncode == 2 and unread in done.stderr, done.stderr
    assert "+ hf-posext" not in done.stdout



def test_the_page_s_not_run_list_names_the_methods_and_the_shipped_recipe_not_the_arms():
    """The committed page (written by `report`) lists as not run only each training-free method's
    niah_single and the shipped recipe's cells; an arm tried beside the recipe (`finetuned-...`)
    is an experiment whose untried cells are not news."""
    page = (ROOT / "benchmarks" / "results" / "effective_length_4x.md").read_text()
    listed = next(line for line in page.splitlines() if line.startswith("Not run in this round: "))
    # each item is "<haystack label>: <name>"; a label may hold commas (the code haystack's), a name none
    names = re.findall(r": ([^:,]+?)(?=, |\.$)", listed.removeprefix("Not run in this round: "))
    assert len(names) == listed.count(": ") - 1, listed
    allowed = re.compile(r"^(yarn|dpe|self_extend|self_extend-longlm|baseline|searched-needle|searched-perplexity|finetuned( seed \d+)?( multi_key)?|finetuned at (8k|16k))$")
    assert names and all(allowed.match(n) for n in names), names


def test_the_page_shows_the_16k_runs_with_the_budget_they_ran_with():
    """The page prints each run's command from the script's own argv: the 16k runs ran with
    `--budget 30m` (the 16k default), the 32k ones with their haystack's (noise and Hamlet 40m)."""
    page = (ROOT / "benchmarks" / "results" / "effective_length_4x.md").read_text()
    sequential = [c for c in re.findall(r"hf-posext retrieval [^`\n]*--sequential[^`\n]*", page) if "-reference" not in c]
    at16 = {c for c in sequential if "--lengths 16k" in c}
    at32 = {c for c in sequential if "--lengths 32k" in c and "--dataset noise" in c}
    assert at16 and all("--budget 30m" in c for c in at16), at16
    assert at32 and all("--budget 40m" in c for c in at32), at32

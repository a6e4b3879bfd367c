"""The fine-tuning recipe (recipes/finetune.py) end to end on tiny random Llama and Mistral models
saved to a temp dir with a local character-level tokenizer: launch, save and reload, resume after
SIGTERM/SIGINT, gradient clipping, LoRA. Nothing touches the Hub. Config parsing: test_recipe_config.py;
the stages one by one: test_recipe_stages.py; several processes: test_distributed.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from _recipekit import (RECIPES, ROOT, SUBPROCESS_ENV, VENV_BIN, assert_same_run, checkpoint_steps,
                        final_weights, load_finetune, log_rows, logits, make_assets, recipe_argv)
from hf_posext.rope.compat import get_rope_parameters
from hf_posext.training.loop import LOG_COLUMNS
from hf_posext.training.model import apply_lora
from hf_posext.training.outputs import save_lora_model
from hf_posext.training.recipe_config import LoraConfig
from hf_posext.evaluation.shared.record import read_rows

finetune = load_finetune()
pytestmark = pytest.mark.usefixtures("one_thread")
_argv, _rows, _logits, _final_weights, _assert_same_run = recipe_argv, log_rows, logits, final_weights, \
    assert_same_run


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("recipe"))


# ------------------------------------------------------------------------------ launch and reload
@pytest.mark.slow
def test_accelerate_launch_trains_saves_and_evaluates(assets, tmp_path):
    out = tmp_path / "run"
    cmd = [str(VENV_BIN / "accelerate"), "launch", "--config_file",
           str(RECIPES / "accelerate" / "cpu.yaml"), str(RECIPES / "finetune.py"), *_argv(assets, out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=SUBPROCESS_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out / "train_log.csv", LOG_COLUMNS)
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert all(float(r["tokens_per_s"]) > 0 and float(r["memory_mb"]) > 0 for r in rows)
    # transformers' constant_with_warmup: lr x step/warmup during warm-up (step 0 at lr 0), then lr
    assert [float(r["lr"]) for r in rows] == pytest.approx([0.0, 5e-4, 1e-3, 1e-3])
    assert (out / "loss_curve.png").stat().st_size > 0
    model = AutoModelForCausalLM.from_pretrained(out / "final")   # plain transformers
    rope = get_rope_parameters(model.config)  # 5.x rope_parameters / 4.x rope_scaling
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0
    assert rope["original_max_position_embeddings"] == 64 and model.config.max_position_embeddings == 256
    results = read_rows(out / "eval" / "results.json")
    base = str(assets / "llama")
    assert sorted((r["model"], r["method"], r["length"]) for r in results) == [
        (base, "none", 64), (base, "none", 256),                   # the unpatched baseline
        (base, "yarn", 64), (base, "yarn", 256),                   # training-free YaRN s=4
        (f"{base} fine-tuned", "yarn fine-tuned", 64),             # the fine-tuned model as saved
        (f"{base} fine-tuned", "yarn fine-tuned", 256)]
    assert all(r["dataset"] == str(assets / "docs") for r in results)
    assert {r["finetune_steps"] for r in results if "fine-tuned" in r["model"]} == {4}
    assert (out / "eval" / "perplexity.png").stat().st_size > 0


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_checkpoint_reloads_with_rope_config_and_same_logits(assets, tmp_path, arch):
    out = tmp_path / arch
    result = finetune.main(_argv(assets, out, model=arch, eval__enabled="false"))
    trained = result["model"]
    reloaded = AutoModelForCausalLM.from_pretrained(out / "final")
    assert reloaded.config.model_type == arch
    assert get_rope_parameters(reloaded.config) == get_rope_parameters(trained.config)
    torch.testing.assert_close(_logits(reloaded), _logits(trained), rtol=0, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(assets / arch)
    assert not torch.allclose(_logits(base, 60), _logits(reloaded, 60), atol=1e-4)   # it trained
    # and the fine-tuned model's rotary frequencies are YaRN's, not the base model's
    rot = reloaded.model.rotary_emb
    assert not torch.equal(rot.inv_freq, base.model.rotary_emb.inv_freq)
    assert rot.attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)


# ------------------------------------------------------------------------------------- resume
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_resume_after_signal_matches_uninterrupted_run(assets, tmp_path, signum):
    over = dict(training__max_steps=7, training__save_every=3, training__gradient_accumulation_steps=2,
                training__batch_size=2, eval__enabled="false")
    full = tmp_path / "full"
    finetune.main(_argv(assets, full, **over))
    handler_before = signal.getsignal(signum)
    cut = tmp_path / "cut"

    def kill_at_4(step):            # a real signal, delivered to this process mid-run
        if step == 4:
            os.kill(os.getpid(), signum)

    with pytest.raises(SystemExit) as stop:
        finetune.main(_argv(assets, cut, **over), on_step=kill_at_4)
    assert stop.value.code == 128 + signum
    assert list(checkpoint_steps(cut).values())[-1] == 4   # saved at the signal, not at step 3
    assert len(_rows(cut / "train_log.csv")) == 4 and not (cut / "final").exists()
    with pytest.raises(ValueError, match="--resume"):  # never silently overwrite a run
        finetune.main(_argv(assets, cut, **over))
    finetune.main(_argv(assets, cut, **over) + ["--resume"])
    _assert_same_run(full, cut)
    assert signal.getsignal(signum) is handler_before      # the recipe's handler is uninstalled


@pytest.mark.slow
def test_sigterm_to_a_separate_process_then_resume(assets, tmp_path):
    """A real `kill -TERM` from outside, at whatever step the run has reached."""
    over = dict(training__max_steps=80, training__save_every=1000, training__seq_len=64,
                eval__enabled="false")
    full = tmp_path / "full"
    finetune.main(_argv(assets, full, **over))
    cut = tmp_path / "cut"
    cmd = [sys.executable, str(RECIPES / "finetune.py"), *_argv(assets, cut, **over)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=SUBPROCESS_ENV)
    log = cut / "train_log.csv"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) > 6:   # header + >= 6 steps
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    done = len(_rows(log))
    assert 6 <= done < 80 and list(checkpoint_steps(cut).values())[-1] == done
    resumed = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env=SUBPROCESS_ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _assert_same_run(full, cut)


def test_resume_refuses_a_changed_config(assets, tmp_path):
    out = tmp_path / "run"
    finetune.main(_argv(assets, out, eval__enabled="false"))
    with pytest.raises(ValueError, match=r"\['training.learning_rate'\] changed"):
        finetune.main(_argv(assets, out, eval__enabled="false", training__learning_rate="2e-3") + ["--resume"])


# ------------------------------------------------------------------------------------ clipping
def test_gradient_clipping_really_clips(assets, tmp_path):
    clip = tmp_path / "clip"
    finetune.main(_argv(assets, clip, training__max_grad_norm="1e-3", eval__enabled="false"))
    rows = _rows(clip / "train_log.csv", ["grad_norm", "grad_norm_clipped"])
    for r in rows:   # the norm measured independently after clipping is the limit
        assert float(r["grad_norm"]) > 1e-2
        assert float(r["grad_norm_clipped"]) == pytest.approx(1e-3, rel=1e-4)
    free = tmp_path / "free"
    finetune.main(_argv(assets, free, training__max_grad_norm="1e6", eval__enabled="false"))
    rows = _rows(free / "train_log.csv", ["grad_norm", "grad_norm_clipped"])
    assert rows[0]["grad_norm"] == _rows(clip / "train_log.csv", ["grad_norm"])[0]["grad_norm"]
    for r in rows:   # below the limit nothing changes
        assert float(r["grad_norm_clipped"]) == pytest.approx(float(r["grad_norm"]), rel=1e-5)


# ---------------------------------------------------------------------------------------- LoRA
def test_lora_merge_gives_the_unmerged_adapter_logits(assets, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(assets / "llama")
    base_logits = _logits(model)
    lora_cfg = LoraConfig(enabled=True, r=4, alpha=8)
    peft_model = apply_lora(model, lora_cfg)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable) and any("embed_tokens" in n for n in trainable)
    assert any(n.endswith("input_layernorm.weight") for n in trainable)
    assert not any("mlp" in n for n in trainable)            # only adapters, embeddings, norms
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():   # lora_B starts at zero; give the adapter a real effect
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    unmerged = _logits(peft_model)
    assert (unmerged - base_logits).abs().max() > 1e-2
    merged_model = save_lora_model(peft_model, tmp_path / "final")   # the recipe's one save site
    assert not any("lora" in n for n, _ in merged_model.named_parameters())
    torch.testing.assert_close(_logits(merged_model), unmerged, rtol=0, atol=1e-5)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    torch.testing.assert_close(_logits(reloaded), unmerged, rtol=0, atol=1e-5)


def test_lora_save_site_reloads_the_adapter_extended_through_peft(assets, tmp_path):
    """The recipe's save site also writes the adapter with hf_posext.save_adapter, so PEFT's
    one-liner brings it back on the *extended* base (plain peft would load the unextended one)."""
    from peft import AutoPeftModelForCausalLM

    import hf_posext
    model = hf_posext.from_pretrained(assets / "llama", "yarn", 2.0)
    peft_model = apply_lora(model, LoraConfig(enabled=True, r=4, alpha=8))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    unmerged = _logits(peft_model)
    save_lora_model(peft_model, tmp_path / "final")
    reloaded = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "final" / "adapter").eval()
    assert reloaded.get_base_model().model.rotary_emb.rope_type == "yarn"
    torch.testing.assert_close(_logits(reloaded), unmerged, rtol=0, atol=1e-5)


def test_recipe_with_lora_saves_a_merged_plain_checkpoint(assets, tmp_path):
    out = tmp_path / "lora"
    result = finetune.main(_argv(assets, out, lora__enabled="true", lora__r="4",
                                 training__learning_rate="1e-2", eval__enabled="false",
                                 training__gradient_checkpointing="true"))
    weights = _final_weights(out)
    assert not any("lora" in k for k in weights)
    base = load_file(str(assets / "llama" / "model.safetensors"))
    assert not torch.equal(weights["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert not torch.equal(weights["model.norm.weight"], base["model.norm.weight"])
    assert torch.equal(weights["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"])
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(weights[q], base[q])                 # the merged low-rank update
    assert torch.linalg.matrix_rank(weights[q] - base[q]).item() <= 4
    reloaded = AutoModelForCausalLM.from_pretrained(out / "final")
    torch.testing.assert_close(_logits(reloaded), _logits(result["model"]), rtol=0, atol=1e-5)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(x) for x in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and PR_SET_PDEATHSIG")
def test_sigterm_to_accelerate_launch_saves_and_resumes(assets, tmp_path):
    """`kill <accelerate launch pid>`: the launcher does not forward SIGTERM; the recipe asks the
    kernel for SIGTERM on its parent's death, so the run still saves its state and stops."""
    over = dict(training__max_steps=80, training__save_every=1000, training__seq_len=64,
                eval__enabled="false")
    full = tmp_path / "full"
    finetune.main(_argv(assets, full, **over))
    cut = tmp_path / "cut"
    cmd = [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(RECIPES / "accelerate" / "cpu.yaml"),
           str(RECIPES / "finetune.py"), *_argv(assets, cut, **over)]
    launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=SUBPROCESS_ENV)
    log = cut / "train_log.csv"
    deadline = time.time() + 120
    while time.time() < deadline and launcher.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) > 6:
            break
        time.sleep(0.01)
    workers = _children(launcher.pid)
    assert len(workers) == 1
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=60)
    deadline = time.time() + 120
    while _alive(workers[0]) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(workers[0])
    done = len(_rows(log))
    assert 6 <= done < 80 and list(checkpoint_steps(cut).values())[-1] == done
    assert not (cut / "final").exists()
    resumed = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env=SUBPROCESS_ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _assert_same_run(full, cut)

"""Adversarial inputs: each is one clear error naming the fix, before heavy work, and
leaves nothing written; the recipe never unpickles a file it did not write."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from _badinputs import counted_loads
from _recipekit import ROOT, SUBPROCESS_ENV, checkpoint_steps, load_finetune, make_assets, recipe_argv

import hf_posext
from hf_posext.errors import CheckpointError, ConfigError, TrainingDiverged

finetune = load_finetune()


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("bad"), archs=("llama",))


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "hf_posext.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=SUBPROCESS_ENV)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    return lines[0]


# ------------------------------------------------------------------------------ CLI / API
@pytest.mark.slow   # a subprocess, or the recipe trained
def test_eval_length_one_is_a_usage_error_before_loading(assets, tmp_path):
    out = tmp_path / "out"
    r = _cli("eval", "--model", str(assets / "llama"), "--lengths", "1", "--out", str(out))
    assert r.returncode == 2
    assert ">= 2" in _one_line(r.stderr) and "--debug" in r.stderr
    assert not out.exists()


@pytest.mark.slow   # a subprocess, or the recipe trained
def test_debug_shows_the_traceback(assets, tmp_path):
    r = _cli("eval", "--model", str(assets / "llama"), "--lengths", "1", "--debug", "--out", str(tmp_path / "o"))
    assert r.returncode != 0 and "Traceback" in r.stderr and "InputError" in r.stderr


def test_patch_with_no_method_is_refused():
    from conftest import tiny_model
    model = tiny_model()
    with pytest.raises(ConfigError, match="name a method.*unpatch"):
        hf_posext.patch(model, None, factor=2)
    assert not hf_posext.is_patched(model)


@pytest.mark.parametrize("method,knob", [("self_extend", {"group_size": "auto"}),
                                         ("leaky_rerope", {"leak": "auto"})])
def test_absurd_factor_with_auto_knob_is_refused_at_once(method, knob):
    from conftest import tiny_model
    with pytest.raises(ValueError, match="smaller factor"):
        hf_posext.patch(tiny_model(), method, factor=1e9, **knob)


def test_auto_group_size_is_the_smallest_that_fits():
    """Against the definition (Self-Extend, Jin et al. 2024 eq. 3: the farthest grouped position
    floor((T-1)/G) + W - W/G stays within L-1), searched from G = 1 here."""
    from hf_posext.attention.config import AttentionExtensionConfig
    for L, W, T in [(64, 8, 256), (64, 30, 1000), (512, 100, 40_000), (100, 1, 101)]:
        spec = AttentionExtensionConfig("self_extend", L, window=W, group_size="auto", target_length=T)
        g = spec.fitted("group_size")
        fits = [G for G in range(1, T + 1) if (T - 1) // G + W - W / G <= L - 1]
        assert g == fits[0]


# ------------------------------------------------------------------------------ recipe config
@pytest.mark.parametrize("over,match", [
    (dict(model__factor="0.5"), "factor must be >= 1"),
    (dict(training__weight_decay="-0.1"), "weight_decay must be a finite number >= 0"),
    (dict(training__learning_rate="nan"), "training.learning_rate.*nan"),
    (dict(training__learning_rate="inf"), "training.learning_rate.*inf"),
    (dict(training__max_grad_norm="nan"), "max_grad_norm"),
])
def test_bad_recipe_values_fail_before_the_model_loads(assets, tmp_path, over, match):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=match):
        finetune.main(recipe_argv(assets, out, **over))
    assert not out.exists()


def _no_lr(argv):
    i = argv.index("--training.learning_rate")
    return argv[:i] + argv[i + 2:]


@pytest.mark.parametrize("value", [".inf", ".nan", "-.inf"])
def test_non_finite_learning_rate_in_yaml(assets, tmp_path, value):
    cfg = tmp_path / "lr.yaml"
    cfg.write_text(f"training:\n  learning_rate: {value}\n")
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="learning_rate must be a finite number > 0"):
        finetune.main(["--config", str(cfg)] + _no_lr(recipe_argv(assets, out)))
    assert not out.exists()


@pytest.mark.slow   # a subprocess, or the recipe trained
def test_yaml_duplicate_key_and_syntax_error(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("training:\n  learning_rate: 1e-3\n  learning_rate: 1e-2\n")
    with pytest.raises(ConfigError, match=r"'learning_rate' is given twice \(line 3\); keep one"):
        finetune.main(["--config", str(dup)])
    broken = tmp_path / "broken.yaml"
    broken.write_text("training:\n  learning_rate: [1e-3\n")
    r = subprocess.run([sys.executable, str(ROOT / "recipes" / "finetune.py"), "--config", str(broken),
                        "--output_dir", str(tmp_path / "o")], capture_output=True, text=True,
                       timeout=120, env=SUBPROCESS_ENV)
    assert r.returncode == 2 and "not valid YAML" in _one_line(r.stderr) and "fix the syntax" in r.stderr
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------ recipe runs
@pytest.mark.slow   # a subprocess, or the recipe trained
def test_divergence_stops_and_keeps_the_last_good_checkpoint(assets, tmp_path):
    """lr 1e30 (finite, so the config accepts it) turns the weights to inf after the first step.
    The one case of the suite that is refused only after the weights load (the probe's "weak"):
    a diverging loss can only be seen while training, so the error comes at the step it happens,
    before anything non-finite is saved."""
    out = tmp_path / "run"
    argv = recipe_argv(assets, out, training__learning_rate="1e30", training__warmup_steps="0",
                       training__save_every="1", eval__enabled="false")
    with pytest.raises(TrainingDiverged, match="last good checkpoint is kept.*learning_rate"):
        finetune.main(argv)
    assert not (out / "final").exists()
    from safetensors.torch import load_file
    import torch
    for ck in (out / "checkpoints").glob("checkpoint_*"):   # only steps before the divergence
        assert all(torch.isfinite(t).all() for t in load_file(str(ck / "model.safetensors")).values())
    r = subprocess.run([sys.executable, str(ROOT / "recipes" / "finetune.py"),
                        *recipe_argv(assets, tmp_path / "cli", training__learning_rate="1e30",
                                     training__warmup_steps="0", eval__enabled="false")],
                       capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV)
    assert r.returncode == 1 and "diverged" in _one_line(r.stderr)


class _Plant:
    """A pickle that creates a file when unpickled."""
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def saved_run(assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("saved") / "run"
    finetune.main(recipe_argv(assets, out, training__max_steps="2", training__save_every="1",
                              eval__enabled="false"))
    return out


def _copy(run: Path, dest: Path) -> Path:
    import shutil
    shutil.copytree(run, dest)
    shutil.rmtree(dest / "final")
    return dest


@pytest.mark.slow   # a subprocess, or the recipe trained
def test_checkpoints_hold_no_pickle_of_the_recipe(saved_run):
    ck = sorted((saved_run / "checkpoints").glob("checkpoint_*"))[-1]
    assert not list(ck.glob("custom_checkpoint_*"))
    assert (ck / "manifest.json").is_file() and (ck / "recipe_state.json").is_file()
    assert not list((saved_run / "checkpoints").glob(".partial_*"))


@pytest.mark.slow   # a subprocess, or the recipe trained
@pytest.mark.parametrize("victim", ["custom_checkpoint_0.pkl", "custom_checkpoint_1.pkl", "optimizer.bin",
                                    "scheduler.bin", "random_states_0.pkl", "pytorch_model.bin", "sub/evil.pkl",
                                    "model.safetensors"])
def test_resume_never_runs_a_planted_pickle(assets, saved_run, tmp_path, victim):
    run = _copy(saved_run, tmp_path / "run")
    marker = tmp_path / "PWNED"
    ck = sorted((run / "checkpoints").glob("checkpoint_*"))[-1]
    (ck / victim).parent.mkdir(exist_ok=True)
    with open(ck / victim, "wb") as fh:
        pickle.dump(_Plant(marker), fh)
    argv = recipe_argv(assets, run, training__max_steps="2", training__save_every="1",
                       eval__enabled="false") + ["--resume"]
    with counted_loads() as loads, pytest.raises(
            CheckpointError, match=f"{ck.name}.*(did not write \\({victim}\\)|{victim} changed since)"):
        finetune.main(argv)
    assert loads == []      # refused before the model loads
    assert not marker.exists() and not (run / "final").exists()


def test_torch_safe_load_refuses_the_plant_even_without_the_manifest(tmp_path):
    """The second line of defence: what accelerate reads goes through weights_only=True."""
    import torch
    from accelerate.utils import load
    marker, f = tmp_path / "PWNED", tmp_path / "optimizer.bin"
    torch.save({"x": _Plant(marker)}, f)
    with pytest.raises(Exception, match="Weights only load failed"):
        load(f, weights_only=True)
    assert not marker.exists()


@pytest.mark.slow   # a subprocess, or the recipe trained
@pytest.mark.parametrize("damage,says", [
    ("truncate_optimizer", "optimizer.bin changed since.*delete"), ("delete_optimizer", "missing optimizer.bin; delete"),
    ("manifest", "manifest.json is corrupted.*delete"), ("no_manifest", "has no manifest.json"),
    ("recipe_state", "recipe_state.json changed since.*delete")])
def test_damaged_checkpoint_is_one_error_saying_what_to_delete(assets, saved_run, tmp_path, damage, says):
    run = _copy(saved_run, tmp_path / "run")
    ck = sorted((run / "checkpoints").glob("checkpoint_*"))[-1]
    if damage == "truncate_optimizer":
        (ck / "optimizer.bin").write_bytes((ck / "optimizer.bin").read_bytes()[:100])
    elif damage == "delete_optimizer":
        os.remove(ck / "optimizer.bin")
    elif damage == "manifest":
        (ck / "manifest.json").write_text("{not json")
    elif damage == "no_manifest":
        os.remove(ck / "manifest.json")
    else:
        (ck / "recipe_state.json").write_text("{}")
    argv = recipe_argv(assets, run, training__max_steps="2", training__save_every="1",
                       eval__enabled="false") + ["--resume"]
    with pytest.raises(CheckpointError, match=f"{ck.name}.*{says}"):
        finetune.main(argv)
    assert not (run / "final").exists()


@pytest.mark.slow   # a subprocess, or the recipe trained
def test_resume_and_rerun_refuse_a_folder_they_cannot_continue(assets, saved_run, tmp_path):
    """--resume with no checkpoint or with a changed config; a rerun without --resume over
    checkpoints: each names the fix, before the model loads (nothing written)."""
    steps = dict(training__max_steps="2", training__save_every="1", eval__enabled="false")
    with pytest.raises(ConfigError, match="--resume: no checkpoint found in"):
        finetune.main(recipe_argv(assets, tmp_path / "empty", **steps) + ["--resume"])
    before = sorted(p.name for p in (saved_run / "checkpoints").iterdir())
    with pytest.raises(ValueError, match=r"different config: \['training.learning_rate'\] changed.*new output_dir"):
        finetune.main(recipe_argv(assets, saved_run, training__learning_rate="5e-3", eval__enabled="false") + ["--resume"])
    with pytest.raises(ConfigError, match="already holds checkpoints: pass --resume"):
        finetune.main(recipe_argv(assets, saved_run, **steps))
    assert sorted(p.name for p in (saved_run / "checkpoints").iterdir()) == before


@pytest.mark.slow   # a subprocess, or the recipe trained
def test_failed_save_leaves_no_half_checkpoint(assets, tmp_path, monkeypatch):
    from accelerate import Accelerator
    out = tmp_path / "run"
    calls = {"n": 0}
    real = Accelerator.save_state

    def fail_second(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            real(self, *a, **k)
            raise OSError(28, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(Accelerator, "save_state", fail_second)
    with pytest.raises(OSError, match="No space"):
        finetune.main(recipe_argv(assets, out, training__save_every="1", eval__enabled="false"))
    assert list(checkpoint_steps(out).values()) == [1]             # the good one, intact
    assert not list((out / "checkpoints").glob(".partial_*"))


# ------------------------------------------------------------------------------ loading
def _edited_copy(tmp_path, edit, extended=True):
    import json
    from conftest import tiny_model
    model = tiny_model()
    if extended:
        hf_posext.patch(model, "yarn", factor=4)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _set_both(key, value):
    def edit(cfg):
        for layout in ("rope_scaling", "rope_parameters"):
            if isinstance(cfg.get(layout), dict):
                cfg[layout][key] = value
    return edit


@pytest.mark.parametrize("case,match", [
    ("scaling_only", r"rope_scaling\['factor'\]=8.0 disagrees with rope_parameters\['factor'\]=4.0; make both"),
    ("both_vs_entry", r"config.hf_posext describes 'yarn' \(factor 4\).*Delete config.hf_posext"),
    ("nan_no_entry", r"rope factor=nan is not finite; restore"),
    ("bad_original", r"original_max_position_embeddings=-4: trained_length must be a positive integer"),
])
def test_hand_edited_config_fails_on_load_naming_the_key(tmp_path, case, match):
    import math
    edits = {"scaling_only": lambda c: c["rope_scaling"].update(factor=8.0),
             "both_vs_entry": _set_both("factor", 8.0),
             "nan_no_entry": lambda c: (c.pop("hf_posext"), _set_both("rope_type", "linear")(c),
                                        _set_both("factor", math.nan)(c)),
             "bad_original": _set_both("original_max_position_embeddings", -4)}
    folder = _edited_copy(tmp_path, edits[case])
    with counted_loads() as loads, pytest.raises(ConfigError, match=match):
        hf_posext.from_pretrained(str(folder))
    assert loads == []      # refused before any weight loads


@pytest.mark.slow   # a subprocess, or the recipe trained
def test_cli_refuses_a_model_without_rope_before_loading(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(tmp_path / "gpt2")
    for cmd in ("eval", "passkey"):
        out = tmp_path / f"out_{cmd}"
        r = _cli(cmd, "--model", str(tmp_path / "gpt2"), "--out", str(out))
        assert r.returncode == 2 and "no rotary position embedding" in _one_line(r.stderr)
        assert "Loading weights" not in r.stderr and not out.exists()


@pytest.mark.parametrize("junk", ["pickle", "junk", "empty"])
def test_corrupted_token_cache_names_the_file_to_delete(tmp_path, junk):
    from _recipekit import char_tokenizer
    from hf_posext.evaluation.shared.data import TokenCache
    cache = TokenCache(char_tokenizer(), tmp_path)
    cache.encode("abc abc")
    f = next(cache.folder.glob("*.npy"))
    marker = tmp_path / "PWNED"
    f.write_bytes({"pickle": pickle.dumps(_Plant(marker)), "junk": b"junk", "empty": b""}[junk])
    with pytest.raises(CheckpointError, match=rf"{f.name} is corrupted.*delete it"):
        TokenCache(char_tokenizer(), tmp_path).encode("abc abc")
    assert not marker.exists()

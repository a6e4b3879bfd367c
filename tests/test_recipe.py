"""The fine-tuning recipe (recipes/finetune.py) end to end on tiny random Llama and Mistral models
saved to a temp dir with a local character-level tokenizer: launch, save and reload, resume after
SIGTERM/SIGINT, gradient clipping, LoRA merge, early config errors, and the accelerate configs.
Nothing touches the Hub."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from hf_posext.compat import get_rope_parameters
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, \
    MistralForCausalLM

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
VENV_BIN = Path(sys.executable).parent
_spec = importlib.util.spec_from_file_location("finetune", RECIPES / "finetune.py")
finetune = importlib.util.module_from_spec(_spec)
sys.modules["finetune"] = finetune
_spec.loader.exec_module(finetune)

CHARS = "abcdefghijklmnopqrstuvwxyz .,\n"
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1,
            eos_token_id=2)


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")   # one token per character
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


pytestmark = pytest.mark.usefixtures("one_thread")


SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    for name, cls, cfg in (("llama", LlamaForCausalLM, LlamaConfig), ("mistral", MistralForCausalLM, MistralConfig)):
        torch.manual_seed(0)
        cls(cfg(**TINY)).save_pretrained(root / name)
        _tokenizer().save_pretrained(root / name)
    rng = random.Random(0)
    (root / "docs").mkdir()
    for i in range(8):   # 8 documents of 400 characters = 400 tokens each
        (root / "docs" / f"doc{i}.txt").write_text("".join(rng.choice(CHARS) for _ in range(400)))
    return root


def _argv(assets, out, model="llama", **over):
    opts = {"model.name": str(assets / model), "model.method": "yarn", "model.factor": "4",
            "data.source": str(assets / "docs"), "data.eval_documents": "[doc7]",
            "training.seq_len": "32", "training.max_steps": "4", "training.warmup_steps": "2",
            "training.save_every": "2", "training.learning_rate": "1e-3",
            "training.gradient_checkpointing": "false", "pose.enabled": "true",
            "eval.lengths": "[64, 256]", "eval.chunk_size": "16"}
    opts.update({k.replace("__", "."): str(v) for k, v in over.items()})
    argv = ["--output_dir", str(out)]
    for k, v in opts.items():
        argv += [f"--{k}", v]
    return argv


def _rows(path: Path, columns=finetune.DETERMINISTIC_COLUMNS) -> list[dict]:
    with open(path) as fh:
        return [{k: r[k] for k in columns} for r in csv.DictReader(fh)]


def _logits(model, n=200):
    ids = torch.arange(n)[None] % 120 + 3
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


# ------------------------------------------------------------------------------ launch and reload
def test_accelerate_launch_trains_saves_and_evaluates(assets, tmp_path):
    out = tmp_path / "run"
    cmd = [str(VENV_BIN / "accelerate"), "launch", "--config_file",
           str(RECIPES / "accelerate" / "cpu.yaml"), str(RECIPES / "finetune.py"), *_argv(assets, out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=SUBPROCESS_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out / "train_log.csv", finetune.LOG_COLUMNS)
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert all(float(r["tokens_per_s"]) > 0 and float(r["memory_mb"]) > 0 for r in rows)
    assert [float(r["lr"]) for r in rows] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3])
    assert (out / "loss_curve.png").stat().st_size > 0
    model = AutoModelForCausalLM.from_pretrained(out / "final")   # plain transformers
    rope = get_rope_parameters(model.config)  # 5.x rope_parameters / 4.x rope_scaling
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0
    assert rope["original_max_position_embeddings"] == 64 and model.config.max_position_embeddings == 256
    results = json.loads((out / "eval" / "results.json").read_text())["rows"]
    assert sorted((r["method"], r["length"]) for r in results) == [
        ("yarn fine-tuned", 64), ("yarn fine-tuned", 256), ("yarn training-free", 64), ("yarn training-free", 256)]
    assert all(r["documents"] == "doc7" for r in results)
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


def test_held_out_documents_never_reach_the_training_sequences(assets):
    cfg = finetune.config_from_dict({"model": {"name": str(assets / "llama")},
                                     "data": {"source": str(assets / "docs"), "eval_documents": ["doc3"]},
                                     "training": {"seq_len": 32}, "eval": {"lengths": [64]}})
    tok = finetune.load_tokenizer(cfg.model.name)
    prepared = finetune.prepare_data(cfg, tok, log=lambda *_: None)
    assert [d.name for d in prepared.eval_docs] == ["doc3"] and "doc3" not in prepared.train_names
    stream = prepared.sequences.flatten().tolist()
    held = prepared.eval_ids[0]
    windows = {tuple(stream[i:i + 24]) for i in range(len(stream) - 23)}
    assert not any(tuple(held[i:i + 24]) in windows for i in range(len(held) - 23))
    other = tok((assets / "docs" / "doc4.txt").read_text(), add_special_tokens=False)["input_ids"]
    assert tuple(other[100:124]) in windows        # the check does find text that is trained on
    assert stream[0] == tok.bos_token_id           # [BOS] doc [EOS] packing
    assert stream.count(tok.eos_token_id) >= 6


# ------------------------------------------------------------------------------------- resume
def _final_weights(out: Path) -> dict:
    return load_file(str(out / "final" / "model.safetensors"))


def _assert_same_run(a: Path, b: Path):
    wa, wb = _final_weights(a), _final_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert _rows(a / "train_log.csv") == _rows(b / "train_log.csv")


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
    assert (cut / "checkpoints" / "step_4").is_dir()        # saved at the signal, not at step 3
    assert len(_rows(cut / "train_log.csv")) == 4 and not (cut / "final").exists()
    with pytest.raises(FileExistsError, match="--resume"):  # never silently overwrite a run
        finetune.main(_argv(assets, cut, **over))
    finetune.main(_argv(assets, cut, **over) + ["--resume"])
    _assert_same_run(full, cut)
    assert signal.getsignal(signum) is handler_before      # the recipe's handler is uninstalled


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
    assert 6 <= done < 80 and (cut / "checkpoints" / f"step_{done}").is_dir()
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
def test_lora_merge_gives_the_unmerged_adapter_logits(assets):
    model = AutoModelForCausalLM.from_pretrained(assets / "llama")
    base_logits = _logits(model)
    lora_cfg = finetune.LoraConfig(enabled=True, r=4, alpha=8)
    peft_model = finetune.apply_lora(model, lora_cfg)
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
    merged_model = finetune.merge_lora(peft_model)
    assert not any("lora" in n for n, _ in merged_model.named_parameters())
    torch.testing.assert_close(_logits(merged_model), unmerged, rtol=0, atol=1e-5)


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


# --------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("over,error,match", [
    ({"model__method": "rope_magic"}, ValueError, "Unknown RoPE extension method 'rope_magic'"),
    ({"model__factor": "0.5"}, ValueError, "factor must be >= 1"),
    ({"training__seq_len": "4096"}, ValueError, "window of 4096 tokens is longer than every training document"),
    ({"eval__lengths": "[64, 5000]"}, ValueError, "shorter than the longest evaluation length 5000"),
    ({"pose__target": "16"}, ValueError, "must be an integer >= training.seq_len"),
    ({"data__eval_documents": "[hamlet]"}, ValueError, r"eval documents \['hamlet'\] are not among"),
    ({"training__learning_rate": "fast"}, ValueError, "training.learning_rate must be a number"),
    ({"lora__target_modules": "[q_lin]"}, ValueError, r"lora.target_modules \['q_lin'\] are not module names"),
])
def test_bad_config_fails_before_training(assets, tmp_path, over, error, match):
    out = tmp_path / "bad"
    if "lora__target_modules" in over:
        over = {**over, "lora__enabled": "true"}
    with pytest.raises(error, match=match):
        finetune.main(_argv(assets, out, **over))
    assert not (out / "train_log.csv").exists() and not (out / "checkpoints").exists()


def test_missing_dataset_column_fails_before_training(assets, tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "data.jsonl").write_text("\n".join(json.dumps({"body": "abc " * 100}) for _ in range(4)))
    out = tmp_path / "bad"
    with pytest.raises(ValueError, match=r"has no column 'text'; its columns are \['body'\]"):
        finetune.main(_argv(assets, out, data__source=str(rows), data__eval_documents="1"))
    assert not (out / "train_log.csv").exists()


def test_unknown_yaml_key_is_refused(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"training": {"max_step": 3}}))
    with pytest.raises(ValueError, match=r"Unknown key\(s\) \['max_step'\] in section 'training'"):
        finetune.parse_args(["--config", str(cfg)])


# ------------------------------------------------------------------------------ shipped configs
@pytest.mark.parametrize("path", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_recipe_configs_parse_and_validate(path):
    cfg, _ = finetune.parse_args(["--config", str(RECIPES / path)])
    assert cfg.training.learning_rate > 0 and cfg.model.factor >= 1


def test_demo_config_is_the_documented_setting():
    cfg, _ = finetune.parse_args(["--config", str(RECIPES / "cpu-smollm2-demo.yaml")])
    assert (cfg.model.name, cfg.model.method, cfg.model.factor) == ("embedded:smollm2-135m", "yarn", 2.0)
    assert cfg.pose.enabled and cfg.training.seq_len <= 2048 and cfg.eval.lengths == [8192, 16384]
    assert cfg.data.eval_documents == ["hamlet"]


@pytest.mark.parametrize("name,kind", [("cpu", "NO"), ("single-gpu", "NO"), ("multi-gpu", "MULTI_GPU"),
                                       ("fsdp", "FSDP"), ("deepspeed-zero3", "DEEPSPEED")])
def test_accelerate_configs_are_accepted_by_accelerate(name, kind):
    """These cannot run here (no GPU): check accelerate parses them and builds the launch env."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
    path = str(RECIPES / "accelerate" / f"{name}.yaml")
    assert load_config_from_file(path).distributed_type.value == kind
    args = launch_command_parser().parse_args(
        ["--config_file", path, str(RECIPES / "finetune.py"), "--config", "recipes/yarn-paper.yaml"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    assert defaults.distributed_type.value == kind
    if kind == "FSDP":
        env = prepare_multi_gpu_env(args)
        assert env["ACCELERATE_USE_FSDP"] == "true"
        assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer"
        assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD"
    elif kind == "MULTI_GPU":
        assert args.multi_gpu and args.num_processes == 8
        prepare_multi_gpu_env(args)
    elif kind == "DEEPSPEED":
        args.deepspeed_fields_from_accelerate_config = ",".join(
            list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else []))
        _, env = prepare_deepspeed_cmd_env(args)
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
        # the recipe requires DeepSpeed's clipping to be the recipe's max_grad_norm
        assert float(defaults.deepspeed_config["gradient_clipping"]) == 1.0


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
    assert 6 <= done < 80 and (cut / "checkpoints" / f"step_{done}").is_dir()
    assert not (cut / "final").exists()
    resumed = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env=SUBPROCESS_ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _assert_same_run(full, cut)

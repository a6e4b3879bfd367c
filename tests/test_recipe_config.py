"""The recipe's configuration: the jsonargparse command line (no abbreviations, negative numbers
as values), early errors naming the fix, the shipped YAML files, and the accelerate configs parsed
the way `accelerate launch` parses them."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from _recipekit import RECIPES, load_finetune, make_assets, recipe_argv as _argv
from hf_posext.training.recipe_config import build_recipe_parser, config_from_dict, parse_args

finetune = load_finetune()
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("recipe_config"), archs=("llama",))


# ------------------------------------------------------------------------------- command line
def test_a_flag_is_never_an_abbreviation_of_another():
    """argparse's default `allow_abbrev` made `--training.lr 3` set `training.lr_schedule`."""
    with pytest.raises(ValueError, match=r"unrecognized arguments: --training.lr 3"):
        parse_args(["--training.lr", "3"])
    cfg, _ = parse_args(["--training.lr_schedule", "cosine"])
    assert cfg.training.lr_schedule == "cosine" and cfg.training.learning_rate == 2e-5


@pytest.mark.parametrize("value,expected", [("-1e-3", -1e-3), ("-0.5", -0.5), ("-2", -2.0), ("-.5", -0.5)])
def test_negative_numbers_are_values_without_equals(value, expected):
    """`--training.weight_decay -1e-3` used to fail ('expected one argument') unless written with '='."""
    cfg = config_from_dict({})
    parser_value = build_recipe_parser().parse_args(["--training.weight_decay", value])
    assert parser_value.training.weight_decay == pytest.approx(expected)
    assert cfg.training.weight_decay == 0.0
    with pytest.raises(ValueError, match=r"training.learning_rate must be a finite number > 0, got -0.001"):
        parse_args(["--training.learning_rate", "-1e-3"])   # parsed as a number, then validated


def test_yaml_file_then_flags_override_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"training": {"max_steps": 7, "learning_rate": 1e-4},
                                    "pose": {"enabled": True}, "output_dir": "runs/a"}))
    cfg, resume = parse_args(["--config", str(path), "--training.max_steps", "3", "--pose.target", "null",
                              "--data.eval_documents", "[doc7, doc6]", "--model.knobs", "{beta_fast: 16}"])
    assert (cfg.training.max_steps, cfg.training.learning_rate, cfg.pose.enabled) == (3, 1e-4, True)
    assert cfg.data.eval_documents == ["doc7", "doc6"] and cfg.model.knobs == {"beta_fast": 16.0}
    assert cfg.output_dir == "runs/a" and resume is None
    assert parse_args(["--resume"])[1] == "latest"
    assert parse_args(["--resume", "runs/a/checkpoints/checkpoint_3"])[1].endswith("checkpoint_3")


# --------------------------------------------------------------------------- config errors
@pytest.mark.parametrize("over,error,match", [
    ({"model__method": "rope_magic"}, ValueError, "Unknown RoPE extension method 'rope_magic'"),
    ({"model__factor": "0.5"}, ValueError, "factor must be >= 1"),
    ({"training__seq_len": "4096"}, ValueError, "window of 4096 tokens is longer than every training document"),
    ({"eval__lengths": "[64, 5000]"}, ValueError, "length of 5000 tokens is longer than every document"),
    ({"pose__target": "16"}, ValueError, "must be an integer >= training.seq_len"),
    ({"data__eval_documents": "[hamlet]"}, ValueError, r"eval documents \['hamlet'\] are not among"),
    ({"training__learning_rate": "fast"}, ValueError, r'"training.learning_rate": Expected a .*float.* fast'),
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
    with pytest.raises(ValueError, match=r"Group 'training' does not accept option 'max_step'"):
        parse_args(["--config", str(cfg)])
    with pytest.raises(ValueError, match=r"Option 'trainin.max_steps' is not accepted"):
        config_from_dict({"trainin": {"max_steps": 3}})


# ------------------------------------------------------------------------------ shipped configs
@pytest.mark.parametrize("path", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_recipe_configs_parse_and_validate(path):
    cfg, _ = parse_args(["--config", str(RECIPES / path)])
    assert cfg.training.learning_rate > 0 and cfg.model.factor >= 1


def test_demo_config_is_the_documented_setting():
    cfg, _ = parse_args(["--config", str(RECIPES / "cpu-smollm2-demo.yaml")])
    assert (cfg.model.name, cfg.model.method, cfg.model.factor) == ("embedded:smollm2-135m", "yarn", 2.0)
    assert cfg.pose.enabled and cfg.training.seq_len <= 2048 and cfg.eval.lengths == [8192, 16384]
    assert cfg.data.eval_documents == ["hamlet"]


@pytest.mark.parametrize("name,kind", [("cpu", "NO"), ("cpu-ddp", "MULTI_GPU"), ("single-gpu", "NO"),
                                       ("multi-gpu", "MULTI_GPU"), ("fsdp2", "FSDP"),
                                       ("fsdp2-context-parallel", "FSDP"), ("deepspeed-zero3", "DEEPSPEED")])
def test_accelerate_configs_are_accepted_by_accelerate(name, kind, monkeypatch):
    """Most cannot run here (no GPU): parse each the way `accelerate launch` does, build its launch
    environment, and build accelerate's plugins from that environment."""
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
        from accelerate import FullyShardedDataParallelPlugin, ParallelismConfig
        env = prepare_multi_gpu_env(args)
        assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
        assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer"
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert FullyShardedDataParallelPlugin().fsdp_version == 2
        pc = ParallelismConfig()
        if name == "fsdp2-context-parallel":
            assert pc.cp_enabled and pc.cp_backend == "torch" and pc.cp_size == 4
            assert pc.total_size == args.num_processes == 8       # 2 FSDP shards x 4-way CP
        else:
            assert not pc.cp_enabled
    elif kind == "MULTI_GPU":   # torchrun-based launcher: really num_processes ranks
        assert args.multi_gpu and args.num_processes == (2 if name == "cpu-ddp" else 8)
        env = prepare_multi_gpu_env(args)
        assert env.get("ACCELERATE_USE_FSDP", "false") == "false"
    elif kind == "DEEPSPEED":
        args.deepspeed_fields_from_accelerate_config = ",".join(
            list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else []))
        _, env = prepare_deepspeed_cmd_env(args)
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
        # the recipe requires DeepSpeed's clipping to be the recipe's max_grad_norm
        assert float(defaults.deepspeed_config["gradient_clipping"]) == 1.0


def test_multi_cpu_config_starts_one_process_without_mpirun():
    """Why recipes/accelerate/cpu-ddp.yaml is MULTI_GPU: accelerate launches a MULTI_CPU config with
    its simple launcher, one process, which expects mpirun (--mpirun_hostfile) to start the rest."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env
    args = launch_command_parser().parse_args(["--cpu", "--num_processes", "2", "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert not args.multi_gpu and args.mpirun_hostfile is None
    cmd, _ = prepare_simple_launcher_cmd_env(args)
    assert cmd[1:] == ["train.py"]                     # one python process, no launcher of N ranks


def test_the_4x_retrieval_recipe_is_the_2x_mix_with_its_spans_scaled():
    """recipes/cpu-smollm2-retrieval-4x.yaml: the 2x recipe's layout (examples cut to 1k beside
    document windows of 1/8 the target length, 100 steps) but for the factor (4), the evaluation's
    lengths, the folder, its 4k-token windows and three quarters synthetic; its synthetic questions sit at position
    ids in [ceil(0.9 x 32,768) - 1, 32,768) after a fact in the first chunk (PoSE over 4 x 8,192)."""
    import dataclasses

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_posext
    from hf_posext.training.model import build_collator
    from hf_posext.training.pose import Span
    from hf_posext.training.synthetic import example_window

    two, _ = parse_args(["--config", str(RECIPES / "cpu-smollm2-retrieval.yaml")])
    four, _ = parse_args(["--config", str(RECIPES / "cpu-smollm2-retrieval-4x.yaml")])
    assert four.model == dataclasses.replace(two.model, factor=4.0)
    # the same layout: examples of 1,024 tokens beside document windows of 1/8 the target length
    assert four.data == dataclasses.replace(two.data, synthetic=dataclasses.replace(two.data.synthetic, share=0.75))
    assert two.data.synthetic.window == 1024 and two.training.seq_len * 2 == four.training.seq_len == 4096
    # (the 2x recipe checkpoints every 25 steps, as the benchmark's arm it was measured as did)
    assert four.training == dataclasses.replace(two.training, seq_len=4096, save_every=50)
    assert (four.pose, four.lora) == (two.pose, two.lora)
    assert four.eval == dataclasses.replace(two.eval, lengths=[8192, 32768])
    # the collator the recipe builds for a model trained at 8,192 and extended by the recipe's factor
    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, vocab_size=64, max_position_embeddings=8192))
    hf_posext.patch(model, four.model.method, four.model.factor)
    collate = build_collator(four, model, log=lambda *_: None)
    # a synthetic example holds data.synthetic.window tokens, cut from its 4k window's front
    window = example_window(four.data.synthetic, four.training.seq_len)
    assert window == 1024
    span = Span(fact_end=100, question_start=window - 60, answer_start=window - 20)
    batch = collate([torch.zeros(window, dtype=torch.long)] * 8, list(range(8)), [span] * 8)
    last = batch["position_ids"][:, -1]
    assert bool((last >= math.ceil(0.9 * 32768) - 1).all()) and bool((last < 32768).all())
    assert bool((batch["position_ids"][:, :100] < window).all())   # the fact: in the first chunk

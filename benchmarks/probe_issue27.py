"""The bad inputs of issue 27 item 4, added to benchmarks/probe_bad_inputs.py's cases (same
classification; tests/test_bad_inputs_more.py holds their tests)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import transformers

import hf_posext
from hf_posext import cli


def add_issue27_cases(add, tmp: Path, assets: Path, saved: Path, edited, finetune, recipe_argv) -> None:
    from conftest import tiny_model

    llama = str(assets / "llama")
    add("patch(longrope, 3 short factors for 8 frequencies)", "api", lambda: hf_posext.patch(
        tiny_model(), "longrope", factor=2, short_factor=[1.0] * 3, long_factor=[1.0] * 8))
    add("patch(string, factor=2) past L + S - W", "api", lambda: hf_posext.patch(
        tiny_model(), "string", factor=2, shifted_offset=21, local_value=5))
    add("patch(string, target 83, S=21, W=5)", "api", lambda: hf_posext.patch(
        tiny_model(), "string", max_position_embeddings=83, shifted_offset=21, local_value=5))
    add("trained_length('llama')", "api", lambda: hf_posext.trained_length("llama"))
    if not torch.cuda.is_available():
        from hf_posext.evaluation import PerplexityGrid, RunInfo, evaluate_perplexity
        import numpy as np
        add("evaluate_perplexity(device='cuda') without CUDA", "api", lambda: evaluate_perplexity(
            tiny_model(), [np.arange(80) % 100], PerplexityGrid(["none"], [32]), run=RunInfo(device="cuda")))

    rerope = tmp / "saved_rerope_27"
    m = transformers.AutoModelForCausalLM.from_pretrained(llama)
    hf_posext.patch(m, "rerope", factor=2).save_pretrained(rerope)
    no_block = edited("no_attention_block", lambda c: c.pop("hf_posext_attention"), src=rerope)
    add("load: attention block deleted", "api", lambda: hf_posext.from_pretrained(no_block))
    heads0 = edited("heads0", lambda c: (c.update(num_attention_heads=0), c.pop("head_dim", None)))
    add("load: num_attention_heads 0", "api", lambda: hf_posext.from_pretrained(heads0))
    add("check num_attention_heads 0", "cli", lambda: cli.main(["check", heads0]))

    def huge(c):
        for key in ("rope_scaling", "rope_parameters", "hf_posext"):
            if isinstance(c.get(key), dict):
                c[key]["factor"] = 1e308
    big = edited("factor_1e308", huge)
    add("load: factor 1e308", "api", lambda: hf_posext.from_pretrained(big))
    add("check factor 1e308", "cli", lambda: cli.main(["check", big]))

    base = ["eval", "--model", llama, "--dataset", str(assets / "docs"), "--no-plot", "--no-progress"]
    add("cli eval --knobs rerope:window=100 (L = 64)", "cli", lambda: cli.main(
        [*base, "--methods", "rerope", "--knobs", "rerope:window=100", "--out", str(tmp / "e27a")]))
    add("cli eval --methods string at 2x", "cli", lambda: cli.main(
        [*base, "--methods", "string", "--lengths", "64,128", "--knobs",
         "string:shifted_offset=21,string:local_value=5", "--out", str(tmp / "e27b")]))

    old = tmp / "old_rows"
    old.mkdir()
    (old / "perplexity.json").write_text(json.dumps({"rows": [
        {"key": "k", "method": "none", "length": 64, "perplexity": 3.0}]}))   # no protocol
    add("results: row of an older format (no protocol)", "cli", lambda: cli.main(
        [*base, "--methods", "none", "--lengths", "64", "--out", str(old), "--resume"]))
    linked = tmp / "linked_pid"
    linked.mkdir()
    victim = tmp / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, linked / ".perplexity.lock.pid")

    def planted_link():
        try:
            return cli.main([*base, "--methods", "none", "--lengths", "64", "--out", str(linked)])
        finally:
            if victim.read_text() != "precious":
                raise RuntimeError("UNSAFE: the linked file was overwritten")
    add("results: planted symlink at the lock-pid file", "cli", planted_link)

    a_file = tmp / "recipe_out_is_a_file"
    a_file.write_text("x")
    add("recipe output_dir is a file", "api", lambda: finetune.main(recipe_argv(assets, a_file)))
    damaged = tmp / "recipe_damaged_config"
    (damaged / "checkpoints" / "checkpoint_0").mkdir(parents=True)
    (damaged / "config.json").write_text('{"model": ')
    add("recipe --resume with config.json damaged", "api",
        lambda: finetune.main(recipe_argv(assets, damaged) + ["--resume"]))
    shutil.rmtree(tmp / "e27a", ignore_errors=True)

"""Bad inputs to the command line (the rule: tests/_badinputs.py): `hf-posext eval`,
`passkey`, `check`, `export` and `search`, each flag's bad values, missing or wrong models,
datasets and folders. Each exits with one `error:` line naming the flag or file, before any
weights load, and writes nothing."""

from __future__ import annotations

import json
import shutil

import pytest
from _badinputs import cli_refused, refused
from _recipekit import make_assets
from conftest import tiny_model
from transformers import GPT2Config, GPT2LMHeadModel

import hf_posext

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """The tiny Llama with its tokenizer and documents (400 tokens each), a GPT-2, a folder with
    the tokenizer only, and tiny checkpoints extended with yarn, string, dynamic_ntk, ntk_by_parts."""
    root = make_assets(tmp_path_factory.mktemp("cli"), archs=("llama",))
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(root / "gpt2")
    shutil.copytree(root / "llama", root / "tok_only", ignore=shutil.ignore_patterns("*.safetensors"))
    for method, knobs in (("yarn", dict(factor=4)), ("string", dict(factor=1.25, shifted_offset=21, local_value=4)),
                          ("dynamic_ntk", dict(factor=2)), ("ntk_by_parts", dict(factor=2))):
        hf_posext.patch(tiny_model(), method, **knobs).save_pretrained(root / method)
    (root / "a_file").write_text("x")
    return root


# ------------------------------------------------------------------ eval
EVAL = {   # flags: what the error line names (lengths 64 unless given: the documents hold 400 tokens)
    "--lengths 0": "--lengths: '0'", "--lengths -4": "--lengths: '-4'", "--lengths abc": "--lengths: 'abc'",
    "--lengths ''": "--lengths is empty", "--lengths 1.5": "--lengths: '1.5'", "--lengths 1,64": "--lengths: 1 ",
    "--lengths 100000m": "ask for a smaller factor",
    "--protocol sliding --stride 0": "--stride", "--protocol sliding --stride -1": "--stride",
    "--protocol sliding --stride 128": "--stride 128 is longer than the shortest window 64",
    "--protocol bogus": "'bogus'", "--methods bogus": "--methods: unknown method 'bogus'",
    "--methods ''": "--methods is empty", "--factor 0.5": "--factor: factor must be >= 1.0, got 0.5", "--factor nan": "--factor: factor must be finite, got nan",
    "--factor abc": "--factor: factor 'abc' is neither a number nor auto", "--factor inf": "--factor: factor must be finite, got inf", "--dtype int8": "--dtype",
    "--device tpu9": "--device 'tpu9'", "--max-docs 0": "--max-docs", "--chunk-size 0": "--chunk-size",
    "--eval-tokens 0": "--eval-tokens", "--methods yarn --knobs garbage": "--knobs: 'garbage' is not NAME=VALUE",
    "--methods yarn --knobs beta_fast=nan": "beta_fast", "--methods leaky_rerope --knobs leak=1": "leak",
    "--baseline-window 32 --baseline-stride 64": "--baseline-stride 64 is longer than --baseline-window",
    "--model {tmp}/nope": "--model", "--model {tmp}/tok_only": "holds no weights",
    "--dataset {tmp}/nodocs": "--dataset", "--out {tmp}/a_file": "--out", "--gguf-file x.gguf": "--gguf-file 'x.gguf'",
    "--methods self_extend --factor 1e9 --knobs group_size=auto": "smaller factor",
}   # --lengths 1: test_bad_inputs; --model without RoPE, a knob above L: test_bad_inputs(_more)


def _argv(flags: str, tmp) -> list[str]:
    import shlex
    return [a.replace("{tmp}", str(tmp)) for a in shlex.split(flags)]


@pytest.mark.parametrize("flags", EVAL)
def test_eval_refuses(flags, assets, tmp_path, capsys):
    extra = _argv(flags, assets)
    argv = ["eval", "--model", assets / "llama", "--dataset", assets / "docs", "--no-plot", "--no-progress",
            *(["--out", tmp_path / "out"] if "--out" not in extra else []),
            *(["--lengths", "64"] if "--lengths" not in extra else []), *extra]
    cli_refused(argv, capsys, EVAL[flags])
    assert not (tmp_path / "out").exists()


PASSKEY = {"--depths 2": "--depths: 2", "--depths -0.1": "--depths: -0.1", "--depths abc": "--depths: 'abc'",
           "--trials 0": "--trials must be at least 1", "--seed -1": "--seed must be an integer >= 0",
           "--seed x": "--seed must be an integer >= 0, got 'x'", "--seeds 5": "--trials 5 for --seeds 5",
           "--lengths 1": "--lengths: 1 ", "--lengths 0": "--lengths: '0'",
           "--methods bogus": "--methods: unknown method 'bogus'", "--factor 0": "--factor: factor must be >= 1.0, got 0.0",
           "--model {tmp}/nope": "--model", "--dtype x": "--dtype", "--out {tmp}/a_file": "is a file, not a folder"}


@pytest.mark.parametrize("flags", PASSKEY)
def test_passkey_refuses(flags, assets, tmp_path, capsys):
    extra = _argv(flags, assets)
    argv = ["passkey", "--model", assets / "llama", "--no-plot", "--no-progress",
            *(["--out", tmp_path / "out"] if "--out" not in extra else []), *extra]
    cli_refused(argv, capsys, PASSKEY[flags])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,says", [([], "required: COMMAND"), (["evaluate"], "invalid choice: 'evaluate'"),
                                       (["eval", "--lenghts", "4k"], "unrecognized arguments: --lenghts")])
def test_cli_refuses_a_bad_command(argv, says, capsys):
    cli_refused(argv, capsys, says)


# ------------------------------------------------------------------ check, export, search
def test_check_says_string_is_lost_in_every_engine(assets):
    """A report, not a refusal: the engines read no attention method (rerope, dual_chunk and the
    others: test_check_config)."""
    from hf_posext.portability.verdicts import check_report
    engines = [line for line in check_report(str(assets / "string")).splitlines()
               if line.strip().split(" ")[0] in ("vLLM", "SGLang", "TGI", "llama.cpp")]
    assert len(engines) >= 4 and all(" lost" in line and "'string' is lost" in line for line in engines), engines


def test_check_refuses_missing_and_damaged_checkpoints(assets, tmp_path, capsys):
    cli_refused(["check", tmp_path / "nope"], capsys, "no config.json there")
    shutil.copytree(assets / "yarn", tmp_path / "notjson")
    (tmp_path / "notjson" / "config.json").write_text("{oops")
    cli_refused(["check", tmp_path / "notjson"], capsys, "config.json is not valid JSON")
    cli_refused(["check"], capsys, "give checkpoint folders, or --table")


@pytest.mark.parametrize("method,target,says", [("dynamic_ntk", "vllm", "vllm cannot run dynamic_ntk"),
                                                ("ntk_by_parts", "llama.cpp", "llama.cpp cannot run ntk_by_parts")])
def test_export_refuses_a_method_the_engine_cannot_run(assets, tmp_path, method, target, says):
    """(attention methods, a folder inside the source, a GGUF not given or not a GGUF: test_export_safety,
    test_check_config)"""
    refused(lambda: hf_posext.export(str(assets / method), str(tmp_path / "out"), target=target),
            "export refused", says)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,says,status", [
    (["{out}/a_file", "--target", "vllm"], "a_file is a file; pass a new folder", 1),
    (["{out}/new", "--target", "vllmm"], "invalid choice: 'vllmm'", 2),
    (["{out}/new", "--target", "vllm", "--gguf", "{out}/a_file"], "--gguf is only for --target gguf", 2),
    (["{out}/new.gguf", "--target", "gguf", "--gguf", "{out}/none.gguf"], "none.gguf: no such file", 2),
], ids=["onto-a-file", "unknown-target", "gguf-without-target-gguf", "gguf-missing"])
def test_export_command_refuses(assets, tmp_path, capsys, args, says, status):
    (tmp_path / "a_file").write_text("x")
    cli_refused(["export", assets / "yarn", *[a.replace("{out}", str(tmp_path)) for a in args]], capsys,
                says, status=status)
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.gguf").exists()


@pytest.mark.parametrize("flags,says", [
    ("--target-length 0", "'0'"), ("--target-length 64 --budget nan", "--budget 'nan': give a wall time"),
    ("--target-length 64 --budget-minutes 30", "--budget-minutes is no longer a flag; use --budget"),
    ("--target-length 64 --max-steps 0", "--max-steps"), ("--target-length 64k --out {tmp}/a_file", "a_file is a file"),
    ("--target-length 64 --out {tmp}", "is a non-empty folder without a search_log.jsonl"),
])   # --proxy-length past --target-length, --lr -1: test_search
def test_search_refuses(assets, tmp_path, capsys, flags, says):
    extra = _argv(flags, assets)
    out = [] if "--out" in extra else ["--out", tmp_path / "out"]
    cli_refused(["search", "--model", assets / "llama", "--dataset", assets / "docs", *extra, *out], capsys,
                says)
    assert not (tmp_path / "out").exists()


def test_eval_refuses_results_it_cannot_read(assets, tmp_path, capsys):
    """A results folder damaged, not hf_posext's, or already holding results without --resume."""
    argv = ["eval", "--model", assets / "llama", "--dataset", assets / "docs", "--no-plot", "--no-progress",
            "--methods", "none", "--lengths", "64", "--no-baseline", "--out", tmp_path]
    for text, says in (("{", "perplexity.json is damaged"), ("[1,2]", "is not a hf_posext results file")):
        (tmp_path / "perplexity.json").write_text(text)
        cli_refused([*argv, "--resume"], capsys, says)
    (tmp_path / "perplexity.json").write_text(json.dumps({"rows": []}))
    cli_refused(argv, capsys, "already holds perplexity results", "--resume")


# ------------------------------------------------------------------ serve: the grid commands' grammar
@pytest.mark.parametrize("flags,says", [
    ("--method warp --factor 4", "--methods: unknown method 'warp'"),
    ("--method yarn,linear --factor 4", "--method takes one method, got 'yarn,linear'"),
    ("--method none --factor 4", "--method takes one method, got 'none'"),
    ("--method yarn --factor auto", "--factor takes one scale s >= 1 here"),
    ("--method yarn --factor 2,4", "got '2,4'"),
    ("--method yarn --factor 0.5", "--factor: factor must be >= 1.0, got 0.5"),
    ("--method yarn --factor abc", "--factor: factor 'abc' is neither a number nor auto"),
    ("--knobs beta_fast=64", "--knobs needs --method"),
    ("--method yarn --factor 4 --knobs bogus=1", "unknown knob 'bogus'"),
])
def test_serve_reads_method_factor_and_knobs_as_the_grid_commands_do(assets, capsys, flags, says):
    """serve's --method / --factor / --knobs are declared and parsed once with the grid commands'
    (commands/session.py: add_method_args, method_flags): the same parsers, the same words."""
    cli_refused(["serve", assets / "llama", "--engine", "vllm", *flags.split()], capsys, says)


def test_search_and_the_grid_commands_share_the_model_flags(assets, capsys):
    """--model / --gguf-file / --device: one declaration (session.add_model_args), one check."""
    for command in (["search", "--target-length", "64", "--out", "x"], ["eval"]):
        cli_refused([*command, "--model", assets / "llama", "--device", "tpu"], capsys, "--device 'tpu'")
        cli_refused([*command, "--model", assets / "nowhere"], capsys, "nowhere")

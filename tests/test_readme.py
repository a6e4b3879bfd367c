"""The README's quick start works as written, CI runs the README's test command, the README stays a
five-minute read, and the result tables of docs/results.md are the committed rows."""

import argparse
import re
from pathlib import Path

import pytest
from _doccommands import documented_commands
from hf_posext.evaluation.shared.record import read_rows

CLI = r"hf-posext "   # the commands tested below

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RESULTS_PAGE = (ROOT / "docs" / "results.md").read_text()
EVAL_DIR = ROOT / "benchmarks" / "results" / "eval"


def quickstart() -> str:
    match = re.search(r"<!-- quickstart.*?-->\s*```python\n(.*?)```", README, re.S)
    assert match, "README lost its quick start block"
    return match.group(1)


def test_quickstart_is_short():
    lines = [line for line in quickstart().splitlines() if line.strip()]
    assert len(lines) <= 15


@pytest.mark.slow
def test_quickstart_runs_as_written(tmp_path, monkeypatch, capsys):
    """The README's example as written (extend, evaluate perplexity and retrieval, save, reload),
    with the embedded tokenizer and plays but a tiny random Llama of SmolLM2's vocabulary and
    trained length standing in for the 135M weights (16k forwards of the real model take minutes)."""
    import hf_posext
    from conftest import tiny_model
    from hf_posext.data import embedded
    from hf_posext.rope.compat import get_rope_parameters

    tokenizer = embedded.load_tokenizer()
    monkeypatch.setattr(embedded, "load_model", lambda *a, **k: tiny_model(
        vocab_size=len(tokenizer), max_position_embeddings=8192, attn_implementation="sdpa"))
    monkeypatch.setattr(embedded, "load_tokenizer", lambda *a, **k: tokenizer)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(quickstart(), "README.md:quickstart", "exec"), namespace)
    ppl, hit = namespace["ppl"], namespace["hit"]
    assert {(r["method"], r["length"]) for r in ppl} >= {("yarn", 16384), ("ntk", 16384), ("none", 4096)}
    assert all(r["perplexity"] > 1 for r in ppl)
    assert {r["method"] for r in hit} == {"none", "yarn"} and all(r["trials"] == 2 for r in hit)
    reloaded = namespace["reloaded"]
    assert not hf_posext.is_patched(reloaded)
    assert get_rope_parameters(reloaded.config)["rope_type"] == "yarn"
    assert reloaded.config.max_position_embeddings == 16384
    assert (tmp_path / "smollm2-yarn-16k" / "model.safetensors").is_file()
    # "Where a checkpoint runs": each `hf-posext serve` line on the checkpoint just saved
    import shlex

    from hf_posext import cli

    block = re.search(r"<!-- serve-commands -->\s*```\n(.*?)```", README, re.S).group(1).splitlines()
    pairs = list(zip(block[::2], block[1::2]))
    assert len(pairs) == 4
    for shown, output in pairs:
        assert shown.startswith("$ hf-posext serve ")
        assert cli.main(shlex.split(shown)[2:]) == 0
        assert capsys.readouterr().out.strip() == output, shown


@pytest.mark.slow
def test_quickstart_on_the_real_model_is_the_embedded_default():
    """What the example's loaders give without the stand-in: the embedded SmolLM2 at 8,192."""
    from hf_posext.data import embedded
    from transformers import AutoConfig

    folder, gguf = embedded.model_location()
    assert "embedded.load_model()" in quickstart() and "trained at 8,192" in quickstart()
    assert AutoConfig.from_pretrained(folder, gguf_file=gguf).max_position_embeddings == 8192


def test_ci_runs_the_readme_test_command():
    """CI runs `make test-all`, whose first step is the README's test command, `make test`."""
    command = re.search(r"^(make test)\s+# the test command", README, re.M).group(1)
    assert re.search(r"^make test-all$", (ROOT / ".ci" / "run").read_text(), re.M)
    makefile = (ROOT / "Makefile").read_text()
    prerequisites = re.search(r"^test-all:(.*)$", makefile, re.M).group(1).split()
    assert command.split()[1] in prerequisites


def test_readme_is_a_five_minute_read():
    """The README says what it is, how to install, test and start, and links the rest:
    narratives and full result tables live in docs/."""
    assert len(README.splitlines()) <= 150


def test_results_page_demo_table_is_the_benchmark_report():
    """The long-context demo table in docs/results.md is computed from the committed results of
    `python benchmarks/long_context.py demo` by the package's report table, never typed in."""

    from hf_posext.evaluation.shared.results import ratio_table

    rows = read_rows(EVAL_DIR / "long-context" / "perplexity.json")
    assert {int(r["length"]) for r in rows} == {16384, 32768}
    table = ratio_table(rows, (16384, 32768))
    assert table in RESULTS_PAGE
    assert table in (ROOT / "benchmarks" / "results" / "long_context.md").read_text()


def test_results_page_quick_demo_table_is_the_committed_run():
    """The quick demo's table in docs/results.md is what `hf-posext eval` prints for the committed
    rows of `make demo` (benchmarks/results/eval/quick-demo), never typed in."""

    from hf_posext.evaluation.shared.results import format_table

    rows = read_rows(EVAL_DIR / "quick-demo" / "perplexity.json")
    assert {int(r["length"]) for r in rows} == {4096, 16384} and {r["docs"] for r in rows} == {2}
    # every row holds its position buckets; the 4k cells came from the 16k forwards
    assert all(r["bucket_nll"] for r in rows)
    assert {r["forward_length"] for r in rows if r["protocol"] == "truncate"} == {16384}
    assert format_table(rows) in RESULTS_PAGE


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


# the pages whose Python examples patch a `model` (docs/evaluation.md's load SmolLM2 and run 16k)
PATCH_EXAMPLE_PAGES = ("docs/methods.md", "docs/attention.md")


def test_docs_python_blocks_run():
    """Every Python block of the README but the quick start (run above on the real model), and of
    the pages with patch examples, on a tiny random Llama with SmolLM2's trained length 8,192 (the
    knobs shown, e.g. window 6144, must fit L)."""
    import hf_posext
    from conftest import tiny_model

    blocks = [(name, b) for name in ("README.md", *PATCH_EXAMPLE_PAGES)
              for b in python_blocks((ROOT / name).read_text()) if b != quickstart()]
    assert len(blocks) >= 2, "the docs' Python examples were not found"
    for i, (name, block) in enumerate(blocks):
        namespace = {"hf_posext": hf_posext, "model": tiny_model(max_position_embeddings=8192)}
        exec(compile(block, f"{name}:python-block-{i}", "exec"), namespace)
        assert hf_posext.is_patched(namespace["model"])


def test_documented_commands_found():
    found = {cmd for _, cmd in documented_commands(CLI)}
    assert len(found) >= 20 and any(c.startswith("hf-posext search --dataset") for c in found)


@pytest.mark.parametrize("doc, command", documented_commands(CLI))
def test_documented_command_parses(doc, command, capsys):
    """Each `hf-posext` command the docs show is accepted by the CLI's own parser, so a renamed
    flag or subcommand fails here. `a|b|c` (alternatives) is tried with each value; a bare
    `hf-posext SUB` (naming the command in prose) must name a subcommand."""
    import shlex

    from hf_posext.cli import build_parser

    parser = build_parser()
    argv = shlex.split(command)[1:]
    # a hidden flag is an old name, declared only to be refused naming the new one (passkey
    # --seeds, search / dpe-detect --length): it parses, so look for it by name
    old = {s for a in _all_actions(parser) if a.help == argparse.SUPPRESS for s in a.option_strings}
    assert not old & {a.split("=")[0] for a in argv}, f"{doc}: `{command}` uses an old flag"
    if len(argv) == 1 and not argv[0].startswith("-"):
        subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        assert argv[0] in subcommands, f"{doc}: `{command}` names no subcommand ({sorted(subcommands)})"
        return
    variants = [[]]
    for arg in argv:
        options = arg.split("|") if "|" in arg else [arg]
        variants = [v + [o] for v in variants for o in options]
    for variant in variants:
        try:
            parser.parse_args(variant)
        except SystemExit as stop:
            err = capsys.readouterr().err
            if stop.code and "the following arguments are required" in err:
                # prose showing one flag (`hf-posext search --short-factors identity`): the flags
                # shown must still exist and take the value shown
                for action in _all_actions(parser):
                    action.required = isinstance(action, argparse._SubParsersAction)
                try:
                    parser.parse_args(variant)
                    continue
                except SystemExit as again:
                    stop, err = again, capsys.readouterr().err
            assert stop.code == 0, f"{doc}: `hf-posext {shlex.join(variant)}`: {err}"


def _all_actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_actions(sub)


def test_the_headline_effective_lengths_are_the_4x_page_s():
    """The README's headline effective lengths are the ones the 4x page's "Effective length by
    haystack" section reads from the stored rows: the 4x recipe at 32k (4x) in every haystack it
    names, YaRN at 16k (2x) without training in RULER's noise only (below it in Hamlet)."""
    page = (ROOT / "benchmarks" / "results" / "effective_length_4x.md").read_text()
    section = page.split("## Effective length by haystack", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| haystack")]
    reading = {(r[0], r[1], r[2]): r[7] for r in rows}
    recipe = {h for (h, task, setting), text in reading.items()
              if task == "niah_single" and setting == "YaRN, the 4x recipe (fine-tuned)" and text == "32k (4x)"}
    assert {h.split(" (")[0] for h in recipe} == {"RULER's noise", "Hamlet", "source code"}
    assert "**4× fine-tuned** (4× recipe) in RULER's noise, held-out Hamlet and code" in README
    assert reading[("RULER's noise", "niah_single", "YaRN s = 4, training-free")] == "16k (2x); 32k misses the bar"
    assert reading[("Hamlet (held out)", "niah_single", "YaRN s = 4, training-free")] == "8k (1x); 16k misses the bar"
    assert "**2× training-free** (YaRN) in noise only" in README


def test_the_4x_recipe_s_quoted_figures_are_its_row_on_the_4x_page():
    """The README's decision line and the 4x recipe's header quote the recipe's needle counts at 32k
    and its cost past L; each is what the 4x page's effective-length table reads for the recipe now
    (a figure copied by hand goes stale when a seed is added: the recipe said 7/10 in code after the
    second seed made it 14/20)."""
    page = (ROOT / "benchmarks" / "results" / "effective_length_4x.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| YaRN | 4x (32k), fine-tuned |"))
    short = {"RULER's noise": "noise", "Hamlet": "Hamlet", "source code": "code"}
    counts = {short[label]: k for k, label in re.findall(r"(\d+/\d+) = [^(]*\((RULER's noise|Hamlet|source code)",
                                                           row.split(" | ")[2])}
    assert set(counts) == set(short.values()), row
    past_l = re.search(r"= (\+0\.\d+) nats", row).group(1)
    recipe = (ROOT / "recipes" / "cpu-smollm2-retrieval-4x.yaml").read_text().split("\nmodel:", 1)[0]
    readme = next(line for line in README.splitlines() if "cpu-smollm2-retrieval-4x.yaml` |" in line)
    for where, text in {"README": readme, "recipe": recipe}.items():
        quoted = {where_: k for k, where_ in re.findall(r"(\d+/\d+) in (?:held-out source )?(noise|Hamlet|code)", text)}
        assert quoted == counts, (where, quoted, counts)
        assert f"{past_l} nats past L" in text, (where, past_l)

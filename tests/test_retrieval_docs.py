"""Every command docs/retrieval.md shows runs: each `hf-posext` line of its bash blocks, on a
tiny model (lengths scaled to its character tokenizer, 2 trials, the local lm-eval task for
RULER's, which needs the real tokenizer and 8k prompts), and its Python block as written."""

import re
import shlex
from pathlib import Path

import pytest

import hf_posext.cli as cli
from _evalkit import char_tokenizer, tiny_checkpoint, tiny_model

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "retrieval.md").read_text()
pytestmark = pytest.mark.usefixtures("one_thread")


def commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC, re.S)
    return [shlex.split(line)[1:] for b in blocks for line in b.splitlines() if line.startswith("hf-posext ")]


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    if flag in argv:
        argv[argv.index(flag) + 1] = value
        return argv
    return argv + [flag, value]


def cheap(argv: list[str], model: Path, out: Path) -> list[str]:
    argv = list(argv)
    if argv[0] == "lm-eval":
        i = argv.index("--model_args") + 1
        args = dict(kv.split("=", 1) for kv in argv[i].split(","))
        args["pretrained"] = str(model)
        args.pop("max_length", None)
        argv[i] = ",".join(f"{k}={v}" for k, v in args.items())
        argv = _set(argv, "--tasks", "tiny_choice")
        argv = _set(argv, "--include_path", str(ROOT / "tests" / "lm_eval_tasks"))
        if "--metadata" in argv:
            j = argv.index("--metadata")
            del argv[j:j + 2]
        return _set(argv, "--limit", "1")
    argv = _set(_set(argv, "--lengths", "800"), "--depths", "1")
    argv = _set(argv, "--seeds" if argv[0] == "passkey" else "--trials", "2")
    return argv + ["--model", str(model), "--out", str(out), "--no-progress", "--no-plot"]


def test_the_doc_shows_commands():
    names = [c[0] for c in commands()]
    assert names.count("retrieval") >= 2 and "lm-eval" in names and "passkey" in names


@pytest.mark.parametrize("index", range(len(commands())))
def test_doc_command_runs(index, tmp_path, monkeypatch):
    model = tiny_checkpoint(tmp_path / "tiny")
    argv = commands()[index]
    if argv[0] == "lm-eval":
        pytest.importorskip("lm_eval")
        monkeypatch.chdir(ROOT)    # the local task's data path is relative to the repository
    assert cli.main(cheap(argv, model, tmp_path / "out")) == 0


def test_doc_python_block_runs():
    code = re.search(r"```python\n(.*?)```", DOC, re.S).group(1)
    from hf_posext.evaluation.retrieval import settings
    namespace = {"model": tiny_model(), "tokenizer": char_tokenizer()}
    # the block's lengths on the tiny model's character tokenizer, two trials
    code = code.replace("[8192, 16384]", "[800]").replace('tasks=["multi_key"]', 'tasks=["multi_key"], trials=2, depths=[1.0]')
    exec(compile(code, "docs/retrieval.md", "exec"), namespace)
    assert {r["task"] for r in namespace["rows"]} == {"multi_key"} and settings.DEFAULT_TRIALS == 20
    assert {(r["task"], r["trials"], r["seeds"]) for r in namespace["passkey"]} == {("single_needle", 2, 2)}

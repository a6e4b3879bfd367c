"""Every command the retrieval pages show runs (the guide, docs/retrieval.md and
docs/retrieval_sequential.md; the measurements, docs/retrieval_measurements.md and
docs/retrieval_sequential_measurements.md): each `hf-posext` line of their bash blocks, on a tiny
model (lengths scaled to its character tokenizer, 2 trials, the local lm-eval task for RULER's,
which needs the real tokenizer and 8k prompts), and the guide's Python block as written."""

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

import hf_posext.cli as cli
from hf_posext.evaluation.retrieval import report
from _evalkit import char_tokenizer, tiny_checkpoint, tiny_model

ROOT = Path(__file__).resolve().parents[1]
# the user guide's pages, then the measurements' (the runs they log); each page's commands run
GUIDE = ("retrieval.md", "retrieval_sequential.md")
LOGS = ("retrieval_measurements.md", "retrieval_sequential_measurements.md")
PAGES = {name: (ROOT / "docs" / name).read_text() for name in GUIDE + LOGS}
DOC = PAGES["retrieval.md"]                                  # the guide's first page
SEQUENTIAL = PAGES["retrieval_sequential.md"]                # sequential trials and a budget
MEASUREMENTS = PAGES["retrieval_measurements.md"]            # the 2x grid, cost, vLLM
pytestmark = pytest.mark.usefixtures("one_thread")


def commands(text: str = "".join(PAGES.values())) -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
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
    if "--engine" in argv:   # the stand-in vLLM (tests/fake_vllm, test_doc_command_runs)
        argv = _set(argv, "--vllm-python", sys.executable)
        argv = _set(argv, "--factor", "auto") if "--factor" in argv else argv   # vLLM serves s·64 here
    trials = "2"
    if "--sequential" in argv or "--budget" in argv:   # a length within L (1024 here: `long_checkpoint`) sets the bar
        # two looks of 2 trials: the fewest a sequential run takes (a one-look run is refused)
        argv = _set(_set(_set(argv, "--lengths", "800,1600"), "--look", "2"), "--budget", "2m")
        trials = "4"
    elif "--baseline" in argv:   # a length past L (1024 here: `long_checkpoint`), where the baseline is asked
        argv = _set(argv, "--lengths", "1600")
    else:
        argv = _set(argv, "--lengths", "800")
    argv = _set(argv, "--depths", "1")
    argv = _set(argv, "--trials", trials)
    return argv + ["--model", str(model), "--out", str(out), "--no-progress", "--no-plot"]


def long_checkpoint(path: Path) -> Path:
    """The tiny model with a trained length of 1024 (the character tokenizer's prompts of 800
    tokens fit within it) and the character tokenizer."""
    return tiny_checkpoint(path, max_position_embeddings=1024)


def test_the_doc_shows_commands():
    names = [c[0] for c in commands(DOC)]
    assert names.count("retrieval") >= 2 and "lm-eval" in names and "passkey" in names
    sequential = commands(SEQUENTIAL)
    assert len(sequential) >= 3 and all("--sequential" in c or "--budget" in c for c in sequential)


def test_every_retrieval_page_is_read():
    """A page split off a retrieval page (docs/retrieval*.md) joins the pages whose commands run."""
    assert set(PAGES) == {p.name for p in (ROOT / "docs").glob("retrieval*.md")}
    assert all(commands(text) for text in PAGES.values())


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(commands())))
def test_doc_command_runs(index, tmp_path, monkeypatch):
    argv = commands()[index]
    longer = "--sequential" in argv or "--budget" in argv or "--baseline" in argv
    model = (long_checkpoint if longer else tiny_checkpoint)(tmp_path / "tiny")
    if argv[0] == "lm-eval":
        pytest.importorskip("lm_eval")
        monkeypatch.chdir(ROOT)    # the local task's data path is relative to the repository
    if "vllm" in argv:             # retrieval on the stand-in vLLM (test_retrieval_vllm.py)
        fake = ROOT / "tests" / "fake_vllm"
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
        monkeypatch.setenv("FAKE_VLLM_LOG", str(tmp_path / "vllm.jsonl"))
    if "hf-posext-vllm" in argv:   # lm-eval on vLLM: checked here, handed to vLLM's python (a stub)
        stub = tmp_path / "python"
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
        monkeypatch.setenv("HF_POSEXT_VLLM_PYTHON", str(stub))
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


REPORT = ROOT / "benchmarks" / "results" / "retrieval-2x"


def _real_ruler_run(tmp_path: Path, monkeypatch, tasks: str, limit: int) -> Path:
    """lm-eval's own RULER tasks, offline, on a tiny random Llama with the embedded tokenizer's
    vocabulary (RULER builds its prompts with the real tokenizer); returns --output_path."""
    pytest.importorskip("lm_eval")
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posext.data.embedded import load_tokenizer
    tok = load_tokenizer()
    model_dir, tok_dir = tmp_path / "model", tmp_path / "tok"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
                     ).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    tok.save_pretrained(tok_dir)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    argv = ["lm-eval", "--model", "hf-posext", "--model_args",
            f"pretrained={model_dir},tokenizer={tok_dir},method=yarn,factor=2,max_length=1024,dtype=float32",
            "--tasks", tasks, "--metadata", '{"max_seq_lengths":[1024]}', "--limit", str(limit),
            "--gen_kwargs", "max_gen_toks=4", "--device", "cpu", "--output_path", str(tmp_path / "lm"),
            "--log_samples"]
    assert cli.main(argv) == 0
    return tmp_path / "lm"


@pytest.mark.slow
def test_lm_eval_records_are_kept_from_a_real_niah_run(tmp_path, monkeypatch):
    """lm-eval's own niah_single_1 (offline: RULER's noise haystack); the report keeps its
    samples without their prompts and puts them beside the built-in suite's rows."""
    _real_ruler_run(tmp_path, monkeypatch, "niah_single_1", 2)
    out = tmp_path / "grid"
    out.mkdir()
    kept = json.loads(report.import_lm_eval([tmp_path / "lm"], out, "the command").read_text())
    assert kept["command"] == "the command"
    run = kept["runs"][0]
    assert run["model_args"]["method"] == "yarn" and len(run["samples"]) == 2
    for s in run["samples"]:
        assert s["max_length"] == 1024 and 900 < s["tokens"] <= 1024 and 0 <= s["depth"] <= 1
        assert re.fullmatch(r"\d{7}", s["target"][0]) and s["score"] in (0.0, 1.0)
    assert "input" not in json.dumps(run["samples"])              # no prompt kept
    rows = [{"method": "yarn", "task": t, "length": 1024, "depth": d, "correct": 1, "trials": 2}
            for t in ("single_needle", "niah_single") for d in (0.0, 1.0)]
    rows[-1]["correct"] = 2
    table = report.side_by_side(rows, kept)
    assert "`single_needle` (depths 0, 1)" in table[0] and table[1].count("---") == 5
    assert table[2].startswith("| 1k | 2/4 = 0.50 [") and "| 3/4 = 0.75 [" in table[2]
    assert f"| {sum(s['score'] for s in run['samples']):g}/2 = " in table[2]


@pytest.mark.slow
def test_lm_eval_records_of_the_other_offline_ruler_tasks(tmp_path, monkeypatch):
    """Every RULER task the report says needs no network runs offline under lm-eval (here on a
    tiny model); the report keeps each task's samples without prompts, and its table puts
    each beside the built-in counterpart's rows (a dash where there is none)."""
    lm = _real_ruler_run(tmp_path, monkeypatch, ",".join(report.RULER_TASKS), 1)
    out = tmp_path / "grid"
    out.mkdir()
    kept = json.loads(report.import_lm_eval_ruler([lm], out, "the command").read_text())
    run = kept["runs"][0]
    assert set(run["tasks"]) == set(report.RULER_TASKS) and "input" not in json.dumps(run)
    for task in run["tasks"].values():
        (s,) = task["samples"]
        assert s["max_length"] == 1024 and 0 < s["tokens"] <= 1024 and s["target"] and 0 <= s["score"] <= 1
    rows = [{"method": "yarn", "task": "variable_tracking", "length": 1024, "score": 0.6, "correct": 1, "trials": 2},
            {"method": "yarn", "task": "variable_tracking", "length": 1024, "score": 0.2, "correct": 0, "trials": 3},
            {"method": "none", "task": "multi_key", "length": 1024, "score": 1.0, "correct": 2, "trials": 2}]
    table = report.ruler_lines(rows, kept)
    assert table[0].count("1k") == 2 and len(table) == 2 + len(report.RULER_TASKS)
    vt = next(line for line in table if line.startswith("| `ruler_vt`"))
    assert vt.endswith("| `variable_tracking` | 0.36 (1/5 whole) |")        # (1.2 + 0.6) / 5
    assert next(line for line in table if "`niah_multikey_2`" in line).endswith("| not run |")   # yarn only
    assert next(line for line in table if "`ruler_cwe`" in line).endswith("| none | — |")
    with pytest.raises(ValueError, match="ran no niah_multikey_2, .*ruler_fwe; run every one"):
        report.import_lm_eval_ruler([_only_niah(tmp_path, monkeypatch)], out, "the command")


def _only_niah(tmp_path: Path, monkeypatch) -> Path:
    return _real_ruler_run(tmp_path / "niah", monkeypatch, "niah_single_1", 1)


@pytest.mark.slow
@pytest.mark.skipif(not (REPORT / "report.md").exists(), reason="the grid's results are not committed")
def test_committed_retrieval_report_is_its_rows_and_the_readme_quotes_it(tmp_path):
    """report.md is what the script makes of the committed rows and lm-eval records (run as a
    user runs it, on a copy); docs/retrieval_measurements.md quotes its summary and its side-by-side
    tables line for line."""
    import shutil
    import subprocess
    for name in ("retrieval.json", "lm_eval_niah_single_1.json", "lm_eval_ruler.json"):
        if (REPORT / name).exists():
            shutil.copy(REPORT / name, tmp_path / name)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "retrieval_report.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert done.returncode == 0, done.stderr
    made = (tmp_path / "report.md").read_text()
    assert made == (REPORT / "report.md").read_text()
    readme = MEASUREMENTS
    summary = re.search(r"<!-- retrieval-summary -->\n(```\n.*?```)", made, re.S).group(1)
    assert summary in readme
    for head in (r"\| yarn s=2", r"\| lm-eval task \(RULER\)"):
        table = re.search(rf"^{head}.*?\n\n", made, re.S | re.M)
        assert table is None or table.group(0).strip() in readme

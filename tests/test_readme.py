"""The README's quick start works as written, CI runs the README's test command, the README stays a
five-minute read, and the result tables of docs/results.md are the committed rows."""

import re
from pathlib import Path

import pytest

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
    assert len(lines) <= 12


@pytest.mark.slow
def test_quickstart_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(quickstart(), "README.md:quickstart", "exec"), namespace)
    assert "yarn 16384" in capsys.readouterr().out
    import hf_posext
    from hf_posext.rope.compat import get_rope_parameters

    reloaded = namespace["reloaded"]
    assert not hf_posext.is_patched(reloaded)
    assert get_rope_parameters(reloaded.config)["rope_type"] == "yarn"
    assert (tmp_path / "smollm2-yarn-16k" / "model.safetensors").is_file()


def test_ci_runs_the_readme_test_command():
    command = re.search(r"^(make test)\s+# the test command", README, re.M).group(1)
    assert command in (ROOT / ".ci" / "run").read_text()


def test_readme_is_a_five_minute_read():
    """The README says what it is, how to install, test and start, and links the rest (issue #28):
    narratives and full result tables live in docs/."""
    assert len(README.splitlines()) <= 250


def test_results_page_demo_table_is_the_benchmark_report():
    """The long-context demo table in docs/results.md is computed from the committed results of
    `python benchmarks/long_context.py demo` by the benchmark's report, never typed in."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("long_context_report",
                                                  ROOT / "benchmarks" / "long_context_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    rows = json.loads((EVAL_DIR / "long-context" / "perplexity.json").read_text())["rows"]
    assert {int(r["length"]) for r in rows} == {16384, 32768}
    assert report.demo_table(rows) in RESULTS_PAGE
    assert report.demo_table(rows) in (ROOT / "benchmarks" / "results" / "long_context.md").read_text()


def test_results_page_quick_demo_table_is_the_committed_run():
    """The quick demo's table in docs/results.md is what `hf-posext eval` prints for the committed
    rows of `make demo` (benchmarks/results/eval/quick-demo), never typed in."""
    import json

    from hf_posext.evaluation.results import format_table

    rows = json.loads((EVAL_DIR / "quick-demo" / "perplexity.json").read_text())["rows"]
    assert {int(r["length"]) for r in rows} == {4096, 16384} and {r["docs"] for r in rows} == {2}
    # every row holds its position buckets; the 4k cells came from the 16k forwards
    assert all(r["bucket_nll"] for r in rows)
    assert {r["forward_length"] for r in rows if r["protocol"] == "truncate"} == {16384}
    assert format_table(rows) in RESULTS_PAGE

"""The Makefile targets the README names really run: each target's own recipe line, through
`make`, with its `*_ARGS` variable appending flags for a tiny model and tiny lengths where the
documented run is long (the last value of a flag wins, so the documented flags are all parsed and
used). `make -o $(VENV)/.installed` skips the install step: this interpreter's venv is the one
`make install` built. `ddp-smoke` and `portability-table` run exactly as documented."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from _recipekit import ROOT, SUBPROCESS_ENV, make_assets, recipe_argv
from hf_posext.evaluation.shared.record import read_rows

VENV = Path(sys.executable).parent.parent
# the README and the pages it links: where the targets are named and the tables pasted
DOCS = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def make(target: str, tmp_path: Path, **variables: list[str]) -> subprocess.CompletedProcess:
    """`make TARGET` from the repository root, VARIABLE=flags for each keyword."""
    cmd = ["make", "--no-print-directory", "-o", str(VENV / ".installed"), f"VENV={VENV}", target]
    cmd += [f"{k}={shlex.join(v)}" for k, v in variables.items()]
    # not the outer make's variables (`make test-tf4` passes VENV, TRANSFORMERS, ... in MAKEFLAGS)
    env = {k: v for k, v in SUBPROCESS_ENV.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    proc = subprocess.run(cmd, cwd=ROOT, env={**env, "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"), archs=("llama",))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_names_these_targets():
    named = set(re.findall(r"`make ([a-z-]+)`|^make ([a-z-]+)", DOCS, re.M))
    named = {a or b for a, b in named}
    assert {"demo", "bench", "demo-finetune", "ddp-smoke", "portability-table", "bench-long"} <= named


def test_every_name_the_4x_run_leaves_out_is_a_test_here():
    """`make test-tf4` leaves tests out by name (TF4_SKIP, `-k`): a misspelt or renamed name would
    keep nothing out and say nothing, so each must still name a test module or a test here."""
    text = (ROOT / "Makefile").read_text()
    skip = re.search(r"^TF4_SKIP = ((?:.*\\\n)*.*)$", text, re.M)
    assert skip, "TF4_SKIP is not in the Makefile"
    names = re.findall(r"not (\w+)", skip.group(1))
    tests = ROOT / "tests"
    defined = {m for f in tests.glob("test_*.py") for m in re.findall(r"^def (test_\w+)", f.read_text(), re.M)}
    for name in names:
        assert (tests / f"{name}.py").is_file() or any(d.startswith(name) for d in defined), name


@pytest.mark.slow
def test_ddp_smoke_two_ranks(tmp_path):
    """In full: 2 ranks over gloo, 3 steps of the recipe's loop; both ranks saw world size 2."""
    out = make("ddp-smoke", tmp_path, DDP_ARGS=["--main_process_port", str(_free_port())]).stdout
    for rank in (0, 1):
        assert re.search(rf"^rank {rank}: world size 2 \(DistributedType.MULTI_CPU, backend gloo\); "
                         r"losses \[[\d.]+, [\d.]+, [\d.]+\]$", out, re.M), out


@pytest.mark.slow
def test_portability_table(tmp_path):
    """In full: it prints the table docs/check.md pastes under its portability-table marker."""
    table = re.search(r"<!-- portability-table:.*?-->\n((?:\|.*\n)+)", DOCS).group(1)
    assert table in make("portability-table", tmp_path).stdout


@pytest.mark.slow
def test_demo(assets, tmp_path):
    """The demo's recipe (both plays, YaRN and DualChunk against the sliding baseline) on the
    tiny random Llama (L = 64) at 64 / 128 tokens instead of SmolLM2 at 4k / 16k."""
    out = tmp_path / "demo"
    make("demo", tmp_path, DEMO_ARGS=["--model", str(assets / "llama"), "--lengths", "64,128",
                                      "--baseline-stride", "32", "--out", str(out)])
    rows = read_rows(out / "perplexity.json")
    assert {int(r["length"]) for r in rows} == {64, 128} and {r["docs"] for r in rows} == {2}
    # the same cells as the committed quick demo (benchmarks/results/eval/quick-demo), at 64 / 128
    assert {(r["method"], r["protocol"], int(r["length"])) for r in rows} == {
        (m, "truncate", n) for m in ("none", "yarn", "dual_chunk") for n in (64, 128)} | {("none", "baseline", 128)}


@pytest.mark.slow
def test_bench(assets, tmp_path):
    """benchmarks/run.py's memory cells (each a fresh process) and the patched-vs-native overhead,
    on the tiny model at 128 tokens, into a temporary folder instead of benchmarks/results."""
    make("bench", tmp_path, BENCH_ARGS=["--model", str(assets / "llama"), "--lengths", "128",
                                        "--overhead-tokens", "64", "--reps", "2", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    assert [r["tokens"] for r in report["memory"]] == [128]
    # same weights, same rope: the patched and the native yarn forward agree
    assert report["overhead"]["max_abs_logit_diff"] < 1e-4
    assert "## Forward overhead" in (tmp_path / "benchmarks.md").read_text()


@pytest.mark.slow
def test_demo_finetune(assets, tmp_path):
    """The demo recipe's config file, with the tiny model, its documents and 4 steps of 32 tokens
    overriding the model, data and length keys (the method, PoSE and schedule keys stay the YAML's)."""
    out = tmp_path / "run"
    argv = recipe_argv(assets, out, data__bos_token="<s>", data__eos_token="</s>", eval__max_documents="1")
    make("demo-finetune", tmp_path, FINETUNE_ARGS=argv)
    assert (out / "final" / "model.safetensors").is_file()
    results = read_rows(out / "eval" / "results.json")
    assert {int(r["length"]) for r in results} == {64, 256}


@pytest.mark.slow
def test_bench_long(tmp_path):
    """All six steps of `make bench-long` (tune, demo, code, passkey, cost, report) on a tiny
    random Llama that keeps SmolLM2's trained length (8,192, so the benchmark's knobs, e.g.
    window 6144, stay valid) and its tokenizer, at 256 / 512 tokens against a 256-token sliding
    window, every output under --root."""

    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posext.data import embedded

    tok = embedded.load_tokenizer()
    model_dir, root = tmp_path / "model", tmp_path / "root"
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok),
                                 max_position_embeddings=8192, rope_theta=100000.0)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    root.mkdir()
    make("bench-long", tmp_path, BENCH_LONG_ARGS=["--model", str(model_dir), "--root", str(root),
                                                  "--lengths", "256", "512", "--reps", "1", "--window", "256"])
    rows = json.loads((root / "long_context.json").read_text())
    assert {r["step"] for r in rows} == {"sliding", "truncate", "cost"}
    assert {r["tokens"] for r in rows if r["step"] != "cost"} == {256, 512}
    for folder, name in (("long-context", "perplexity"), ("long-context-code", "perplexity"),
                         ("long-context-passkey", "passkey")):
        assert read_rows(root / "eval" / folder / f"{name}.json"), folder
    assert (root / "long_context.md").read_text().startswith("# Long context")
    assert not (root / "README.md").exists()   # the report writes no document

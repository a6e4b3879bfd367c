"""`hf-posext retrieval --engine vllm` against a stand-in vLLM (tests/fake_vllm: it records what
reaches `vllm.LLM` and `generate`): the engine gets `hf-posext serve`'s model, max_model_len and
--hf-overrides for each cell and every pass-through argument, a cell's trials arrive in one call
with the prompts and stop rule of the transformers path; rows carry the engine; the engines never
share a folder; what vLLM does not run exactly is refused in one line before anything loads.
The real vLLM: tests/engines/test_retrieval_engines.py (`make test-engines`)."""

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

import hf_posext.cli as cli
from _evalkit import char_tokenizer, tiny_checkpoint
from hf_posext.commands import model_args
from hf_posext.evaluation.retrieval import build_cell, get_task, noise_haystack
from hf_posext.evaluation.retrieval.vllm_engine import parse_engine_args
from hf_posext.evaluation.shared.record import read_rows

pytestmark = [pytest.mark.usefixtures("one_thread")]
FAKE = Path(__file__).resolve().parent / "fake_vllm"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """The worker runs this python with the stand-in vllm first on its path; returns the log."""
    log = tmp_path / "vllm.jsonl"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    return log


def calls(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()]


def serve_line(capsys, *argv) -> dict:
    """What `hf-posext serve --engine vllm` prints, as LLM keywords."""
    assert cli.main(["serve", *argv, "--engine", "vllm"]) == 0
    line = shlex.split(capsys.readouterr().out.strip())
    out = {"model": line[2], "max_model_len": int(line[line.index("--max-model-len") + 1])}
    if "--hf-overrides" in line:
        out["hf_overrides"] = json.loads(line[line.index("--hf-overrides") + 1])
    return out


def test_every_argument_reaches_the_engine(model_dir, fake_vllm, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(model_args, "load_model_from", lambda args: pytest.fail("transformers loaded"))
    out = tmp_path / "r"
    argv = ["retrieval", "--model", str(model_dir), "--engine", "vllm", "--vllm-python", sys.executable,
            "--methods", "yarn", "--factor", "16", "--lengths", "700", "--depths", "0,1",
            "--trials", "3", "--tensor-parallel-size", "2", "--data-parallel-size", "3",
            "--engine-arg", "max_num_seqs=8", "--engine-arg", "enforce-eager=true",
            "--out", str(out), "--no-progress", "--no-plot"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    log = calls(fake_vllm)
    # one engine per (method, factor): none, then yarn s=16, each as `hf-posext serve` prints it
    # (the none row at 700 > L = 64: serve's length raised to the cell's, plain RoPE), on 3
    # replicas of 2 devices each (vLLM's LLM refuses data_parallel_size > 1: one engine each)
    none = serve_line(capsys, str(model_dir))
    none = {**none, "max_model_len": 700, "hf_overrides": {"max_position_embeddings": 700}}
    yarn = serve_line(capsys, str(model_dir), "--method", "yarn", "--factor", "16")
    passed = {"tensor_parallel_size": 2, "max_num_seqs": 8,
              "enforce_eager": True, "enable_prefix_caching": True, "dtype": "float32", "seed": 0}
    replicas = ["0,1", "2,3", "4,5"]
    engines = [(c["llm"], c["devices"]) for c in log if "llm" in c]
    assert sorted(engines[:3], key=str) == [({**none, **passed}, d) for d in replicas]
    assert sorted(engines[3:], key=str) == [({**yarn, **passed}, d) for d in replicas]
    # each cell: its trials split between the replicas (one each), the prompts and stop rule of
    # the transformers path
    tok = char_tokenizer()
    gens = [c for c in log if "generate" in c]
    assert len(gens) == 4 * 3
    for at, depth in zip(range(0, 12, 3), [0.0, 1.0, 0.0, 1.0]):
        shares = sorted(gens[at:at + 3], key=lambda c: c["devices"])
        assert [c["devices"] for c in shares] == replicas
        cell = build_cell(tok, get_task("single_needle"), noise_haystack(tok), 700, depth, range(3))
        assert [p for c in shares for p in c["generate"]] == [cell.prompt(i) for i in range(3)]
        assert [p["max_tokens"] for c in shares for p in c["params"]] == cell.max_new_tokens
        assert all(p["temperature"] == 0.0 and p["stop_token_ids"] == [tok.eos_token_id]
                   for c in shares for p in c["params"])
    rows = read_rows(out / "retrieval.json")
    assert {(r["engine"], r["engine_version"]) for r in rows} == {("vllm", "0.0.fake")}
    assert {"tensor_parallel_size=2", "data_parallel_size=3"} <= set(rows[0]["engine_args"].split(","))
    # the answer: the stand-in's tokens up to the stop id, decoded as the transformers path does
    first = min(gens[:3], key=lambda c: c["devices"])
    last = tok.decode([first["generate"][0][-1]])
    assert rows[0]["outputs"][0] == last * (cell.max_new_tokens[0] - 1)
    # a transformers run never resumes into this folder (nor the reverse)
    monkeypatch.undo()
    code = run_cli(["retrieval", "--model", str(model_dir), "--methods", "yarn", "--factor", "16",
                    "--lengths", "700", "--depths", "0,1", "--trials", "3", "--out", str(out),
                    "--resume", "--no-progress"], capsys)
    assert code[0] == 2 and "holds results of engine vllm" in code[1]


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--methods", "dynamic_ntk"], "dynamic_ntk s=10.9375 at 700: vLLM does not run it exactly"),
    (["--methods", "dual_chunk"], "reads no attention method"),
    (["--methods", "yarn", "--factor", "2"], "vLLM serves yarn s=2 up to 128 tokens"),
    (["--vllm-python", "/no/such/python"], "--vllm-python /no/such/python: no such executable"),
    (["--engine-arg", "model=x"], "--engine-arg model: set by --model"),
    (["--engine-arg", "oops"], "write KEY=VALUE"),
    (["--dtype", "auto"], "--dtype auto is a transformers setting"),
])
def test_refused_before_anything_loads(extra, message, model_dir, fake_vllm, capsys, monkeypatch,
                                       tmp_path):
    monkeypatch.setattr(model_args, "load_model_from", lambda args: pytest.fail("the model was loaded"))
    argv = ["retrieval", "--model", str(model_dir), "--engine", "vllm", "--vllm-python", sys.executable,
            "--lengths", "700", "--methods", "yarn", "--out", str(tmp_path / "o"), *extra]
    code, err = run_cli(argv, capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists() and not fake_vllm.exists()   # no engine started


def test_engine_flags_need_the_engine(model_dir, capsys, tmp_path):
    code, err = run_cli(["retrieval", "--model", str(model_dir), "--tensor-parallel-size", "2",
                         "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "--tensor-parallel-size only apply with --engine vllm" in err


def test_engine_args_are_read_as_json():
    assert parse_engine_args(["max_num_seqs=8", "--enforce-eager=true", "kv_cache_dtype=fp8",
                              "limit_mm_per_prompt={\"image\": 0}"]) == {
        "max_num_seqs": 8, "enforce_eager": True, "kv_cache_dtype": "fp8",
        "limit_mm_per_prompt": {"image": 0}}


def test_cells_within_L_and_the_prefix_cache_flag(model_dir, tmp_path):
    from hf_posext.evaluation.retrieval.vllm_engine import VllmEngine
    engine = VllmEngine(model_dir, python=sys.executable, prefix_caching=False)   # --no-prefix-reuse
    within = engine.engine_kwargs("none", 1.0, {}, 64)
    assert within["max_model_len"] == 64 and "hf_overrides" not in within   # serve's: nothing to override
    assert within["enable_prefix_caching"] is False


def test_an_extended_checkpoint_is_refused(tmp_path):
    """The grid's `none` row is the base: vLLM gets the unmodified checkpoint (serve's route)."""
    import hf_posext
    from _evalkit import tiny_model
    from hf_posext.evaluation.retrieval.vllm_engine import VllmEngine
    model = tiny_model()
    hf_posext.patch(model, "yarn", 4.0)
    model.save_pretrained(tmp_path / "yarn")
    with pytest.raises(ValueError, match="is already extended .*pass the base folder"):
        VllmEngine(tmp_path / "yarn", python=sys.executable)


def test_data_parallel_replicas_get_their_own_devices(model_dir, monkeypatch):
    """--data-parallel-size N: N engines (vLLM's LLM refuses data_parallel_size > 1 in one
    process), replica i on devices i·tp .. (i+1)·tp − 1 of CUDA_VISIBLE_DEVICES; too few devices
    is refused before any worker starts."""
    from hf_posext.evaluation.retrieval.vllm_engine import VllmEngine
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    engine = VllmEngine(model_dir, python=sys.executable, tensor_parallel_size=2, data_parallel_size=2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in engine.replica_env] == ["4,5", "6,7"]
    assert "data_parallel_size" not in engine.engine_kwargs("none", 1.0, {}, 64)
    with pytest.raises(ValueError, match="--data-parallel-size 3 × --tensor-parallel-size 2 needs 6 "
                                         "devices; CUDA_VISIBLE_DEVICES names 4"):
        VllmEngine(model_dir, python=sys.executable, tensor_parallel_size=2, data_parallel_size=3)

"""The retrieval suite on vLLM against transformers + hf_posext (`make test-engines`): on the
harness's tiny random Llama (measure.py: L = 256, s = 4, float32), the same retrieval cells give
the same greedy answers on both engines (`evaluate_retrieval` with and without
`engine=VllmEngine`), and on the engine each cell ran, the per-position prompt logprobs of a
3.5·L prompt agree with the patched model within the harness's vLLM threshold. Skipped without
.venv-vllm (failed in CI), like test_engines.py."""

import os

import measure
import pytest
import torch

import hf_posext
from hf_posext.data import embedded
from hf_posext.evaluation.retrieval import RetrievalGrid, evaluate_retrieval
from hf_posext.evaluation.retrieval import vllm_engine

pytestmark = pytest.mark.engines
VENV = ".venv-vllm"
METHODS = ("yarn", "linear")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if VENV in measure.missing_venvs():
        if os.environ.get("CI") == "true":
            pytest.fail(f"engine venv missing in CI: {VENV} (make engine-venvs)")
        pytest.skip(f"engine venv missing: {VENV} (make engine-venvs)")
    work = tmp_path_factory.mktemp("retrieval-vllm")
    tok = embedded.load_tokenizer()
    model = measure.base_model(tok)
    model.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    return work / "base", model, tok


def test_same_answers_and_logprobs_on_both_engines(setup):
    folder, model, tok = setup
    torch.set_num_threads(2)
    grid = RetrievalGrid(list(METHODS), [900], depths=[0.0, 0.5], trials=3,
                         factors=[measure.FACTOR])
    reference = evaluate_retrieval(model, tok, grid, progress=False)
    engine = vllm_engine.VllmEngine(folder, python=str(measure.venv_python(VENV)),
                                    engine_args={"enforce_eager": True},
                                    env={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"})
    try:
        rows = evaluate_retrieval(vllm_engine.planning_model(folder), tok, grid, engine=engine,
                                  progress=False)
        assert [r["engine"] for r in rows] == ["vllm"] * len(rows)
        assert rows[0]["engine_version"].startswith("0.")
        differ = [(r["method"], r["depth"], a["outputs"], r["outputs"])
                  for a, r in zip(reference, rows) if a["outputs"] != r["outputs"]]
        assert len(rows) == len(reference) == 6 and not differ, differ
        assert len({r["key"] for r in rows} & {a["key"] for a in reference}) == 0
        # per-position logprobs on the engine each method's cells ran
        ids = measure.prompt_ids(tok)
        plain = measure.logprobs(model, ids)
        for method in reversed(METHODS):     # linear's engine is the one still up
            kwargs = engine.engine_kwargs(method, measure.FACTOR, {}, 900)
            got = engine.logprobs(kwargs, ids)
            patched = measure.base_model(tok)
            patched.load_state_dict(model.state_dict())
            hf_posext.patch(patched, method, measure.FACTOR)
            cell = measure.decide({"logprobs": got, "stage": None, "error": None},
                                  measure.logprobs(patched, ids), plain, measure.THRESHOLD["vllm"])
            assert cell["verdict"] == "exact", (method, cell)
    finally:
        engine.close()


def test_lm_eval_on_vllm_answers_as_transformers(setup, tmp_path, monkeypatch):
    """`hf-posext lm-eval --model hf-posext-vllm` (run in .venv-vllm, lm-eval installed there:
    `make .venv-vllm/.lmeval`) generates what `--model hf-posext` generates with the model
    patched in transformers, on a local generation task."""
    import json

    import hf_posext.cli as cli

    folder, _, _ = setup
    root = measure.ROOT
    monkeypatch.chdir(root)            # the local task's data path is relative to the repository
    monkeypatch.setenv("HF_POSEXT_VLLM_PYTHON", str(measure.venv_python(VENV)))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    generated = {}
    for model, extra in (("hf-posext-vllm", ",enforce_eager=True"), ("hf-posext", "")):
        out = tmp_path / model
        argv = ["lm-eval", "--model", model, "--model_args",
                f"pretrained={folder},method=yarn,factor={measure.FACTOR:g},dtype=float32{extra}",
                "--tasks", "tiny_gen", "--include_path", str(root / "tests" / "lm_eval_tasks"),
                "--limit", "3", "--log_samples", "--output_path", str(out), "--batch_size", "1"]
        assert cli.main(argv) == 0
        samples = sorted(out.rglob("samples_tiny_gen_*.jsonl"))
        assert samples, f"{model}: no samples written under {out}"
        generated[model] = [json.loads(x)["resps"] for x in samples[-1].read_text().splitlines()]
    assert len(generated["hf-posext"]) == 3
    assert generated["hf-posext-vllm"] == generated["hf-posext"]


def test_data_parallel_replicas_and_engine_args_reach_vllm(setup):
    """--data-parallel-size 2: two real engines (vLLM's LLM refuses data_parallel_size > 1 in
    one process), a cell's trials split between them, the answers those of transformers; an
    --engine-arg reaches vLLM's own EngineArgs, which refuses an unknown one before loading."""
    folder, model, tok = setup
    torch.set_num_threads(2)
    grid = RetrievalGrid(["yarn"], [900], depths=[0.5], trials=3, factors=[measure.FACTOR],
                         skip=[("none", 900, 1.0)])
    reference = evaluate_retrieval(model, tok, grid, progress=False)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    python = str(measure.venv_python(VENV))
    engine = vllm_engine.VllmEngine(folder, python=python, data_parallel_size=2,
                                    engine_args={"enforce_eager": True, "max_num_seqs": 4}, env=env)
    try:
        rows = evaluate_retrieval(vllm_engine.planning_model(folder), tok, grid, engine=engine,
                                  progress=False)
        assert len(engine._workers) == 2 and all(w.proc.poll() is None for w in engine._workers)
        assert [r["outputs"] for r in rows] == [r["outputs"] for r in reference]
        assert "data_parallel_size=2" in rows[0]["engine_args"].split(",")
    finally:
        engine.close()
    bad = vllm_engine.VllmEngine(folder, python=python, engine_args={"no_such_engine_arg": 1}, env=env)
    try:
        bad.plan(grid.cells(measure.L))
        with pytest.raises(RuntimeError, match="vLLM: .*no_such_engine_arg"):
            bad.check()
    finally:
        bad.close()

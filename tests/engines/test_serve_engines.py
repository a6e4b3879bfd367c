"""The commands `hf-posext serve` prints, run in the real engines (`make test-engines`).

For each checkpoint (saved by patch + save_pretrained) and each base checkpoint extended at serve
time (`--method M --factor 4`), the printed command line is handed to the engine as a user would
type it: vLLM through its own argument parser (`EngineArgs.add_cli_args` / `from_cli_args`:
model, --max-model-len, --hf-overrides), without VLLM_ALLOW_LONG_MAX_MODEL_LEN; llama.cpp with the
llama-server flags mapped to llama_cpp.Llama keywords (_run_llamacpp.py `FLAGS`), on the GGUF its
converter writes of the folder. The engine's per-position prompt logprobs must match
transformers + hf_posext (the patched model) within the harness's threshold at every position
of a 3.5·L prompt (measure.decide); a command whose run disagrees fails. Skipped without the
engine venvs (failed in CI), like test_engines.py.
"""

import os
import shlex

import measure
import pytest

import hf_posext
from hf_posext.data import embedded
from hf_posext.portability.serving import command
from hf_posext.rope.config import RopeExtensionConfig
from hf_posext.rope.longrope import LONGROPE_SEED, longrope_knobs

pytestmark = pytest.mark.engines
# Kept small (each command is one engine start): saved linear (vLLM derives s²·L, the command
# still serves s·L) and NTK-by-parts (vLLM 0.29 needs an override); the base
# checkpoint extended at serve time by the three static families (a raised base, YaRN, YaRN
# without temperature).
SAVED = ("linear", "ntk_by_parts", "longrope")   # longrope: as `hf-posext search` saves it
SERVE_TIME = ("ntk", "yarn", "ntk_by_parts")
ENGINE = {".venv-vllm": "vllm", ".venv-vllm029": "vllm", ".venv-llamacpp": "llama.cpp"}


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """(prompt ids, references by case, plain-RoPE logprobs, {case: (folder, method)}, work)."""
    work = tmp_path_factory.mktemp("serve")
    tok = embedded.load_tokenizer()
    model = measure.base_model(tok)
    ids = measure.prompt_ids(tok)
    plain = measure.logprobs(model, ids)
    state = model.state_dict()
    model.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    cases, refs = {}, {}
    for method in sorted(set(SAVED) | set(SERVE_TIME)):
        m = measure.base_model(tok)
        m.load_state_dict(state)
        # longrope: YaRN's per-frequency factors stand for searched ones (as in measure.py)
        knobs = longrope_knobs(RopeExtensionConfig(LONGROPE_SEED, measure.FACTOR, measure.L),
                               measure.MODEL["head_dim"], measure.MODEL["rope_theta"]) \
            if method == "longrope" else {}
        hf_posext.patch(m, method, measure.FACTOR, **knobs)
        refs[method] = measure.logprobs(m, ids)
        if method in SAVED:
            m.save_pretrained(work / method)
            tok.save_pretrained(work / method)
            cases[f"saved {method}"] = (work / method, method, None)
        if method in SERVE_TIME:
            cases[f"base + {method} at serve time"] = (work / "base", method, method)
    return ids, refs, plain, cases, work


@pytest.mark.parametrize("venv", list(ENGINE))
def test_serve_commands_run_exactly(served, venv):
    if venv in measure.missing_venvs():
        if os.environ.get("CI") == "true":
            pytest.fail(f"engine venv missing in CI: {venv} (make engine-venvs)")
        pytest.skip(f"engine venv missing: {venv} (make engine-venvs)")
    ids, refs, plain, cases, work = served
    engine = ENGINE[venv]
    runner = "_run_vllm.py" if engine == "vllm" else "_run_llamacpp.py"
    forms, argvs = {}, {}
    # llama.cpp takes a YaRN temperature only from the GGUF key `export --target gguf` writes
    # (serve refuses the converter's GGUF for it: test_serve.py; that export is measured in
    # test_engines.py), and its converter writes no longrope for Llama (serve refuses)
    cases = {k: v for k, v in cases.items()
             if engine == "vllm" or v[1] not in ("ntk_by_parts", "longrope")}
    for n, (_label, (folder, _method, at_serve)) in enumerate(cases.items()):
        serving = command(folder, engine, at_serve, measure.FACTOR if at_serve else None)
        assert serving.length == measure.FACTOR * measure.L
        key = f"job{n}"
        forms[key], argvs[key] = folder, shlex.split(serving.line())
    version, results = measure.run_engine(venv, runner, forms, ids, work, argvs=argvs,
                                          env={"HF_POSEXT_SERVE_COMMANDS": "1"})
    threshold = measure.THRESHOLD[engine]
    wrong = []
    for n, (label, (_folder, method, _)) in enumerate(cases.items()):
        cell = measure.decide(results[f"job{n}"], refs[method], plain, threshold)
        print(f"{engine} {version} {label}: {cell['verdict']}, max |Δ logprob| "
              f"{cell['below_L']} below L, {cell['above_L']} above: {shlex.join(argvs[f'job{n}'])}")
        if cell["verdict"] != "exact":
            wrong.append((label, shlex.join(argvs[f"job{n}"]), cell))
    assert not wrong, f"{engine} {version}: {wrong}"

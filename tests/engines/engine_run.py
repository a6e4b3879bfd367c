"""Running checkpoints in an engine's venv: the runner subprocess (_run_vllm.py, _run_llamacpp.py)
on a set of saved forms, restarted past a job that kills it; where the venvs and llama.cpp's
converter are. measure.py (and the serve / retrieval engine tests) call these."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def venv_python(venv: str) -> Path:
    return ROOT / venv / "bin" / "python"


def run_engine(venv: str, runner: str, forms: dict[str, Path], ids: list[int], work: Path,
               compiled: bool = False, flags: dict | None = None,
               argvs: dict | None = None, env: dict | None = None, *,
               max_len: int) -> tuple[str, dict[str, dict]]:
    """Run `forms` in the engine (vLLM: the HF folders only); a crash of the engine process
    (abort) marks the job it died in `broken` and the rest run in a fresh process. `argvs`: a
    command line (`hf-posext serve`'s) per key, which the runner starts the engine with instead
    of the harness's own settings (test_serve_engines.py). Returns (engine version, results by
    key). `max_len`: vLLM's max_model_len and llama.cpp's n_ctx."""
    todo = [{"id": k, "path": str(p), "gguf_out": str(work / f"{k}.gguf"),
             "flags": (flags or {}).get(k, {}), "argv": (argvs or {}).get(k)}
            for k, p in forms.items() if runner != "_run_vllm.py" or p.is_dir()]
    results, version = {}, None
    if not todo:
        return version, results
    while todo:
        spec = {"ids": ids, "max_model_len": max_len, "n_ctx": max_len, "compiled": compiled,
                "converter": str(converter_path()) if "llamacpp" in runner else None, "jobs": todo}
        (work / "jobs.json").write_text(json.dumps(spec))
        out = work / f"out-{venv}.jsonl"
        out.unlink(missing_ok=True)
        proc = subprocess.run([str(venv_python(venv)), str(HERE / runner), str(work / "jobs.json"),
                               str(out)], capture_output=True, text=True, cwd=work,
                              env={**os.environ, "OMP_NUM_THREADS": "2", **(env or {})})
        lines = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
        version = next((x["version"] for x in lines if "version" in x), version)
        done = [x for x in lines if "id" in x]
        results.update({x["id"]: x for x in done})
        todo = todo[len(done):]
        if todo and proc.returncode == 0:
            raise RuntimeError(f"{runner} stopped early without an error:\n{proc.stderr[-3000:]}")
        if todo:  # the process died in the first job left: that job is broken
            said = [s.strip() for s in proc.stderr.splitlines() if s.strip()]
            why = [s for s in said if re.search(r"what\(\)|Error|error|Abort", s)] or said or [""]
            results[todo[0]["id"]] = {"id": todo[0]["id"], "logprobs": None, "stage": "crash",
                                      "error": f"process died (exit {proc.returncode}): "
                                               + re.sub(r"\S*/\S*", "…", why[-1])[-300:]}
            todo = todo[1:]
    if version is None:
        raise RuntimeError(f"{venv}: the engine did not start: {proc.stderr[-3000:]}")
    return version, results


def converter_path() -> Path:
    sdist = ROOT / ".venv-llamacpp" / "sdist"
    found = sorted(sdist.glob("*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        raise FileNotFoundError(f"no convert_hf_to_gguf.py under {sdist}: run "
                                "`make .venv-llamacpp/.installed`")
    return found[0]

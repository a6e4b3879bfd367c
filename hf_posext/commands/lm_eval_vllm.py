"""`hf-posext lm-eval --model hf-posext-vllm ...`: lm-eval on vLLM with an hf_posext extension
(hf_posext/evaluation/integrations/harness_vllm.py). The model_args are checked here, before anything loads
(serve's derivation needs config.json only); `pretrained` becomes the checkpoint folder vLLM
reads (a GGUF such as the embedded default is written as one first); then lm-eval runs here when
vLLM imports in this Python, else in vLLM's Python ($HF_POSEXT_VLLM_PYTHON, e.g.
.venv-vllm/bin/python with lm-eval installed: `make .venv-vllm/.lmeval`), with this hf_posext
first on its path."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from ..evaluation.shared.inputs import InputError

MODEL_TYPE = "hf-posext-vllm"


def flag_value(argv: list[str], flag: str) -> tuple[int, str] | None:
    """(index in argv of the value, the value) of `flag VALUE` or `flag=VALUE`, else None."""
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            return i + 1, argv[i + 1]
        if item.startswith(flag + "="):
            return i, item.split("=", 1)[1]
    return None


def _model_args(argv: list[str]) -> tuple[int | None, dict]:
    """(index of the --model_args value in argv, its parsed value)."""
    from lm_eval.utils import simple_parse_args_string

    found = flag_value(argv, "--model_args")
    if found is None:
        return None, {}
    at, text = found
    return at, (json.loads(text) if text.lstrip().startswith("{") else simple_parse_args_string(text))


def run_on_vllm(argv: list[str], model: str | None) -> int | None:
    """None unless `--model hf-posext-vllm`; else lm-eval's exit status (run here or in vLLM's
    Python)."""
    if model != MODEL_TYPE:
        return None
    from ..evaluation.integrations.harness_vllm import vllm_model_args
    from ..evaluation.retrieval.vllm_engine import hf_folder, vllm_python

    at, kwargs = _model_args(argv)
    try:
        vllm_model_args(kwargs, weights=False)          # every check, nothing loaded
        here = importlib.util.find_spec("vllm") is not None
        python = None if here else vllm_python()
    except ValueError as err:
        raise InputError(f"--model_args: {err}") from None
    folder = hf_folder(str(kwargs["pretrained"]), kwargs.pop("gguf_file", None))
    argv = list(argv)
    kwargs["pretrained"] = str(folder)
    text = json.dumps(kwargs)
    argv[at] = text if argv[at - 1] == "--model_args" else f"--model_args={text}"
    if here:
        from lm_eval.__main__ import cli_evaluate

        from ..evaluation.integrations.harness_vllm import register
        register()
        saved, sys.argv = sys.argv, ["lm-eval", *argv]
        try:
            cli_evaluate()
        finally:
            sys.argv = saved
        return 0
    root = str(Path(__file__).resolve().parents[2])     # this hf_posext, first on the path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([str(python), "-m", "hf_posext.cli", "lm-eval", *argv], env=env).returncode

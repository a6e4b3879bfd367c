"""The retrieval suite on vLLM (`--engine vllm`, `evaluate_retrieval(..., engine=VllmEngine(...))`;
docs/retrieval.md, "On vLLM").

vLLM lives in its own Python (it pins its own transformers), so a worker process runs it there
(`vllm_worker.py`, by path) and this side sends each cell's prompts as token ids and gets greedy
answers back as token ids, decoded here with the tokenizer the transformers path uses. What the
engine runs for a cell is what `hf-posext serve PATH --engine vllm --method M --factor S` derives
(`portability.serving.command`, called here, not re-derived): its max_model_len and
--hf-overrides; a method serve refuses (attention-level ones, dynamic NTK: `check`'s verdicts)
is refused for the whole grid before anything loads. One addition: the unpatched `none` row past
the trained length L gets `max_position_embeddings` = the cell's length in its overrides (vLLM
sizes its plain-RoPE cos/sin table from it; the frequencies do not depend on it), as the
transformers path runs plain RoPE at any position.

In this process the model is a weightless skeleton (`planning_model`: config and rotary modules,
parameters on the meta device) so that the grid's keys, signatures and patching run unchanged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ...data.embedded import load_model, load_tokenizer, resolve_model
from ...portability.serving import ServeRefused, command
from ...portability.verdicts import load_config, meaning
from ...rope.compat import get_rope_parameters, text_config, write_both_layouts
from ..shared.grid import Cell, knob_text
from ..shared.identity import checkpoint_fingerprint, source_fingerprint

ENGINE = "vllm"
PYTHON_ENV = "HF_POSEXT_VLLM_PYTHON"
WORKER = Path(__file__).with_name("vllm_worker.py")
# LLM keywords the suite sets itself (from --model, --dtype, serve's derivation, --no-prefix-reuse)
OWN_ARGS = {"model": "--model", "max_model_len": "serve's derivation", "hf_overrides":
            "serve's derivation", "dtype": "--dtype", "enable_prefix_caching": "--no-prefix-reuse",
            "tensor_parallel_size": "--tensor-parallel-size",
            "data_parallel_size": "--data-parallel-size"}


def vllm_python(python: str | None = None) -> str:
    """The Python that runs vLLM: `python`, else $HF_POSEXT_VLLM_PYTHON, else this one when vLLM
    imports here. ValueError (one line, with the fix) when none is usable."""
    chosen = python or os.environ.get(PYTHON_ENV)
    if chosen is None:
        if importlib.util.find_spec("vllm") is not None:
            return sys.executable
        raise ValueError("vLLM is not installed in this Python; pass --vllm-python PATH (the "
                         f"python of a venv with vLLM, e.g. .venv-vllm/bin/python from `make "
                         f".venv-vllm/.installed`) or set {PYTHON_ENV}.")
    path = Path(chosen).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ValueError(f"--vllm-python {chosen}: no such executable; give the python of a venv "
                         "with vLLM installed (e.g. .venv-vllm/bin/python).")
    return str(path)


def parse_engine_args(items: Sequence[str] | None) -> dict[str, Any]:
    """`--engine-arg KEY=VALUE` (repeatable) as vLLM LLM keywords: dashes become underscores,
    VALUE is read as JSON when it parses (8, 0.5, true, {"a": 1}), else kept as text."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or not key:
            raise ValueError(f"--engine-arg {item!r}: write KEY=VALUE (e.g. max_num_seqs=8).")
        if key in OWN_ARGS:
            raise ValueError(f"--engine-arg {key}: set by {OWN_ARGS[key]}, not passed through.")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def hf_folder(model: str, gguf_file: str | None = None, weights: bool = True) -> Path:
    """A local checkpoint folder vLLM can load for `model`: the folder itself, or for a GGUF (the
    embedded default) a folder transformers writes once from it, float32 (the weights the
    transformers path runs: it dequantizes the same GGUF), kept under ~/.cache/hf_posext/vllm.
    weights=False: its config.json only (enough to plan the cells before anything loads)."""
    path, gguf = resolve_model(model, gguf_file)
    if not gguf:
        if not (Path(path).expanduser() / "config.json").is_file():
            raise ValueError(f"--model {model}: --engine vllm needs a local checkpoint folder "
                             "(with config.json), or a GGUF file in one.")
        return Path(path).expanduser()
    tag = hashlib.sha256(str(source_fingerprint(model, gguf_file)).encode()).hexdigest()[:16]
    root = Path(os.environ.get("HF_POSEXT_CACHE", Path.home() / ".cache" / "hf_posext")) / "vllm" / tag
    if not weights and not (root / "config.json").exists():
        from transformers import AutoConfig
        _both_layouts(AutoConfig.from_pretrained(path, gguf_file=gguf)).save_pretrained(root)
    if weights and not (root / ".complete").exists():
        print(f"--engine vllm: writing {model} as a checkpoint folder vLLM reads ({root})",
              file=sys.stderr, flush=True)
        loaded = load_model(name=model, gguf_file=gguf_file, dtype=torch.float32)
        _both_layouts(loaded.config)
        loaded.save_pretrained(root)
        load_tokenizer(model, gguf_file).save_pretrained(root)
        (root / ".complete").write_text("written from the GGUF by hf_posext\n")
    return root


def _both_layouts(config):
    """transformers 5 saves only `rope_parameters`; a reader of `rope_theta` would take 10000
    (`hf-posext serve` refuses such a folder): both layouts, as hf_posext saves (compat.py)."""
    write_both_layouts(text_config(config), get_rope_parameters(text_config(config)))
    return config


def planning_model(folder: str | os.PathLike, dtype: str = "float32"):
    """The model as config and rotary modules only (parameters on the meta device; buffers such
    as inv_freq real): what the grid patches, keys and signs, with no weight loaded."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    if (Path(folder) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model.eval()


def stop_ids(model) -> list[int]:
    """The token ids at which the transformers path's greedy `generate` stops (the model's
    generation_config eos_token_id, one id or a list)."""
    eos = model.generation_config.eos_token_id
    return [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


class _Worker:
    """One vLLM worker process (one engine): JSON lines in, JSON lines out; its stderr is ours."""

    def __init__(self, python: str, env: Mapping[str, str]):
        self.proc = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
        self.engine: dict | None = None   # the engine it loaded (after its first generate)
        self.request: dict = {}

    def send(self, request: dict) -> None:
        assert self.proc.stdin is not None
        self.request = request
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass   # receive() reports the stopped worker

    def receive(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the vLLM worker stopped (exit {self.proc.wait()}); its log is above.")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"vLLM: {answer['error']}")
        if self.request["op"] != "check":
            self.engine = self.request["engine"]
        return answer

    def ask(self, request: dict) -> dict:
        self.send(request)
        return self.receive()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class VllmEngine:
    """vLLM for the retrieval suite: `plan` (every cell's engine arguments, refusals), `check`
    (the worker starts; vLLM's version; every argument checked by vLLM's EngineArgs), `answer`
    (a cell's trials, all in one call). `folder`: a base checkpoint folder (`hf_folder`).

    data_parallel_size N: N engine replicas, one worker process each, a cell's trials split
    between them. vLLM's offline `LLM` refuses `data_parallel_size` > 1 in one process
    (vllm/entrypoints/llm.py, 0.29 and 0.32: "not supported for single-process usage ... use
    the explicit multi-process data-parallel example"), which is what this does: each replica
    is a separate engine, given its own `tensor_parallel_size` devices through
    CUDA_VISIBLE_DEVICES (replica i: devices i·tp .. (i+1)·tp − 1 of those visible)."""

    name = ENGINE

    def __init__(self, folder, *, python: str | None = None, dtype: str = "float32",
                 tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                 engine_args: Mapping[str, Any] | None = None, prefix_caching: bool = True,
                 env: Mapping[str, str] | None = None):
        self.folder = str(folder)
        self.python = vllm_python(python)
        for flag, n in (("--tensor-parallel-size", tensor_parallel_size),
                        ("--data-parallel-size", data_parallel_size)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{flag} must be an integer >= 1, got {n!r}.")
        self.replicas = data_parallel_size
        self.common = {"dtype": dtype, "enable_prefix_caching": bool(prefix_caching),
                       "tensor_parallel_size": tensor_parallel_size, "seed": 0,
                       **dict(engine_args or {})}
        # one engine, one process: vLLM's engine core in the worker itself (as tests/engines'
        # harness runs it) saves a second `import vllm` and start-up; several ranks need vLLM's own
        # (a value in the environment wins)
        single = tensor_parallel_size == 1 and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
        self.env = ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if single else {}) | dict(env or {})
        self.replica_env = [self.env]
        if data_parallel_size > 1:   # each replica its own tensor_parallel_size devices
            tp, visible = tensor_parallel_size, os.environ.get("CUDA_VISIBLE_DEVICES")
            devices = visible.split(",") if visible else [str(d) for d in range(data_parallel_size * tp)]
            if len(devices) < data_parallel_size * tp:
                raise ValueError(f"--data-parallel-size {data_parallel_size} × --tensor-parallel-size "
                                 f"{tp} needs {data_parallel_size * tp} devices; CUDA_VISIBLE_DEVICES "
                                 f"names {len(devices)}.")
            self.replica_env = [{**self.env, "CUDA_VISIBLE_DEVICES": ",".join(devices[i * tp:(i + 1) * tp])}
                                for i in range(data_parallel_size)]
        base = meaning(load_config(self.folder))
        if base.spec is not None or base.attention is not None:
            raise ValueError(f"{self.folder} is already extended ({base.label}); on vLLM a retrieval "
                             "grid starts from the unmodified base checkpoint (its `none` row is the "
                             "base): pass the base folder with --methods M --factor S.")
        self.version: str | None = None
        self._fingerprint: str | None = None
        self._workers: list[_Worker] = []
        self._plans: dict[tuple, dict] = {}

    @property
    def fingerprint(self) -> str:
        """The checkpoint folder's content hash (the rows' model_fingerprint)."""
        if self._fingerprint is None:
            self._fingerprint = checkpoint_fingerprint(self.folder)
        return self._fingerprint

    def engine_kwargs(self, method: str, factor: float, knobs: Mapping[str, Any], length: int) -> dict:
        """The vLLM LLM keywords of one cell: `serve`'s model, max_model_len and hf_overrides
        for (method, factor, knobs), then the common ones. ServeRefused when vLLM cannot run it."""
        served = command(self.folder, ENGINE) if method == "none" else \
            command(self.folder, ENGINE, method, float(factor), dict(knobs))
        kwargs: dict[str, Any] = {"model": self.folder, "max_model_len": served.length}
        overrides = dict(served.overrides)
        if length > served.length:
            if method != "none":
                raise ValueError(f"vLLM serves {method} s={factor:g} up to {served.length} tokens "
                                   f"(max_model_len), the cell is {length}: use a factor >= "
                                   f"{length / (served.length / factor):g} or --factor auto")
            overrides["max_position_embeddings"] = length   # plain RoPE past L (module docstring)
            kwargs["max_model_len"] = length
        if overrides:
            kwargs["hf_overrides"] = overrides
        return {**kwargs, **self.common}

    def plan(self, cells: Sequence[Cell]) -> None:
        """Every cell's engine arguments, before anything loads; the first refusal is a ValueError
        naming the cell and check's reason."""
        for cell in cells:
            key = (cell.method, cell.factor, knob_text(cell.knobs), cell.length)
            if key in self._plans:
                continue
            where = f"--engine vllm: {cell.method} s={cell.factor:g} at {cell.length}"
            try:
                self._plans[key] = self.engine_kwargs(cell.method, cell.factor, cell.knobs, cell.length)
            except ServeRefused as err:
                raise ValueError(f"{where}: vLLM does not run it exactly: {err}") from None
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from None

    def identity(self) -> dict:
        """What the rows record and the cell keys hash (so the engines never share a cell)."""
        if self.version is None:
            self.check()
        passed = {k: v for k, v in self.common.items() if k not in ("dtype", "seed")}
        return {"engine": ENGINE, "engine_version": self.version,
                "engine_args": knob_text({**passed, "data_parallel_size": self.replicas})}

    def _start(self, n: int = 1) -> list[_Worker]:
        while len(self._workers) < n:
            self._workers.append(_Worker(self.python, self.replica_env[len(self._workers)]))
        return self._workers[:n]

    def check(self) -> str:
        """Start a worker and have vLLM's EngineArgs check every planned argument set (nothing
        loads); returns vLLM's version."""
        worker = self._start()[0]
        for kwargs in self._plans.values() or [self.common]:
            self.version = worker.ask({"op": "check", "engine": kwargs})["version"]
        return str(self.version)

    def _engines_for(self, kwargs: dict, n: int) -> list[_Worker]:
        if any(w.engine not in (None, kwargs) for w in self._workers):
            self.close()   # one engine per worker process (vllm_worker.py)
        return self._start(n)

    def generate(self, kwargs: dict, prompts: list[list[int]], max_tokens: list[int],
                 stop: list[int]) -> list[list[int]]:
        """Greedy continuations (token ids, ending at a stop id or after max_tokens), the prompts
        split in consecutive shares between the replicas, which run at the same time."""
        n = max(1, min(self.replicas, len(prompts)))
        bounds = [len(prompts) * i // n for i in range(n + 1)]
        workers = self._engines_for(kwargs, n)
        for w, a, b in zip(workers, bounds, bounds[1:]):
            w.send({"op": "generate", "engine": kwargs, "prompts": prompts[a:b],
                    "max_tokens": max_tokens[a:b], "stop": stop})
        return [out for w in workers for out in w.receive()["outputs"]]

    def logprobs(self, kwargs: dict, ids: list[int]) -> list[float | None]:
        """vLLM's per-position prompt logprobs (None at position 0)."""
        return self._engines_for(kwargs, 1)[0].ask({"op": "logprobs", "engine": kwargs,
                                                    "ids": ids})["logprobs"]

    def answer(self, model, tokenizer, cell: Cell, prompts) -> list[str]:
        """The decoded greedy answer of every trial of the cell (all submitted together), stopped
        as the transformers path stops (max new tokens per trial, the model's EOS ids)."""
        self.plan([cell])
        kwargs = self._plans[(cell.method, cell.factor, knob_text(cell.knobs), cell.length)]
        stop = stop_ids(model)
        outs = self.generate(kwargs, [prompts.prompt(i) for i in range(len(prompts.trials))],
                             list(prompts.max_new_tokens), stop)
        texts = []
        for new in outs:
            cut = next((i + 1 for i, t in enumerate(new) if t in stop), len(new))
            texts.append(tokenizer.decode(new[:cut], skip_special_tokens=True))
        return texts

    def close(self) -> None:
        for worker in self._workers:
            worker.close()
        self._workers = []

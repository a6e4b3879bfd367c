"""Run in the llama.cpp venv (no hf_posext there): convert and run checkpoints in llama.cpp.

    .venv-llamacpp/bin/python _run_llamacpp.py JOBS.json OUT.jsonl

JOBS.json: {"ids": [token ids], "n_ctx": N, "converter": path of convert_hf_to_gguf.py,
            "jobs": [{"id", "path": HF folder or .gguf file, "gguf_out": where to convert to,
                      "flags": {llama_cpp.Llama keyword: value} run-time flags}]}
An HF folder goes through llama.cpp's own converter (the one vendored in the llama-cpp-python
sdist, f32), as a user would; a .gguf file (an `export` target writing GGUF) is run as it is.
OUT.jsonl: {"version"} first, then one line per job as in _run_vllm.py (stage "convert" when the
converter raised).
"""

import contextlib
import importlib.util
import json
import sys
import traceback
from pathlib import Path

import llama_cpp
import numpy as np


def last_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    return text[-1][:400] if text else type(err).__name__


def load_converter(path: str):
    # run as a script it would have its folder on sys.path: it imports its `conversion` package
    sys.path.insert(0, str(Path(path).parent))
    spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def convert(converter, folder: str, out: str) -> None:
    """The converter's own command line, called in this process (one torch import for all)."""
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", out, "--outtype", "f32"]
    try:
        converter.main()
    except SystemExit as err:
        if err.code not in (0, None):
            raise RuntimeError(f"convert_hf_to_gguf.py exited with {err.code}") from None
    finally:
        sys.argv = argv


# llama-server's rope flags (llama.cpp common/arg.cpp) as llama_cpp.Llama keywords:
# --rope-scale N is a frequency scale of 1/N; --rope-scaling names a llama_rope_scaling_type.
SCALING = {"none": llama_cpp.LLAMA_ROPE_SCALING_TYPE_NONE,
           "linear": llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR,
           "yarn": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN}
FLAGS = {"-c": ("n_ctx", int), "--rope-scaling": ("rope_scaling_type", SCALING.__getitem__),
         "--rope-scale": ("rope_freq_scale", lambda v: 1.0 / float(v)),
         "--rope-freq-base": ("rope_freq_base", float), "--yarn-orig-ctx": ("yarn_orig_ctx", int),
         "--yarn-attn-factor": ("yarn_attn_factor", float),
         "--yarn-beta-fast": ("yarn_beta_fast", float), "--yarn-beta-slow": ("yarn_beta_slow", float)}


def from_command(argv: list[str]) -> dict:
    """llama.cpp keywords of a `llama-server` command line; -m is the GGUF this runner converts
    from the job's folder (the converter's output, which the command assumes). An unknown flag
    fails the job: the mapping must cover every flag the command uses."""
    assert argv[0] == "llama-server", argv
    out = {}
    for flag, value in zip(argv[1::2], argv[2::2]):
        if flag == "-m":
            continue
        name, convert = FLAGS[flag]
        out[name] = convert(value)
    return out


def run_one(job: dict, ids: list[int], n_ctx: int, converter) -> dict:
    path = job["path"]
    if not path.endswith(".gguf"):
        try:
            convert(converter, path, job["gguf_out"])
        except Exception as err:
            traceback.print_exc()
            return {"id": job["id"], "logprobs": None, "stage": "convert", "error": last_line(err)}
        path = job["gguf_out"]
    try:
        # llama-cpp-python's own defaults for the YaRN knobs (attn factor 1, betas 32/1)
        # override the GGUF's; -1 (and 0 for base/scale/orig ctx) take the model's values
        # (llama.cpp src/llama-context.cpp: `params.x >= 0 ? params.x : hparams.x`).
        # An export may name run-time flags for knobs with no GGUF key (job["flags"]).
        rope = {**dict(rope_freq_base=0.0, rope_freq_scale=0.0, yarn_ext_factor=-1.0,
                       yarn_attn_factor=-1.0, yarn_beta_fast=-1.0, yarn_beta_slow=-1.0,
                       yarn_orig_ctx=0), **job.get("flags", {})}
        if job.get("argv"):   # `llama-server -m M -c N FLAGS...` as `hf-posext serve` prints it
            served = from_command(job["argv"])
            n_ctx = served.pop("n_ctx", n_ctx)
            rope.update(served)
        # float32 KV cache (llama.cpp's default is f16: ~2e-3 nats of noise on this model)
        llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                              logits_all=True, n_threads=2, seed=0, verbose=False,
                              type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                              **rope)
    except Exception as err:
        traceback.print_exc()
        return {"id": job["id"], "logprobs": None, "stage": "load", "error": last_line(err)}
    try:
        llm.eval(ids)
        logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        # row i predicts token i + 1
        lps = [None] + [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
        return {"id": job["id"], "logprobs": lps, "stage": None, "error": None}
    except Exception as err:
        traceback.print_exc()
        return {"id": job["id"], "logprobs": None, "stage": "run", "error": last_line(err)}
    finally:
        with contextlib.suppress(Exception):
            llm.close()


def main(jobs_path: str, out_path: str) -> None:
    spec = json.loads(open(jobs_path).read())
    converter = load_converter(spec["converter"])
    with open(out_path, "a") as out:
        out.write(json.dumps({"version": llama_cpp.__version__}) + "\n")
        out.flush()
        for job in spec["jobs"]:
            print(f"== {job['id']}", file=sys.stderr, flush=True)
            out.write(json.dumps(run_one(job, spec["ids"], spec["n_ctx"], converter)) + "\n")
            out.flush()


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""Run in the vLLM venv (no hf_posext there): prompt logprobs of saved checkpoints.

    .venv-vllm/bin/python _run_vllm.py JOBS.json OUT.jsonl

JOBS.json: {"ids": [token ids], "max_model_len": N, "compiled": false,
            "jobs": [{"id": ..., "path": HF folder}, ...]}
OUT.jsonl gets {"version": vllm.__version__}, then one line per job as it finishes (so a hard crash of this process names the job
it died in): {"id", "logprobs": [per position, None at 0] | None, "stage": "load"|"run"|None,
"error": str | None}. The prompt is passed as token ids, so no tokenizer difference enters.
"""

import contextlib
import gc
import json
import os
import sys
import traceback

# Prompts past the config's derived length are the point of the test (vLLM refuses them
# otherwise); the engine core in this process, so that loading N checkpoints pays no process
# start each and a hard crash is attributed to the job that caused it.
# (Not for the `hf-posext serve` commands: they must run without it, as a user would.)
if os.environ.get("HF_POSEXT_SERVE_COMMANDS") != "1":
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import vllm  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402


def last_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    return text[-1][:400] if text else type(err).__name__


def from_command(argv: list[str]) -> dict:
    """`vllm serve PATH FLAGS...` (as `hf-posext serve` prints it) through vLLM's own argument
    parser (EngineArgs.add_cli_args / from_cli_args): the model, --max-model-len and
    --hf-overrides exactly as `vllm serve` would take them."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    assert argv[:2] == ["vllm", "serve"], argv
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = EngineArgs.from_cli_args(parser.parse_args(["--model", argv[2], *argv[3:]]))
    return dict(model=args.model, max_model_len=args.max_model_len, hf_overrides=args.hf_overrides)


def run_one(job: dict, ids: list[int], max_model_len: int, compiled: bool) -> dict:
    try:
        # a job with a command line: its model, length and overrides; the harness adds only
        # what every cell uses (float32, eager, one sequence)
        served = from_command(job["argv"]) if job.get("argv") else \
            dict(model=job["path"], max_model_len=max_model_len)
        llm = LLM(**served, dtype="float32", enforce_eager=not compiled,
                  max_num_batched_tokens=served["max_model_len"], max_num_seqs=1, seed=0)
    except Exception as err:  # the engine refuses the checkpoint on load
        traceback.print_exc()
        return {"id": job["id"], "logprobs": None, "stage": "load", "error": last_line(err)}
    try:
        params = SamplingParams(prompt_logprobs=0, max_tokens=1, detokenize=False)
        out = llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)[0]
        # prompt_logprobs[i]: {token id: Logprob} for token i given tokens < i (None at 0);
        # with prompt_logprobs=0 the dict holds exactly the prompt's own token
        lps = [None] + [float(out.prompt_logprobs[i][ids[i]].logprob) for i in range(1, len(ids))]
        return {"id": job["id"], "logprobs": lps, "stage": None, "error": None}
    except Exception as err:
        traceback.print_exc()
        return {"id": job["id"], "logprobs": None, "stage": "run", "error": last_line(err)}
    finally:
        # the in-process engine core gc.freeze()s what it allocates and releases it only in
        # its own shutdown (vllm/v1/engine/core.py `EngineCore.shutdown`: gc.unfreeze(),
        # cleanup_dist_env_and_memory()); vLLM 0.29's LLM does not call it when deleted, so
        # each checkpoint kept its ~1 GiB KV cache and the process grew past this machine's
        # memory (killed by the OOM killer mid-run); the next engine's distributed state is
        # clean only after it, too. A failure here does not change the job's numbers.
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def main(jobs_path: str, out_path: str) -> None:
    spec = json.loads(open(jobs_path).read())
    with open(out_path, "a") as out:
        out.write(json.dumps({"version": vllm.__version__}) + "\n")
        out.flush()
        for job in spec["jobs"]:
            print(f"== {job['id']}", file=sys.stderr, flush=True)
            result = run_one(job, spec["ids"], spec["max_model_len"], spec.get("compiled", False))
            out.write(json.dumps(result) + "\n")
            out.flush()


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""The vLLM side of `--engine vllm`: run by path in the Python where vLLM is installed (its own
venv: vLLM pins its own transformers), so it imports nothing of hf_posext — only vllm and the
standard library. `vllm_engine.py` starts it and talks to it in JSON lines:

    -> {"op": "check", "engine": {...}}        <- {"ok": true, "version": "0.32.0"} or {"error": ...}
    -> {"op": "generate", "engine": {...}, "prompts": [[ids]], "max_tokens": [n], "stop": [ids]}
    <- {"outputs": [[ids]], "seconds": t}
    -> {"op": "logprobs", "engine": {...}, "ids": [ids]}   <- {"logprobs": [None, lp1, ...]}

`engine`: the keyword arguments of `vllm.LLM` (model, max_model_len, hf_overrides as `hf-posext
serve` derives them, plus the pass-through ones). "check" builds `EngineArgs` from them, which
refuses an unknown or ill-typed argument without loading anything. One process holds one
engine; the caller starts a new process for other arguments (vLLM's engine core is not torn down
reliably inside one process). Every answer line goes to the original stdout; anything else that
writes to stdout (vLLM's logger, C code) is sent to stderr.
"""

import json
import os
import sys
import time
import traceback

_out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

import vllm  # noqa: E402
from vllm import LLM, EngineArgs, SamplingParams  # noqa: E402


def _reply(obj: dict) -> None:
    _out.write(json.dumps(obj) + "\n")
    _out.flush()


def _error(err: BaseException) -> str:
    lines = [s for s in f"{type(err).__name__}: {err}".splitlines() if s.strip()]
    return (lines[-1] if lines else type(err).__name__)[:500]


def main() -> None:
    llm, held = None, None
    for line in sys.stdin:
        request = json.loads(line)
        engine = request.get("engine") or {}
        try:
            if request["op"] == "check":
                EngineArgs(**engine)
                _reply({"ok": True, "version": vllm.__version__})
                continue
            if llm is None:
                llm, held = LLM(**engine), engine
            elif engine != held:
                raise ValueError("this worker holds another engine; start a new one")
            started = time.perf_counter()
            if request["op"] == "generate":
                # greedy, the caller's stop ids only (ignore_eos: vLLM's own EOS and the
                # generation_config's are not added, transformers' rule is what `stop` holds)
                params = [SamplingParams(temperature=0.0, max_tokens=n, stop_token_ids=request["stop"],
                                         ignore_eos=True, detokenize=False, seed=0)
                          for n in request["max_tokens"]]
                # every trial of the cell in one call: vLLM batches them, and with prefix caching
                # the KV-cache blocks of their shared prefix are computed once
                outs = llm.generate([{"prompt_token_ids": ids} for ids in request["prompts"]],
                                    params, use_tqdm=False)
                _reply({"outputs": [list(o.outputs[0].token_ids) for o in outs],
                        "seconds": time.perf_counter() - started})
            elif request["op"] == "logprobs":
                ids = request["ids"]
                params = SamplingParams(prompt_logprobs=0, max_tokens=1, detokenize=False)
                out = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]
                # prompt_logprobs[i]: {token id: Logprob} of token i given tokens < i (None at 0)
                _reply({"logprobs": [None] + [float(out.prompt_logprobs[i][ids[i]].logprob)
                                              for i in range(1, len(ids))],
                        "seconds": time.perf_counter() - started})
            else:
                raise ValueError(f"unknown op {request['op']!r}")
        except Exception as err:  # noqa: BLE001 - the caller reports it in one line
            traceback.print_exc()
            _reply({"error": _error(err)})


if __name__ == "__main__":
    main()

"""A stand-in for vLLM (tests/test_retrieval_vllm.py): put this folder first on PYTHONPATH and
hf_posext's vllm_worker.py imports it instead. It records every LLM(...) and generate(...) call
as JSON lines in $FAKE_VLLM_LOG and answers each prompt greedily by repeating the prompt's last
token up to `max_tokens`, the last of them the first stop id (so the caller's stop rule and
decoding show). Each entry names the process's CUDA_VISIBLE_DEVICES (a data-parallel replica's
devices). As vLLM's own `LLM` (vllm/entrypoints/llm.py, 0.29 and 0.32), it refuses
data_parallel_size > 1 in one process."""

import json
import os

__version__ = "0.0.fake"
# EngineArgs' fields the tests pass (vLLM's own class has ~200; an unknown one raises TypeError)
FIELDS = {"model", "max_model_len", "hf_overrides", "dtype", "enable_prefix_caching",
          "tensor_parallel_size", "data_parallel_size", "seed", "max_num_seqs", "enforce_eager",
          "gpu_memory_utilization", "kv_cache_memory_bytes"}


def _log(entry):
    with open(os.environ["FAKE_VLLM_LOG"], "a") as f:
        f.write(json.dumps(entry) + "\n")


class EngineArgs:
    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - FIELDS)
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument '{unknown[0]}'")


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class _Completion:
    def __init__(self, token_ids):
        self.token_ids = token_ids


class _Output:
    def __init__(self, token_ids):
        self.outputs = [_Completion(token_ids)]


def _devices():
    return os.environ.get("CUDA_VISIBLE_DEVICES")


class LLM:
    def __init__(self, **kwargs):
        if int(kwargs.get("data_parallel_size", 1)) > 1:
            raise ValueError(f"LLM(data_parallel_size={kwargs['data_parallel_size']}) is not "
                             "supported for single-process usage and may hang.")
        EngineArgs(**kwargs)
        _log({"llm": kwargs, "devices": _devices()})

    def generate(self, prompts, params, use_tqdm=True):
        prompts = prompts if isinstance(prompts, list) else [prompts]
        params = params if isinstance(params, list) else [params] * len(prompts)
        _log({"generate": [p["prompt_token_ids"] for p in prompts],
              "params": [p.kwargs for p in params], "devices": _devices()})
        return [_Output([p["prompt_token_ids"][-1]] * (s.kwargs["max_tokens"] - 1)
                        + s.kwargs["stop_token_ids"][:1]) for p, s in zip(prompts, params)]

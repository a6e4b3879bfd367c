"""float32 vs bfloat16 forward time of the embedded SmolLM2-135M on this CPU (the demo
uses the faster one, and says why).

    python benchmarks/archive/dtype_speed.py [--length 4096] [--reps 3]

Prints one row per dtype: the best of `--reps` forwards of `--length` tokens (Hamlet; after a
short warm-up forward, the two dtypes alternating; wall and CPU seconds, and the profiler's time
in the matmuls and SDPA alone), the logits discarded; then what `--dtype auto` picks here for
this model (`fast_dtype` as `hf-posext retrieval` calls it: the GGUF is dequantised at load, so
the kernel probe decides), to show whether the probe agrees with the forward. bfloat16 can only
be fast where the CPU has bf16 matmul instructions (AVX512-BF16, AMX); elsewhere PyTorch converts
and runs slower than float32, and even with them it can be slower (measured on a Xeon
with avx512_bf16 and no AMX). On a loaded machine the whole forward's time is mostly the scheduler's
(each small op waits for a slice): the matmul + SDPA column is then the comparison to read.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from hf_posext.commands.auto_dtype import MIN_SPEEDUP, auto_inputs, fast_dtype
from hf_posext.data import embedded

# the profiler's names for the kernels `auto_dtype.probe_times` times: linears, causal attention
PROBED_OPS = {"aten::mm", "aten::addmm", "aten::bmm"}
PROBED_SDPA = "aten::_scaled_dot_product"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    tok = embedded.load_tokenizer()
    hamlet = next(x for x in embedded.play_paths() if x.stem == "hamlet").read_text()
    ids = torch.tensor([tok(hamlet)["input_ids"][: args.length]])
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    print(f"CPU bf16 instructions: {'avx512_bf16' in flags or 'amx_bf16' in flags}; "
          f"threads {torch.get_num_threads()}; {ids.shape[1]} tokens")
    dtypes = (torch.float32, torch.bfloat16)
    models = {dtype: embedded.load_model(dtype=dtype).eval() for dtype in dtypes}
    wall: dict[torch.dtype, list[float]] = {dtype: [] for dtype in dtypes}
    cpu: dict[torch.dtype, list[float]] = {dtype: [] for dtype in dtypes}
    kernels: dict[torch.dtype, list[float]] = {dtype: [] for dtype in dtypes}
    with torch.no_grad():
        for model in models.values():
            model(ids[:, :32])   # warm-up: oneDNN builds its kernels on a dtype's first call
        for _ in range(args.reps):   # the dtypes alternate, so a change in load falls on both
            for dtype, model in models.items():
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    start, start_cpu = time.perf_counter(), time.process_time()
                    model(ids)
                    wall[dtype].append(time.perf_counter() - start)
                    cpu[dtype].append(time.process_time() - start_cpu)
                kernels[dtype].append(sum(e.self_cpu_time_total for e in prof.key_averages()
                                          if e.key in PROBED_OPS or e.key.startswith(PROBED_SDPA)) / 1e6)
    for dtype in dtypes:
        print(f"| {str(dtype).split('.')[1]} | best {min(wall[dtype]):.2f} s | all "
              f"{', '.join(f'{x:.2f}' for x in wall[dtype])} | CPU {min(cpu[dtype]):.2f} s | "
              f"matmuls + SDPA {min(kernels[dtype]):.2f} s |")
    # the verdict on CPU seconds (all threads): time spent descheduled by other jobs is not in it
    f32, bf16 = min(cpu[torch.float32]), min(cpu[torch.bfloat16])
    forward = "bfloat16" if f32 >= MIN_SPEEDUP * bf16 else "float32"
    k32, k16 = min(kernels[torch.float32]), min(kernels[torch.bfloat16])
    print(f"the forward's matmuls + SDPA (the probe's kernels): bfloat16 takes {k16 / k32:.2f}x "
          "float32's time")
    auto = fast_dtype("cpu", **auto_inputs(embedded.DEFAULT_MODEL))   # prints its probe line (stderr)
    print(f"full forward: bfloat16 takes {bf16 / f32:.2f}x float32's CPU time -> {forward}; "
          f"--dtype auto picks {auto} ({'agrees' if auto == forward else 'DISAGREES'})")


if __name__ == "__main__":
    main()

"""float32 vs bfloat16 forward time of the embedded SmolLM2-135M on this CPU (issue 19: the demo
uses the faster one, and says why).

    python benchmarks/dtype_speed.py [--length 4096] [--reps 3]

Prints one row per dtype: the best of `--reps` forwards of `--length` tokens (Hamlet; after a
short warm-up forward, the two dtypes alternating), the logits discarded, then what `--dtype auto` picks here for this model (`fast_dtype`, as
`hf-posext retrieval` calls it: a GGUF, dequantised at load, so its kernel probe decides), so the
output shows whether the probe agrees with the full forward. bfloat16 can only be fast where the CPU has bf16 matmul instructions
(AVX512-BF16, AMX); elsewhere PyTorch converts and runs slower than float32, and even with them
it can be slower (issue 29: a Xeon with avx512_bf16 and no AMX).
"""

from __future__ import annotations

import argparse
import time

import torch

from hf_posext.commands.auto_dtype import MIN_SPEEDUP, auto_inputs, fast_dtype
from hf_posext.data import embedded


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
    times: dict[torch.dtype, list[float]] = {dtype: [] for dtype in dtypes}
    with torch.no_grad():
        for model in models.values():
            model(ids[:, :32])   # warm-up: oneDNN builds its kernels on a dtype's first call
        for _ in range(args.reps):   # the dtypes alternate, so a change in load falls on both
            for dtype, model in models.items():
                start = time.perf_counter()
                model(ids)
                times[dtype].append(time.perf_counter() - start)
    best = {dtype: min(t) for dtype, t in times.items()}
    for dtype, t in times.items():
        print(f"| {str(dtype).split('.')[1]} | best {best[dtype]:.2f} s | all {', '.join(f'{x:.2f}' for x in t)} |")
    forward = "bfloat16" if best[torch.float32] >= MIN_SPEEDUP * best[torch.bfloat16] else "float32"
    ratio = best[torch.bfloat16] / best[torch.float32]
    auto = fast_dtype("cpu", **auto_inputs(embedded.DEFAULT_MODEL))   # prints its probe line (stderr)
    print(f"full forward: bfloat16 takes {ratio:.2f}x float32's time -> {forward}; "
          f"--dtype auto picks {auto} ({'agrees' if auto == forward else 'DISAGREES'})")


if __name__ == "__main__":
    main()

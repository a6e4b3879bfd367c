"""float32 vs bfloat16 forward time of the embedded SmolLM2-135M on this CPU (issue 19: the demo
uses the faster one, and says why).

    python benchmarks/dtype_speed.py [--length 4096] [--reps 3]

Prints one row per dtype: the best of `--reps` forwards of `--length` tokens (Hamlet), the
logits discarded. bfloat16 is only fast where the CPU has bf16 matmul instructions (AVX512-BF16,
AMX); elsewhere PyTorch converts and runs slower than float32.
"""

from __future__ import annotations

import argparse
import time

import torch

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
    for dtype in (torch.float32, torch.bfloat16):
        model = embedded.load_model(dtype=dtype).eval()
        times = []
        with torch.no_grad():
            for _ in range(args.reps):
                start = time.perf_counter()
                model(ids)
                times.append(time.perf_counter() - start)
        print(f"| {str(dtype).split('.')[1]} | best {min(times):.2f} s | all {', '.join(f'{t:.2f}' for t in times)} |")


if __name__ == "__main__":
    main()

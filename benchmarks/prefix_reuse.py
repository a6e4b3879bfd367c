"""What a retrieval trial costs with its prefix cached: one forward of the whole prompt against
the prefix prefilled once and the suffix run from a copy of its cache (docs/retrieval.md, "Cost").

    python benchmarks/prefix_reuse.py [--length 4096] [--depth 0.5] [--reps 2]

On the embedded SmolLM2-135M over Hamlet, float32, in one process (timings are ratios within one
run: the machines here differ and are sometimes shared). Prints the best of `--reps` of each:
full forward, prefix prefill, cache copy, suffix forward, and suffix / full, the share of a full
prefill each further trial of a cell costs.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch


def best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=4096, help="prompt tokens")
    p.add_argument("--depth", type=float, default=0.5, help="share of the prompt cached (the needle's depth)")
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    if not 0 < args.depth < 1 or args.length < 2 or args.reps < 1:
        p.error("--depth must be in (0, 1), --length >= 2, --reps >= 1")
    from hf_posext.data import embedded
    from hf_posext.evaluation.retrieval.decode import CACHE_KWARG, prefill   # the suite's own prefill
    tok = embedded.load_tokenizer()
    hamlet = next(x for x in embedded.play_paths() if x.stem == "hamlet").read_text()
    ids = torch.tensor([tok(hamlet)["input_ids"][: args.length]])       # [1, T]
    cut = int(args.depth * ids.shape[1])
    model = embedded.load_model(dtype=torch.float32).eval()
    with torch.inference_mode():
        full = best(lambda: model(ids, logits_to_keep=1), args.reps)
        prefix = best(lambda: model(ids[:, :cut], use_cache=True, logits_to_keep=1), args.reps)
        cache = prefill(model, ids[0, :cut].tolist())
        copying = best(lambda: copy.deepcopy(cache), args.reps)
        suffix = best(lambda: model(ids[:, cut:], **{CACHE_KWARG: copy.deepcopy(cache)}, use_cache=True,
                                    logits_to_keep=1), args.reps) - copying
    print(f"{ids.shape[1]} tokens, depth {args.depth} ({cut} cached), best of {args.reps}, "
          f"{torch.get_num_threads()} threads")
    print(f"| full {full:.2f} s | prefix {prefix:.2f} s | copy {copying:.3f} s | suffix {suffix:.2f} s "
          f"| suffix / full {suffix / full:.2f} |")


if __name__ == "__main__":
    main()

"""What a retrieval trial costs with its prefix cached, against one forward of the whole prompt
(docs/retrieval_measurements.md, "Cost"), and what sharing one prefix cache across depths saves.

    python benchmarks/archive/prefix_reuse.py [--length 8192] [--depth 0.5] [--reps 1] [--share-depths 0.25,0.5,0.75]
    python benchmarks/archive/prefix_reuse.py --length 8192 --profile    # torch.profiler's top ops instead

On the embedded SmolLM2-135M over Hamlet, in one process (timings are ratios within one run: the
machines here differ and are sometimes shared; wall and CPU seconds are both printed, the CPU
ones move less when other work shares the cores). Runs `--reps` rounds of every part and prints each one's fastest:
- full: one forward of all `--length` tokens (from scratch: SDPA's `is_causal`);
- prefix: the first `--depth` of them with a cache; fork: what a trial copies of that cache
  (`decode.fork`: new layer objects over the same tensors; a deep copy before);
- suffix (sdpa): the rest over a fork of the cache by transformers' SDPA (a materialised
  lower-right mask: what a trial ran before attention.continuation);
- suffix: the same forward under `attention.continuation` (cached keys unmasked + the new ones
  causal, merged by log-sum-exp), what the suite runs;
- trial: the suite's own trial (`decode.generate_trial` under it, one new token: fork +
  generate + the suffix), the figure targeted at no more than 0.65 of full;
- trial, answer: the same with `--answer-tokens` new tokens (default 8, single_needle's budget in
  the committed grid): the suffix plus that many decode steps over the 8k cache, each on one
  thread (`decode.one_thread_steps`), the fork's layers reserving the trial's whole length
  (`reserved.ReservedLayer`: each step writes its token in place); trial, answer (cache grown by
  cat): the same trial with the fork's layers growing by DynamicLayer's `torch.cat` (a copy of
  the whole cache per layer per step), as a trial ran before; trial, answer (steps on all
  threads): that `generate` call without `one_thread_steps` either, as a trial ran before that;
- sharing (with `--share-depths`): the prefixes of those depths prefilled one by one from
  scratch against `decode.SharedPrefix` extending one cache from depth to depth.
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch


def timed(fn) -> tuple[float, float]:
    """(wall s, CPU s) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=4096, help="prompt tokens")
    p.add_argument("--depth", type=float, default=0.5, help="share of the prompt cached (the needle's depth)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--share-depths", default="", help="comma-separated depths for the sharing figure (empty: skip)")
    p.add_argument("--answer-tokens", type=int, default=8, help="new tokens of the 'trial, answer' part")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--profile", action="store_true",
                   help="print torch.profiler's ops by self CPU time for full, suffix (sdpa) and suffix, once each")
    args = p.parse_args()
    depths = sorted(float(d) for d in args.share_depths.split(",") if d.strip())
    if (not 0 < args.depth < 1 or args.length < 2 or args.reps < 1 or args.answer_tokens < 1
            or any(not 0 < d < 1 for d in depths)):
        p.error("--depth and --share-depths must be in (0, 1), --length >= 2, --reps >= 1, --answer-tokens >= 1")
    from hf_posext.attention.continuation import continuation_attention
    from hf_posext.data import embedded
    from hf_posext.evaluation.retrieval.decode import CACHE_KWARG, SharedPrefix, fork, generate_trial, prefill
    tok = embedded.load_tokenizer()
    hamlet = next(x for x in embedded.play_paths() if x.stem == "hamlet").read_text()
    ids = torch.tensor([tok(hamlet)["input_ids"][: args.length]])       # [1, T]
    cut = int(args.depth * ids.shape[1])
    model = embedded.load_model(dtype=getattr(torch, args.dtype)).eval()
    load = os.getloadavg()[0]
    t: dict[str, list[tuple[float, float]]] = {}
    with torch.inference_mode():
        cache = prefill(model, ids[0, :cut].tolist())

        def suffix():
            model(ids[:, cut:], **{CACHE_KWARG: fork(cache)}, use_cache=True, logits_to_keep=1)

        def trial(new: int = 1, capacity: int | None = None):
            with continuation_attention(model):
                generate_trial(model, tok, ids[0].tolist(), new, cache, capacity=capacity)

        def wide_answer():   # generate_trial's call without decode.one_thread_steps
            x = ids[:, :]
            with continuation_attention(model):
                model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.answer_tokens,
                               do_sample=False, pad_token_id=tok.eos_token_id, **{CACHE_KWARG: fork(cache)})

        def new_suffix():
            with continuation_attention(model):
                suffix()

        parts = {"full": lambda: model(ids, logits_to_keep=1),
                 "prefix": lambda: model(ids[:, :cut], use_cache=True, logits_to_keep=1),
                 "fork": lambda: fork(cache), "deep copy (before)": lambda: copy.deepcopy(cache),
                 "suffix (sdpa)": suffix, "suffix": new_suffix,
                 "trial": trial, "trial, answer": lambda: trial(args.answer_tokens),
                 "trial, answer (cache grown by cat)": lambda: trial(args.answer_tokens, capacity=0),
                 "trial, answer (steps on all threads)": wide_answer}
        if args.profile:
            from torch.profiler import ProfilerActivity, profile
            for k in ("full", "suffix (sdpa)", "suffix"):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    wall = timed(parts[k])[0]
                print(f"{k}: {wall:.2f} s wall under the profiler\n"
                      + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
            return
        for r in range(args.reps):   # rounds of every part: a change of load hits them alike
            for k, fn in parts.items():
                t.setdefault(k, []).append(timed(fn))
                print(f"  round {r + 1} {k}: {t[k][-1][0]:.2f} s wall, {t[k][-1][1]:.2f} s CPU", flush=True)
        fast = {k: min(v) for k, v in t.items()}
        for k in ("suffix (sdpa)", "suffix"):   # the forward alone: its fork taken off
            fast[k] = (fast[k][0] - fast["fork"][0], fast[k][1] - fast["fork"][1])
        shared = None
        if depths:
            cuts = [int(d * ids.shape[1]) for d in depths]
            with continuation_attention(model):
                alone = [timed(lambda c=c: prefill(model, ids[0, :c].tolist())) for c in cuts]
                holder, steps = SharedPrefix(), []
                for c in cuts:
                    steps.append(timed(lambda c=c: holder.cache_of(model, ids[0, :c].tolist(), "embedded")))
                    a = alone[len(steps) - 1]
                    print(f"  prefix to {c}: alone {a[0]:.2f} s wall, {a[1]:.2f} s CPU; extended "
                          f"{steps[-1][0]:.2f} s wall, {steps[-1][1]:.2f} s CPU", flush=True)
            shared = (cuts, alone, steps)
    print(f"{ids.shape[1]} tokens, depth {args.depth} ({cut} cached), best of {args.reps}, "
          f"{torch.get_num_threads()} threads, {args.dtype}, {args.answer_tokens} answer tokens, load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print("| part | wall s | CPU s | / full (wall) | / full (CPU) |\n|---|---|---|---|---|")
    for k, (w, c) in fast.items():
        print(f"| {k} | {w:.2f} | {c:.2f} | {w / fast['full'][0]:.2f} | {c / fast['full'][1]:.2f} |")
    if args.answer_tokens > 1:   # what one greedy step over the whole cache adds
        steps = args.answer_tokens - 1
        print()
        for k in ("trial, answer", "trial, answer (cache grown by cat)", "trial, answer (steps on all threads)"):
            w, c = ((fast[k][i] - fast["trial"][i]) / steps for i in (0, 1))
            print(f"{'' if k == 'trial, answer' else '  '}one decode step (({k} - trial) / {steps}): {w:.3f} s wall, "
                  f"{c:.3f} s CPU, {w / fast['full'][0]:.4f} / {c / fast['full'][1]:.4f} of full")
    if shared:
        cuts, alone, steps = shared
        print(f"\nprefixes at depths {', '.join(map(str, depths))} ({', '.join(map(str, cuts))} tokens):")
        print("| prefill | wall s | CPU s |\n|---|---|---|")
        for name, runs in (("each from scratch", alone), ("extended (SharedPrefix)", steps)):
            w, c = sum(r[0] for r in runs), sum(r[1] for r in runs)
            print(f"| {name} | {w:.2f} | {c:.2f} |")
        ws, cs = sum(r[0] for r in steps), sum(r[1] for r in steps)
        wa, ca = sum(r[0] for r in alone), sum(r[1] for r in alone)
        print(f"| extended / from scratch | {ws / wa:.2f} | {cs / ca:.2f} |")


if __name__ == "__main__":
    main()

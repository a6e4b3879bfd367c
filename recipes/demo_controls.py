"""Controls for the cpu-smollm2-demo figures in recipes/README.md: perplexity of held-out Hamlet
(first L tokens, truncate protocol, hf_posext.evaluation.perplexity.run.truncate_nll) for the unpatched base, the
training-free YaRN s=2 model and both fine-tuned checkpoints (with and without PoSE), at 2k (short
context: shows what fine-tuning on the plays does regardless of length) and 8k for the base.

    flock /tmp/hf_posext_heavy.lock .venv/bin/python recipes/demo_controls.py   # ~2 min, 2 cores
Needs runs/cpu-smollm2-demo/final and runs/cpu-smollm2-demo-nopose/final (see README.md).
"""

import argparse
import json
import math
import time
from pathlib import Path


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pose", type=Path, default=Path("runs/cpu-smollm2-demo/final"),
                   help="the checkpoint fine-tuned with PoSE (default: %(default)s)")
    p.add_argument("--nopose", type=Path, default=Path("runs/cpu-smollm2-demo-nopose/final"),
                   help="the checkpoint fine-tuned without PoSE (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("runs/demo-controls.json"),
                   help="the perplexities written as JSON (default: %(default)s)")
    args = p.parse_args(argv)
    for flag in ("pose", "nopose"):   # before the base model loads
        if not (getattr(args, flag) / "config.json").is_file():
            p.error(f"--{flag} {getattr(args, flag)} is not a saved checkpoint (no config.json): run the "
                    "two fine-tunes of recipes/README.md first, or point the flag at them")
    return args


def main(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from hf_posext import patch
    from hf_posext.data import embedded
    from hf_posext.evaluation.perplexity.run import truncate_nll

    tok = embedded.load_tokenizer()
    play = [p for p in embedded.play_paths() if p.stem == "hamlet"][0]
    ids = tok(play.read_text(), add_special_tokens=False)["input_ids"]
    print("hamlet tokens", len(ids))
    out = {}

    def run(name, model, lengths):
        model.eval()
        for L in lengths:
            t = time.time()
            nll, n = truncate_nll(model, [ids], L, 1024)
            out[f"{name}@{L}"] = math.exp(nll / n)
            print(name, L, round(out[f"{name}@{L}"], 3), f"{time.time()-t:.0f}s", flush=True)

    base = embedded.load_model(dtype=torch.float32, attn_implementation="sdpa")
    run("none (unpatched)", base, [2048, 8192])
    patch(base, "yarn", 2.0)
    run("yarn s=2 training-free", base, [2048])
    del base
    for name, d in [("yarn s=2 fine-tuned, PoSE", args.pose), ("yarn s=2 fine-tuned, no PoSE", args.nopose)]:
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
        run(name, m, [2048])
        del m
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(parse())

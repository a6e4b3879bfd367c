"""Controls for the cpu-smollm2-demo figures in recipes/README.md: perplexity of held-out Hamlet
(first L tokens, truncate protocol, hf_posext.evaluation.truncate_nll) for the unpatched base, the
training-free YaRN s=2 model and both fine-tuned checkpoints (with and without PoSE), at 2k (short
context: shows what fine-tuning on the plays does regardless of length) and 8k for the base.

    flock /tmp/hf_posext_heavy.lock .venv/bin/python recipes/demo_controls.py   # ~2 min, 2 cores
Needs runs/cpu-smollm2-demo/final and runs/cpu-smollm2-demo-nopose/final (see README.md).
"""
import math, json, time, torch
from transformers import AutoModelForCausalLM
from hf_posext import embedded, patch
from hf_posext.evaluation import truncate_nll
tok = embedded.load_tokenizer()
play = [p for p in embedded.play_paths() if p.stem == "hamlet"][0]
ids = tok(play.read_text(), add_special_tokens=False)["input_ids"]
print("hamlet tokens", len(ids))
out = {}
def run(name, model, lengths):
    model.eval()
    for L in lengths:
        t = time.time(); nll, n = truncate_nll(model, [ids], L, 1024)
        out[f"{name}@{L}"] = math.exp(nll / n); print(name, L, round(out[f"{name}@{L}"], 3), f"{time.time()-t:.0f}s", flush=True)
base = embedded.load_model(dtype=torch.float32, attn_implementation="sdpa")
run("none (unpatched)", base, [2048, 8192])
patch(base, "yarn", 2.0)
run("yarn s=2 training-free", base, [2048])
del base
for name, d in [("yarn s=2 fine-tuned, PoSE", "runs/cpu-smollm2-demo/final"),
                ("yarn s=2 fine-tuned, no PoSE", "runs/cpu-smollm2-demo-nopose/final")]:
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
    run(name, m, [2048])
    del m
json.dump(out, open("runs/demo-controls.json", "w"), indent=1)

"""Score one model on the first N tokens of a text with plain transformers only.

Run by benchmarks/search.py in a subprocess (`python benchmarks/plain_score.py '<job json>'`),
so hf_posext is never imported: the row it prints says so (`hf_posext_imported`). The job names
the base model (GGUF), the text, and either a checkpoint folder (optionally with its longrope
`short_factor` replaced by ones: LongRoPE's separate short set as plain RoPE) or a YaRN factor
that transformers builds from its own `yarn` config; it prints one JSON row of mean NLLs.
"""
import argparse
import json
import os
import sys

KEYS = ("base", "gguf", "text", "checkpoint", "yarn", "lengths", "short_identity")


def parse(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("job", help="JSON object with keys " + ", ".join(KEYS) + " (and optionally trained)")
    raw = p.parse_args(argv).job
    try:
        job = json.loads(raw)
    except json.JSONDecodeError as err:
        p.error(f"the job is not JSON ({err}); pass one object as benchmarks/search.py's score() builds it")
    if not isinstance(job, dict) or (missing := [k for k in KEYS if k not in job]):
        p.error(f"the job lacks the keys {missing if isinstance(job, dict) else list(KEYS)}; "
                "pass one object as benchmarks/search.py's score() builds it")
    if not os.path.isfile(job["text"]):
        p.error(f"the job's text {job['text']!r} is not a file")
    return job


def main(job: dict) -> None:
    import hashlib

    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(job["base"], gguf_file=job["gguf"])
    ids = np.asarray(tok(open(job["text"]).read(), verbose=False)["input_ids"], dtype=np.int32)
    if job["checkpoint"]:
        config = AutoConfig.from_pretrained(job["checkpoint"])
        if job["short_identity"]:   # LongRoPE's short set as the identity: plain RoPE (x attention_factor) <= L
            rope = dict(config.rope_parameters)
            rope["short_factor"] = [1.0] * len(rope["short_factor"])
            config.rope_parameters = rope
        # a config-only folder (the compare step keeps no weights): the base weights, which the
        # search never changes, under the searched config
        weights = any(os.path.exists(os.path.join(job["checkpoint"], f)) for f in ("model.safetensors", "pytorch_model.bin"))
        where = {} if weights else {"pretrained_model_name_or_path": job["base"], "gguf_file": job["gguf"]}
        model = AutoModelForCausalLM.from_pretrained(**({"pretrained_model_name_or_path": job["checkpoint"]} | where),
                                                     config=config, dtype=torch.float32)
    else:
        config = AutoConfig.from_pretrained(job["base"], gguf_file=job["gguf"])
        if job["yarn"]:
            config.rope_parameters = {"rope_type": "yarn", "rope_theta": config.rope_parameters["rope_theta"],
                                      "factor": job["yarn"], "original_max_position_embeddings": config.max_position_embeddings}
            config.max_position_embeddings = int(config.max_position_embeddings * job["yarn"])
        model = AutoModelForCausalLM.from_pretrained(job["base"], gguf_file=job["gguf"], config=config,
                                                     dtype=torch.float32)
    model.eval()
    out = {"hf_posext_imported": "hf_posext" in sys.modules, "transformers": transformers.__version__,
           "rope": model.config.rope_parameters.get("rope_type"),
           "short_factor": (model.config.rope_parameters.get("short_factor") or [None])[:2],
           "data_hash": hashlib.sha256(ids.tobytes()).hexdigest()[:12], "nll": {}}
    with torch.inference_mode():
        for n in job["lengths"]:
            x = torch.as_tensor(ids[:n], dtype=torch.long)[None]
            h = model.model(input_ids=x, use_cache=False).last_hidden_state[0, :-1]
            t = x[0, 1:]
            per_token = torch.cat([F.cross_entropy(model.lm_head(h[i:i + 1024]).float(), t[i:i + 1024], reduction="none")
                                   for i in range(0, t.numel(), 1024)]).double()            # [n - 1]
            total = per_token.sum().item()
            out["nll"][str(n)] = total / t.numel()
            trained = job.get("trained")
            if trained and n > trained:   # the predictions a first window of L makes, and the rest
                out.setdefault("halves", {})[str(n)] = [per_token[:trained - 1].mean().item(),
                                                        per_token[trained - 1:].mean().item()]
            print(json.dumps({"length": n, "ppl": float(np.exp(total / t.numel()))}), file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main(parse())

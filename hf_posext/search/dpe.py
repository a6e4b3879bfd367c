"""DPE's detection (Lu et al. 2025, arXiv 2504.18857, §3; LuLuLuyi/DPE @46b85de): the per-group
position scales and the key dimensions the attention method `dpe` (attention/units.py) applies.

(a) Effective relative distance per dimension group (effective_length_detection/
run_niah_detect.sh): every group but one at the scale `2·T/L` (line 21, `factor`), the probed
group at each scale T/ℓ for ℓ = T, T/2, ... down to 1024 (lines 23-29; here down to the
window), scored by a 4-needle probe at the target length T (inference.py: generation, the share
of needles found); each group keeps its best scale ("by sorting these results", README).
The probe here: 4 facts at spread depths of one tuning document, then the 4 questions and their
answers, read teacher-forced in one forward. A needle counts as found when every answer token is
the model's argmax (exactly what greedy decoding would write first); ties between scales are
broken by the mean answer-token NLL. Its wording is the search's own (needle.WORDING), neither
the retrieval suite's nor the reference's RULER one, so detection never tunes on the words an
evaluation asks with.
(b) Key dimensions (dimension_selection/qk_2_norm_select_dim.py): per layer, head and rotary
component c, the mean over tokens of ‖(q_c, q_{c+d/2})‖·‖(k_c, k_{c+d/2})‖ of the un-rotated
query and key (lines 18-20, 40-42; keys repeated to the query heads as repeat_kv); the top k per
head (dpe_for_llama.py lines 527-537, `torch.topk(..., k=topk)`).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..data.facts import draw_fact, pieces
from ..evaluation.lm_head import check_lm_head, decoder_and_head
from ..patcher import patch, unpatch
from ..rope.compat import rotary_dim
from .needle import WORDING

NEEDLES = 4          # the reference's NIAH: 4 needles (README "NIAH (4-needle)")
GROUPS = 8           # "in practice, we divide them evenly into eight groups"


def candidate_scales(target: int, shortest: int) -> list[int]:
    """T/ℓ for ℓ = T, T/2, T/4, ... while ℓ >= shortest (run_niah_detect.sh lines 23-29, with
    1024 there)."""
    out, length = [], target
    while length >= shortest:
        out.append(target // length)
        length //= 2
    return out


def component_norms(model, ids: torch.Tensor) -> torch.Tensor:
    """[layers, query heads, d/2]: mean over the tokens of `ids` of the product of the query's and
    key's 2-norm on each rotary pair (c, c + d/2), before rotation (the q_proj / k_proj outputs;
    a rotation keeps a pair's norm)."""
    config = model.config
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    half = rotary_dim(config) // 2
    layers = decoder_and_head(model)[0].layers
    got: dict[tuple[int, str], torch.Tensor] = {}
    hooks = []
    for li, layer in enumerate(layers):
        for name, n in (("q_proj", heads), ("k_proj", kv)):
            def hook(mod, inp, out, li=li, name=name, n=n):
                x = out[0].float().reshape(out.shape[1], n, hd)[..., :2 * half]
                got[(li, name)] = x.reshape(x.shape[0], n, 2, half).norm(dim=2)   # [T, n, d/2]
            hooks.append(getattr(layer.self_attn, name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(ids[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    rows = []
    for li in range(len(layers)):
        q, k = got[(li, "q_proj")], got[(li, "k_proj")].repeat_interleave(heads // kv, dim=1)
        rows.append((q * k).mean(dim=0))
    return torch.stack(rows)


def select_key_dims(norms: torch.Tensor, top: int) -> list[list[list[int]]]:
    """The `top` components of each layer and head by their q·k norm product (sorted)."""
    if not 1 <= top <= norms.shape[-1]:
        raise ValueError(f"--top-dims must be between 1 and {norms.shape[-1]} (rotary dim / 2), got {top}")
    idx = torch.topk(norms, k=top, dim=-1).indices.sort(dim=-1).values
    return idx.tolist()


def probe_document(doc: np.ndarray, tokenizer, target: int, seed: int) -> tuple[torch.Tensor, list[list[int]]]:
    """(ids [target], the positions of each needle's answer tokens): 4 facts at depths spread
    over the document, the 4 questions with their answers at its end."""
    stream = [int(t) for t in doc[:target]]
    text = tokenizer.decode(stream, skip_special_tokens=True)
    rng = random.Random(seed)
    facts, tail, answers = [], [], []
    keys: set[str] = set()
    while len(facts) < NEEDLES:
        key, value = draw_fact(rng, WORDING, text)
        if key.lower() in keys:
            key = f"{key}{len(facts)}"
        keys.add(key.lower())
        fact, question, answer = pieces(tokenizer, WORDING, key, value)
        facts.append(fact)
        answers.append((len(tail) + len(question), len(answer)))
        tail += question + answer
    room = target - len(tail) - sum(len(f) for f in facts)
    if room < NEEDLES:
        raise ValueError(f"a {target}-token probe is too short for {NEEDLES} needles "
                         f"({target - room} tokens); probe a longer target.")
    filler, body, prev = stream[:room], [], 0
    for n, fact in enumerate(facts):           # fact n at depth n/(NEEDLES − 1) of the filler
        cut = round(n * room / (NEEDLES - 1))
        body += filler[prev:cut] + fact
        prev = cut
    body += filler[prev:]
    start = len(body)
    ids = body + tail
    return torch.tensor(ids), [list(range(start + a, start + a + n)) for a, n in answers]


def probe_score(model, ids: torch.Tensor, answers: list[list[int]]) -> dict[str, float]:
    """Teacher-forced: the share of needles whose answer tokens are all the argmax, and the mean
    answer-token NLL."""
    decoder, head = decoder_and_head(model)[0], check_lm_head(model)
    with torch.no_grad():
        hidden = decoder(input_ids=ids[None], use_cache=False).last_hidden_state[0]
        found, nll = 0, []
        for span in answers:
            pred = torch.tensor(span) - 1                       # the token before predicts it
            logits = head(hidden[pred])
            found += bool((logits.argmax(-1) == ids[span]).all())
            nll.append(F.cross_entropy(logits, ids[span], reduction="none"))
    return {"found": found / len(answers), "nll": float(torch.cat(nll).mean())}


def detect(model, tokenizer, docs: Sequence[np.ndarray], target: int, *, window: int,
           groups: int = GROUPS, key_dims: list | None = None, shortest: int | None = None,
           log_path: str | Path | None = None, progress=print) -> dict[str, Any]:
    """The per-group scales for `target` tokens (the model unpatched on entry). Each probe's
    result is appended to `log_path` (JSON lines) as it finishes; a rerun reads it back and runs
    only the probes it lacks."""
    L = int(model.config.max_position_embeddings)
    half = rotary_dim(model.config) // 2
    if half % groups:
        raise ValueError(f"{groups} groups cannot split {half} rotary frequencies evenly; pass "
                         f"--groups dividing {half}.")
    scales = candidate_scales(target, shortest or window)
    base = max(1, 2 * target // L)
    probes = [probe_document(d, tokenizer, target, seed=i) for i, d in enumerate(docs)]
    done: dict[str, dict] = {}
    log = Path(log_path) if log_path else None
    if log is not None and log.exists():
        done = {r["key"]: r for r in map(json.loads, log.read_text().splitlines()) if r.get("key")}
    table: dict[int, dict[int, dict[str, float]]] = {}
    # a probe's answer can differ between dtypes: a resumed run reuses only its own dtype's rows
    # (float32 rows carry no tag, as every row logged before --dtype existed was float32)
    dtype = next(model.parameters()).dtype
    dtype_tag = "" if dtype == torch.float32 else f"-{str(dtype).removeprefix('torch.')}"

    def key_of(g: int, s: int) -> str:
        return f"T{target}-w{window}-g{g}-s{s}-b{base}-n{len(probes)}-k{key_dims is not None}{dtype_tag}"

    for g in range(groups):
        for s in scales:
            knobs = [base] * groups
            knobs[g] = s
            key = key_of(g, s)
            if key not in done:
                # at s = base every group's probe is the one config (all groups at the base scale):
                # probed once, the other groups' rows point to it (7 of the 40 forwards at 2x)
                same = next((done[k] for k in (key_of(h, base) for h in range(groups)) if k in done),
                            None) if s == base else None
                if same is not None:
                    done[key] = {**same, "key": key, "group": g, "seconds": 0.0,
                                 "same_as": same.get("same_as") or same["key"]}
                else:
                    start = time.monotonic()
                    patch(model, "dpe", target / L, window=window, group_scales=knobs, key_dims=key_dims)
                    try:
                        scores = [probe_score(model, ids, ans) for ids, ans in probes]
                    finally:
                        unpatch(model)
                    done[key] = {"key": key, "group": g, "scale": s,
                                 "found": sum(r["found"] for r in scores) / len(scores),
                                 "nll": sum(r["nll"] for r in scores) / len(scores),
                                 "seconds": round(time.monotonic() - start, 1)}
                    progress(f"group {g} scale {s}: found {done[key]['found']:.2f}, "
                             f"answer NLL {done[key]['nll']:.3f} ({done[key]['seconds']} s)")
                if log is not None:
                    with log.open("a") as f:
                        f.write(json.dumps(done[key]) + "\n")
            table.setdefault(g, {})[s] = {k: done[key][k] for k in ("found", "nll")}
    best = [max(table[g], key=lambda s: (table[g][s]["found"], -table[g][s]["nll"])) for g in range(groups)]
    return {"method": "dpe", "target_length": target, "trained_length": L, "window": window,
            "group_scales": best, "base_scale": base, "candidates": scales,
            "probes": {str(g): {str(s): v for s, v in table[g].items()} for g in table},
            **({"key_dims": key_dims} if key_dims is not None else {})}

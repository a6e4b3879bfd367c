"""Search a portable `longrope` config: per-frequency rescale factors and the attention factor.

LongRoPE (Ding et al. 2024, arXiv 2402.13753, §3.2) searches one rescale factor f_i per rotary
frequency (inv'_i = inv_i / f_i, non-decreasing from high to low frequency, f_i >= 1) plus the
cos/sin scale, evolutionarily, on the perplexity at the target length. Here the same space is
searched by gradient descent with the weights frozen: the loss is differentiable in inv'_i (cos
and sin of position × inv'_i), so one backward gives all d/2 + 1 directions at once, where an
evolutionary step needs a forward per candidate. LongRoPE's cost cuts kept: few documents (one by
default), a shorter proxy for the gradient steps (`proxy_length`) with full-length checks, and
early rejection (a step whose checked loss is worse than the best goes back to the best and
halves the step size). The start is LongRoPE's: the best rope-only method's factors, i.e. the
longrope form of linear / NTK / NTK-by-parts / YaRN (hf_posext/rope/longrope.py).

Every evaluation is a row of a JSON-lines log, so a run resumes from its log: the baseline,
the seeds and every step (parameters and Adam moments) are read back instead of recomputed.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..evaluation.loss import IGNORE_INDEX, decoder_and_head
from ..evaluation.perplexity import sliding_nll
from ..patcher import is_patched, patch, trained_length, unpatch
from ..rope.compat import get_rope_parameters, rotary_dim, text_config
from ..rope.config import RopeExtensionConfig
from ..rope.longrope import factors_of, longrope_dict, rope_powers
from ..rope.registry import compute, rotary_modules
from ..rope.units import STATIC_METHODS

SEED_METHODS = STATIC_METHODS  # every static method seeds the search (its exact factors)


@dataclass(frozen=True)
class SearchSettings:
    """What a search run is; a resumed run must have the same (the log's first row)."""
    target_length: int
    proxy_length: int
    lr: float = 0.05
    baseline_window: int = 0      # sliding baseline window (0: the trained length)
    data: str = ""                # fingerprint of the tuning tokens


class SearchLog:
    """The JSON-lines log: one row per evaluation, appended and flushed as it happens."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.rows: list[dict] = []
        if self.path.is_file():
            with open(self.path) as f:
                self.rows = [json.loads(line) for line in f if line.strip()]

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.rows if r["kind"] == kind]


class _Factors(torch.nn.Module):
    """The searched parameters: log f_i (one per frequency) and log attention_factor."""

    def __init__(self, factors: Sequence[float], attention_factor: float):
        super().__init__()
        self.log_f = torch.nn.Parameter(torch.tensor(factors, dtype=torch.float64).log().float())
        self.log_a = torch.nn.Parameter(torch.tensor(math.log(attention_factor)))

    @torch.no_grad()
    def project(self) -> None:
        """LongRoPE's constraints: f_i >= 1 and non-decreasing towards low frequencies."""
        self.log_f.clamp_(min=0.0)
        self.log_f.copy_(torch.cummax(self.log_f, 0).values)

    def values(self) -> tuple[list[float], float]:
        return self.log_f.detach().double().exp().tolist(), float(self.log_a.detach().exp())


class _SearchRotary(torch.nn.Module):
    """A rotary module computing cos/sin from the searched factors with gradients, as
    transformers' longrope does (1 / (f_i · b^(2i/d)), cos/sin × attention_factor)."""

    def __init__(self, params: _Factors, powers: torch.Tensor):
        super().__init__()
        self.params = params
        self.register_buffer("powers", powers, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        inv_freq = 1.0 / (self.params.log_f.exp() * self.powers)                   # [d/2]
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]          # [B, T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)                                     # [B, T, d]
        a = self.params.log_a.exp()
        return (emb.cos() * a).to(x.dtype), (emb.sin() * a).to(x.dtype)


class _Installed:
    """Swap every rotary module for a `_SearchRotary` while inside the block."""

    def __init__(self, model, params: _Factors, powers: torch.Tensor):
        self.model, self.params, self.powers, self.saved = model, params, powers, []

    def __enter__(self):
        for parent, name, module in rotary_modules(self.model):
            self.saved.append((parent, name, module))
            setattr(parent, name, _SearchRotary(self.params, self.powers))
        return self

    def __exit__(self, *exc):
        for parent, name, module in self.saved:
            setattr(parent, name, module)


def proxy_chunks(target: int, proxy: int, pieces: int = 4) -> list[tuple[int, int]]:
    """[start, end) of `pieces` spans of the first `target` tokens, `proxy` tokens in all, spread
    evenly from the start to the end: the short proxy (LongRoPE's cost cut) that still spans
    every distance up to the target, because each span keeps its true positions."""
    if proxy >= target:
        return [(0, target)]
    size = proxy // pieces
    starts = [round(k * (target - size) / (pieces - 1)) for k in range(pieces)]
    return [(a, a + size) for a in starts]


def _nll(model, doc: np.ndarray, spans: Sequence[tuple[int, int]], chunk: int = 1024) -> torch.Tensor:
    """Mean next-token NLL over `spans` of one document, read as one sequence whose tokens keep
    their document positions (a span's last token predicts nothing: its successor is elsewhere).
    Differentiable; the LM head + cross-entropy checkpointed per chunk so [T × vocab] logits
    never exist at once (evaluation/loss.py)."""
    ids = torch.cat([torch.as_tensor(doc[a:b], dtype=torch.long) for a, b in spans])        # [T]
    pos = torch.cat([torch.arange(a, b) for a, b in spans])                                 # [T]
    targets = torch.cat([torch.cat([torch.as_tensor(doc[a + 1:b], dtype=torch.long),
                                    torch.tensor([IGNORE_INDEX])]) for a, b in spans])      # [T]
    decoder, head = decoder_and_head(model)
    hidden = decoder(input_ids=ids[None], position_ids=pos[None], use_cache=False).last_hidden_state[0]
    total = hidden.new_zeros((), dtype=torch.float32)

    def piece(h, t):
        return F.cross_entropy(F.linear(h.float(), head.weight.float()), t, reduction="sum")

    for i in range(0, targets.numel(), chunk):
        total = total + checkpoint(piece, hidden[i:i + chunk], targets[i:i + chunk], use_reentrant=False)
    return total / (targets != IGNORE_INDEX).sum()


def _loss(model, docs: Sequence[np.ndarray], spans, grad: bool) -> torch.Tensor:
    """Mean NLL over `spans` of each tuning document."""
    with torch.set_grad_enabled(grad):
        return torch.stack([_nll(model, d, spans) for d in docs]).mean()


def seed_candidates(dim: int, base: float, trained: int, factor: float) -> dict[str, tuple[list[float], float]]:
    """The rope-only methods in their longrope form: method -> (factors, attention_factor)."""
    out = {}
    for method in SEED_METHODS:
        spec = RopeExtensionConfig(method, factor, trained)
        inv_freq, scale = compute(spec, dim, base)
        out[method] = (factors_of(inv_freq, dim, base), float(scale))
    return out


@dataclass
class SearchResult:
    factors: list[float]
    attention_factor: float
    nll: float                    # mean NLL at the target length on the tuning text
    proxy_nll: float              # the search objective (mean NLL over the proxy spans)
    baseline_nll: float           # the unpatched model, sliding window of L, same tokens
    source: str                   # "step N" or the seed method it is
    steps: int
    checked: bool = True          # False: `nll` is the proxy objective (final_check=False)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    @property
    def ratio(self) -> float:
        return math.exp(self.nll - self.baseline_nll)


def _baseline(model, docs, settings: SearchSettings, log: SearchLog, started: float) -> float:
    rows = log.of("baseline")
    if rows:
        return rows[0]["nll"]
    window = settings.baseline_window
    total, count = sliding_nll(model, docs, window, window // 4, settings.target_length)
    return log.add({"kind": "baseline", "window": window, "nll": total / count, "tokens": count,
                    "elapsed": time.monotonic() - started})["nll"]


def search(model, docs: Sequence[np.ndarray], target_length: int, log_path: str | Path, *,
           budget_minutes: float = 60.0, proxy_length: int | None = None, lr: float = 0.05,
           max_steps: int | None = None, data: str = "", final_check: bool = True,
           progress: bool = True) -> SearchResult:
    """Search factors for `model` (plain RoPE, weights untouched) on the token arrays `docs`
    (each at least `target_length` + 1 tokens), logging to `log_path`; resumes from that log.
    Returns the best config found (the best seed when no step beats it); with `final_check`
    False its `nll` is the proxy objective, not a full-length figure (saves a target-length
    forward)."""
    config = text_config(model.config)
    rope = get_rope_parameters(config)
    if is_patched(model) or rope.get("rope_type", "default") != "default":
        raise ValueError("search starts from a model with plain RoPE; unpatch it (or load the "
                         "un-extended checkpoint) first.")
    trained = trained_length(model)
    if target_length <= trained:
        raise ValueError(f"target length {target_length} must exceed the trained length {trained}.")
    proxy = proxy_length or target_length
    settings = SearchSettings(target_length, proxy, lr, trained, data)
    log = SearchLog(log_path)
    first = log.of("settings")
    if first and first[0]["settings"] != asdict(settings):
        raise ValueError(f"{log.path} is the log of another search ({first[0]['settings']}); "
                         f"this one is {asdict(settings)}. Use another --out, or the same settings.")
    if not first:
        log.add({"kind": "settings", "settings": asdict(settings)})
    # a resumed run's clock continues from its log: the budget bounds the whole search
    started = time.monotonic() - max((r.get("elapsed", 0.0) for r in log.rows), default=0.0)
    elapsed = lambda: time.monotonic() - started  # noqa: E731 (one clock for every row)
    for p in model.parameters():
        p.requires_grad_(False)
    dim, base = rotary_dim(config), float(rope["rope_theta"])
    factor = target_length / trained
    with torch.no_grad():
        baseline = _baseline(model, docs, settings, log, started)

    proxy_spans = proxy_chunks(target_length, proxy)
    params = _Factors([1.0] * (dim // 2), 1.0)
    done = {r["method"]: r for r in log.of("seed")}
    with _Installed(model, params, rope_powers(dim, base)):
        for method, (f, a) in seed_candidates(dim, base, trained, factor).items():
            if method not in done:
                with torch.no_grad():
                    params.log_f.copy_(torch.tensor(f, dtype=torch.float64).log())
                    params.log_a.fill_(math.log(a))
                nll = float(_loss(model, docs, proxy_spans, grad=False))
                done[method] = log.add({"kind": "seed", "method": method, "factors": f,
                                        "attention_factor": a, "nll": nll, "elapsed": elapsed()})
        best = min(done.values(), key=lambda r: r["nll"])
        best = {**best, "source": best["method"]}
        best = _descend(model, docs, params, best, settings, log, budget_minutes, max_steps,
                        elapsed, progress, baseline)
    if not final_check:
        return SearchResult(best["factors"], best["attention_factor"], best["nll"], best["nll"],
                            baseline, best["source"], len(log.of("step")), checked=False)
    return _checked(model, docs, best, settings, log, baseline, dim, base, elapsed)


def _checked(model, docs, best: dict, settings: SearchSettings, log: SearchLog, baseline: float,
             dim: int, base: float, elapsed) -> SearchResult:
    """The best point's NLL over the whole target length (once per best point, logged), so the
    printed perplexity and ratio to the sliding baseline are full-length figures."""
    key = [best["factors"], best["attention_factor"]]
    rows = [r for r in log.of("check") if [r["factors"], r["attention_factor"]] == key]
    if rows:
        nll = rows[0]["nll"]
    else:
        params = _Factors(best["factors"], best["attention_factor"])
        with _Installed(model, params, rope_powers(dim, base)):
            nll = float(_loss(model, docs, [(0, settings.target_length)], grad=False))
        log.add({"kind": "check", "factors": best["factors"], "attention_factor": best["attention_factor"],
                 "source": best["source"], "nll": nll, "ratio": math.exp(nll - baseline),
                 "elapsed": elapsed()})
    return SearchResult(best["factors"], best["attention_factor"], nll, best["nll"], baseline,
                        best["source"], len(log.of("step")))


def _descend(model, docs, params: _Factors, best: dict, settings: SearchSettings, log: SearchLog,
             budget_minutes: float, max_steps: int | None, elapsed, progress: bool,
             baseline: float) -> dict:
    """Adam on (log f, log a) from the best seed, or from the last logged step when resuming."""
    steps = log.of("step")
    for row in steps:
        if row.get("checked") is not None and row["checked"] < best["nll"]:
            best = {"factors": row["factors"], "attention_factor": row["attention_factor"],
                    "nll": row["checked"], "source": f"step {row['step']}"}
    state = steps[-1] if steps else {"factors": best["factors"], "attention_factor": best["attention_factor"],
                                     "lr": settings.lr, "step": 0, "m": None, "v": None}
    with torch.no_grad():
        params.log_f.copy_(torch.tensor(state["next_factors"] if steps else state["factors"],
                                        dtype=torch.float64).log())
        params.log_a.fill_(math.log(state["next_attention_factor"] if steps else state["attention_factor"]))
    lr = state["lr"]
    opt = torch.optim.Adam(params.parameters(), lr=lr)
    if state.get("m") is not None:  # Adam moments back from the log: the resumed run continues
        for p, m, v in zip(params.parameters(), state["m"], state["v"]):
            opt.state[p] = {"step": torch.tensor(float(state["step"])),
                            "exp_avg": torch.tensor(m).reshape(p.shape),
                            "exp_avg_sq": torch.tensor(v).reshape(p.shape)}
    step, budget = state["step"], budget_minutes * 60.0
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=round(budget), initial=min(round(elapsed()), round(budget)), unit="s",
                   desc="search", leave=True)
    # transformers 5.x renamed gradient_checkpointing_* to activation_checkpointing_* (4.57: old)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        disable = model.activation_checkpointing_disable
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        disable = model.gradient_checkpointing_disable
    model.train()  # transformers checkpoints layers in training mode only (no dropout in these)
    try:
        while elapsed() < budget and (max_steps is None or step < max_steps):
            step += 1
            f, a = params.values()
            opt.zero_grad()
            loss = _loss(model, docs, proxy_chunks(settings.target_length, settings.proxy_length), grad=True)
            loss.backward()
            checked = float(loss.detach())  # the objective at the parameters before this step
            rejected = checked > best["nll"]
            if checked < best["nll"]:  # equal: the same point (step 1 re-reads the seed)
                best = {"factors": f, "attention_factor": a, "nll": checked, "source": f"step {step}"}
            if rejected:  # early rejection: back to the best point with half the step size
                lr /= 2
                with torch.no_grad():
                    params.log_f.copy_(torch.tensor(best["factors"], dtype=torch.float64).log())
                    params.log_a.fill_(math.log(best["attention_factor"]))
                opt = torch.optim.Adam(params.parameters(), lr=lr)
            else:
                opt.step()
                params.project()
            nf, na = params.values()
            st = [opt.state.get(p) for p in params.parameters()]
            moments = None if any(s is None for s in st) else (
                [s["exp_avg"].flatten().tolist() for s in st],
                [s["exp_avg_sq"].flatten().tolist() for s in st])
            log.add({"kind": "step", "step": step, "factors": f, "attention_factor": a,
                     "proxy_nll": checked, "checked": checked, "rejected": rejected, "lr": lr,
                     "next_factors": nf, "next_attention_factor": na,
                     "m": moments and moments[0], "v": moments and moments[1],
                     "best_nll": best["nll"], "best_ratio": math.exp(best["nll"] - baseline),
                     "elapsed": elapsed()})
            if bar is not None:
                bar.set_postfix(step=step, best_ratio=f"{math.exp(best['nll'] - baseline):.4f}")
                bar.update(max(0, min(round(elapsed()), round(budget)) - bar.n))
    finally:
        disable()
        model.eval()
        if bar is not None:
            bar.close()
    return best


def save_best(model, tokenizer, result: SearchResult, out: str | Path, target_length: int) -> dict[str, Any]:
    """Save model + tokenizer under `out` with the best config in its most portable exact form:
    a rope-only method's own form when the best is an unchanged seed (e.g. transformers' `yarn`),
    else transformers' `longrope`. Returns the rope dict written."""
    config = text_config(model.config)
    trained = trained_length(model)
    factor = target_length / trained
    if result.source in SEED_METHODS:
        patch(model, result.source, factor)
    else:
        rope = longrope_dict(result.factors, result.attention_factor, 1.0, trained, factor)
        patch(model, "longrope", factor, **{k: rope[k] for k in ("short_factor", "long_factor",
                                                                 "attention_factor")})
    try:
        model.save_pretrained(out)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        return get_rope_parameters(config)
    finally:
        unpatch(model)

"""Search a portable `longrope` config: what both search algorithms share.

LongRoPE (Ding et al. 2024, arXiv 2402.13753, §3.2) searches one rescale factor f_i per rotary
frequency (inv'_i = inv_i / f_i, non-decreasing from high to low frequency, f_i >= 1) plus the
cos/sin scale on the perplexity at the target length. This module holds that space (`_Factors`,
a rotary module computing cos/sin from it), the objective (mean NLL over proxy spans at their
true positions: LongRoPE's short-proxy cost cut), the sliding-window baseline, the seeds (the
best rope-only method's factors, LongRoPE's start: the longrope form of every static method),
the resumable JSON-lines log (every evaluation a row, read back instead of recomputed), the
full-length check and the saved checkpoint. The algorithms: `gradient.search` (Adam with the
weights frozen: one backward gives all d/2 + 1 directions) and `evolution.evolve` (LongRoPE's
evolutionary search: one forward per candidate).
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
    algorithm: str = "gradient"   # or "evolution(...)" with its settings (evolution.py)


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

    powers: torch.Tensor   # a buffer (register_buffer below)

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


@dataclass
class _Run:
    """A search under way: its log and settings, clock, baseline, rotary dims and best seed."""
    log: SearchLog
    settings: SearchSettings
    elapsed: Any
    baseline: float
    dim: int
    base: float
    powers: torch.Tensor
    best: dict


def _start(model, docs, target_length: int, log_path, proxy_length: int | None, lr: float,
           data: str, algorithm: str = "gradient") -> _Run:
    """What every search algorithm does first: check the model and the log (a resumed run must
    have the same settings), freeze the weights, the sliding baseline and the seeds (each once,
    from the log when resuming)."""
    config = text_config(model.config)
    rope = get_rope_parameters(config)
    if is_patched(model) or rope.get("rope_type", "default") != "default":
        raise ValueError("search starts from a model with plain RoPE; unpatch it (or load the "
                         "un-extended checkpoint) first.")
    trained = trained_length(model)
    if target_length <= trained:
        raise ValueError(f"target length {target_length} must exceed the trained length {trained}.")
    settings = SearchSettings(target_length, proxy_length or target_length, lr, trained, data, algorithm)
    log = SearchLog(log_path)
    first = log.of("settings")
    # logs written before `algorithm` existed are gradient searches
    if first and {"algorithm": "gradient", **first[0]["settings"]} != asdict(settings):
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
    with torch.no_grad():
        baseline = _baseline(model, docs, settings, log, started)
    proxy_spans = proxy_chunks(target_length, settings.proxy_length)
    params, powers = _Factors([1.0] * (dim // 2), 1.0), rope_powers(dim, base)
    done = {r["method"]: r for r in log.of("seed")}
    with _Installed(model, params, powers):
        for method, (f, a) in seed_candidates(dim, base, trained, target_length / trained).items():
            if method not in done:
                with torch.no_grad():
                    params.log_f.copy_(torch.tensor(f, dtype=torch.float64).log())
                    params.log_a.fill_(math.log(a))
                nll = float(_loss(model, docs, proxy_spans, grad=False))
                done[method] = log.add({"kind": "seed", "method": method, "factors": f,
                                        "attention_factor": a, "nll": nll, "elapsed": elapsed()})
    best = min(done.values(), key=lambda r: r["nll"])
    return _Run(log, settings, elapsed, baseline, dim, base, powers, {**best, "source": best["method"]})


def _finish(model, docs, run: _Run, best: dict, final_check: bool, steps: int) -> SearchResult:
    """The result: with `final_check`, the best point's NLL over the whole target length."""
    if not final_check:
        return SearchResult(best["factors"], best["attention_factor"], best["nll"], best["nll"],
                            run.baseline, best["source"], steps, checked=False)
    return _checked(model, docs, best, run.settings, run.log, run.baseline, run.dim, run.base,
                    run.elapsed, steps)


def _checked(model, docs, best: dict, settings: SearchSettings, log: SearchLog, baseline: float,
             dim: int, base: float, elapsed, steps: int) -> SearchResult:
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
                        best["source"], steps)


SHORT_FACTORS = ("same", "identity")


def save_best(model, tokenizer, result: SearchResult, out: str | Path, target_length: int,
              short_factors: str = "same") -> dict[str, Any]:
    """Save model + tokenizer under `out` with the best config in its most portable exact form:
    a rope-only method's own form when the best is an unchanged seed (e.g. transformers' `yarn`),
    else transformers' `longrope`. Returns the rope dict written.

    `short_factors`: "same" (the searched factors at every length: one rope, whatever the
    length, as every engine and a KV cache expect) or "identity" (LongRoPE §3.3's separate set
    for contexts <= L, here plain RoPE: a sequence within L then runs the unpatched frequencies,
    only cos/sin x attention_factor differs; always a `longrope` config, since no other type
    has two sets). transformers switches sets by each forward's length; hf_posext.generate
    holds one set for a whole generation (generation.py)."""
    if short_factors not in SHORT_FACTORS:
        raise ValueError(f"short_factors must be one of {SHORT_FACTORS}, got {short_factors!r}")
    config = text_config(model.config)
    trained = trained_length(model)
    factor = target_length / trained
    if result.source in SEED_METHODS and short_factors == "same":
        patch(model, result.source, factor)
    else:
        short = None if short_factors == "same" else [1.0] * len(result.factors)
        rope = longrope_dict(result.factors, result.attention_factor, 1.0, trained, factor,
                             short_factors=short)
        patch(model, "longrope", factor, **{k: rope[k] for k in ("short_factor", "long_factor",
                                                                 "attention_factor")})
    try:
        model.save_pretrained(out)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
        return get_rope_parameters(config)
    finally:
        unpatch(model)

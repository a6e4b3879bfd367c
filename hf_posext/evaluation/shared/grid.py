"""The grid shared by perplexity and passkey: which (method, factor) cells run at each length,
with which knobs, and how a model is put into a cell's state.

Method names come from one source (`hf_posext.catalog.METHODS` / `canonical_method`), knob names
from the knob specs the units declare (`catalog.KNOB_HELP`), so a method or knob added there is
accepted here without a hand-kept list.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import Callable, Iterable, Mapping, Sequence

from ... import catalog as _catalog   # read at call time: methods registered later count too
from ...errors import BeyondReach, refuse_renamed
from ...attention import is_attention_method, split
from ...attention.units import LOGN_SCALING
from ...rope.config import MAX_TARGET_LENGTH, RopeExtensionConfig
from ...rope.knobs import RENAMED_TRAINED
from ...patcher import is_patched, patch, unpatch
from .distributed import Ranks
from .identity import computation_signature, config_state, digest
from .record import BASELINE, identity_settings

NONE_ALIASES = ("none", "default", "original")


def knob_names() -> tuple[str, ...]:
    """Every knob a method may take (`catalog.KNOB_HELP`: from the units' knob specs)."""
    return tuple(_catalog.KNOB_HELP)


def integral_knobs() -> tuple[str, ...]:
    """The knobs that count tokens, so `--knobs window=4096` stays 4096."""
    return _catalog.INTEGRAL_KNOBS


def canonical(name: str) -> str:
    """`none` (and its aliases) or a canonical method name; ValueError for unknown names."""
    return "none" if name.lower() in NONE_ALIASES else _catalog.canonical_method(name)


def normalize_methods(methods: Iterable[str]) -> list[str]:
    """`none` first (always a row), then each method once, canonical names; `all` = METHODS."""
    out = ["none"]
    for m in methods:
        for name in (_catalog.METHODS if m.lower() == "all" else [canonical(m)]):
            if name not in out:
                out.append(name)
    return out


# Before a model loads its L is unknown: knobs are checked for names and types against the
# longest trained length any target can hold (a knob <= L check waits for the model's L).
_ANY_TRAINED = MAX_TARGET_LENGTH // 2


def check_knobs(methods: Sequence[str], knobs: Mapping[str, Mapping[str, float]]) -> None:
    """`knobs` maps a method name (or "*" for every extended method of the grid) to its knobs.
    Each (method, knobs) pair is validated by `RopeExtensionConfig` itself, before any model
    loads; a knob for a method not in the grid, or one it does not use, is an error."""
    grid = [m for m in normalize_methods(methods) if m != "none"]
    known = knob_names()
    for target, values in knobs.items():
        refuse_renamed(None, values, RENAMED_TRAINED)   # transformers' names for the lengths
        for name in values:
            if name not in known:
                raise ValueError(f"unknown knob {name!r}; knobs are {', '.join(known)}.")
        if target != "*" and canonical(target) not in grid:
            raise ValueError(f"knobs for {target!r}, which is not among the methods run "
                             f"({', '.join(grid) or 'none'}).")
    for method in grid:
        if not knobs_for(method, knobs):
            continue   # nothing to check (and a method needs no knobs to be run)
        try:
            if is_attention_method(method):
                # names and types; window <= L is checked against the model's L when patched
                split(method, knobs_for(method, knobs), _ANY_TRAINED, MAX_TARGET_LENGTH)
            else:
                split(method, knobs_for(method, knobs), _ANY_TRAINED)   # refuses attention knobs but logn
                RopeExtensionConfig(method, 2.0, **{k: v for k, v in knobs_for(method, knobs).items()
                                                    if k != LOGN_SCALING.name})
        except BeyondReach:
            pass   # the target's reach depends on the model's L: `inputs.check_cells`, per length
        except (TypeError, ValueError) as err:
            raise ValueError(f"{method}: {err}") from None


def knobs_for(method: str, knobs: Mapping[str, Mapping[str, float]]) -> dict:
    """The knobs `method` runs with: those given for every method, then its own."""
    if method in ("none", BASELINE):
        return {}
    own = [dict(v) for k, v in knobs.items() if k != "*" and canonical(k) == method]
    return {**knobs.get("*", {}), **(own[0] if own else {})}


def resolve_factor(spec, length: int, trained: int) -> float:
    """`auto` -> s = max(1, length / trained); a number stays itself."""
    if spec == "auto":
        return max(1.0, length / trained)
    return float(spec)


def method_factors(methods, factors, length: int, trained: int) -> list[tuple[str, str, float]]:
    """(method, factor as given, resolved scale s) to run at `length`: `none` once at s = 1,
    every other method once per distinct s (two specs resolving to the same s run once)."""
    out = []
    for method in normalize_methods(methods):
        specs = ["1"] if method == "none" else [str(f) for f in factors]
        seen = set()
        for spec in specs:
            s = 1.0 if method == "none" else resolve_factor(spec if spec == "auto" else float(spec),
                                                            length, trained)
            if s not in seen:
                seen.add(s)
                out.append((method, spec, s))
    return out


@dataclass
class Cell:
    """One (method, factor, length) point of a grid, plus what its protocol needs."""
    method: str
    factor_spec: str       # "auto" or the number as given
    factor: float
    length: int
    protocol: str
    knobs: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)   # protocol settings in the key: window, depth, ... (record.py)
    columns: dict = field(default_factory=dict)  # written into the row, never into its key
    as_is: bool = False    # run the model in the state it was given (no patch, no unpatch)

    @property
    def label(self) -> str:
        return f"{self.protocol} {self.method} s={self.factor:g} L={self.length}"


def apply_method(model, method: str, factor: float, knobs: Mapping | None = None) -> None:
    """Put the model in a cell's state: unpatched for `none` and the baseline, else patched (replacing)."""
    if method in ("none", BASELINE):
        if is_patched(model):
            unpatch(model)
    else:
        patch(model, method, factor, **dict(knobs or {}))


# --- running a grid: resume, reuse of identical cells, ranks -------------------------------------

@dataclass
class Job:
    index: int
    cell: Cell
    key: str
    signature: str


def _enter(model, cell: Cell) -> None:
    if not cell.as_is:
        apply_method(model, cell.method, cell.factor, cell.knobs)


def _leave(model, cell: Cell) -> None:
    if not cell.as_is and is_patched(model):
        unpatch(model)


def plan_jobs(model, cells: Sequence[Cell], identity: dict, forward_lengths: Callable) -> list[Job]:
    """Each cell's key and signature (see `identity`), computed with the model in its state."""
    jobs = []
    for i, cell in enumerate(cells):
        _enter(model, cell)
        try:
            where = {"length": cell.length, "protocol": cell.protocol,
                     **identity_settings(cell.protocol, cell.extra)}
            key = digest({**identity, **where, "method": cell.method, "factor": cell.factor,
                          "knobs": cell.knobs, "config": config_state(model)})
            signature = digest({**identity, **where,
                                **computation_signature(model, forward_lengths(cell))})
        finally:
            _leave(model, cell)
        jobs.append(Job(i, cell, key, signature))
    return jobs


def run_grid(model, cells: Sequence[Cell], *, identity: dict, base_row: dict, compute: Callable,
             result_fields: Sequence[str], forward_lengths: Callable, store=None,
             reuse: bool = True, ranks: Ranks | None = None, progress: bool = True,
             desc: str = "cells", annotate: Callable | None = None,
             prepare: Callable | None = None, stored_only: bool = False) -> list[dict] | None:
    """Run `compute(cell) -> result dict` for every cell that needs it and return one row per
    cell, in cell order. Rows come from, in this order: the store (same key: resume), an earlier
    cell with the same signature (its `result_fields` copied, `same_as` names it), or a forward.
    Under several ranks the cells to compute are shared out (each signature group on one rank),
    and rank 0 alone writes the store, after every round. `annotate(rows)` may add derived
    columns at the end (before the final write, which puts the rows in cell order).
    `prepare(cells)` hears first which cells this process will compute (e.g. to share one
    forward between them). `stored_only`: return the rows only if the store holds every one
    (nothing computed, nothing written), else None: how a later run reads back what is stored."""
    from tqdm.auto import tqdm

    ranks = ranks or Ranks()
    jobs = plan_jobs(model, cells, identity, forward_lengths)
    copy = partial(_row, base_row=base_row, identity=identity, copied=result_fields)
    if stored_only:
        if store is None or not all(store.has(j.key) for j in jobs):
            return None
        return [store.get(j.key) for j in jobs]
    rows, leaders, followers = _triage(jobs, store, reuse, ranks, copy)
    mine, rounds = _share_out(leaders, ranks)
    if prepare is not None:
        prepare([j.cell for j in mine])
    bar = tqdm(total=len(mine), desc=desc, unit="cell", disable=not progress)
    for turn in range(rounds):
        job, row, error = (mine[turn] if turn < len(mine) else None), None, None
        if job is not None:
            bar.set_postfix_str(job.cell.label)
            try:
                row = _compute(model, job, base_row, identity, compute)
            except Exception as err:  # noqa: BLE001 - every rank must hear of it
                error = err
            bar.update(1)
        if ranks.size == 1 and error is not None:
            raise error
        ranks.check_all(error)
        for done in ranks.gather(row):
            if done is not None:
                _finish(done, leaders, followers, rows, store, ranks, copy)
    bar.close()
    out = [rows[j.index] for j in jobs]
    if annotate is not None:
        annotate(out)
    if store is not None and ranks.is_main:
        store.reorder([j.key for j in jobs])
    return out


def _triage(jobs: list[Job], store, reuse: bool, ranks: Ranks, copy: Callable
            ) -> tuple[dict[int, dict], list[Job], dict[int, list[Job]]]:
    """Where each job's row comes from: the store (same key: resume), a stored row of the same
    signature (copied), a leader computed this run (its followers copy it), or a forward (a
    leader). Returns (rows known now by job index, leaders, followers by leader index)."""
    stored = {r.get("signature"): r for r in (store.rows if store is not None else [])
              if r.get("signature")}
    rows: dict[int, dict] = {}
    leaders: dict[str, Job] = {}
    followers: dict[int, list[Job]] = {}
    for job in jobs:
        if store is not None and store.has(job.key):
            rows[job.index] = store.get(job.key)
        elif reuse and job.signature in stored:
            rows[job.index] = copy(job, result=stored[job.signature])
            _save(store, ranks, rows[job.index])
        elif reuse and job.signature in leaders:
            followers[leaders[job.signature].index].append(job)
        else:
            leaders.setdefault(job.signature if reuse else job.key, job)
            followers[job.index] = []
    return rows, list(leaders.values()), followers


def _share_out(leaders: list[Job], ranks: Ranks) -> tuple[list[Job], int]:
    """(this rank's jobs, rounds every rank runs): each leader on one rank, balanced by length."""
    owner = ranks.assign([float(j.cell.length) for j in leaders])
    mine = [j for j, r in zip(leaders, owner) if r == ranks.rank]
    if ranks.size > 1:
        print(f"rank {ranks.rank}/{ranks.size}: computing {len(mine)} of {len(leaders)} cells",
              file=sys.stderr, flush=True)
    return mine, max([owner.count(r) for r in range(ranks.size)] + [0])


def _finish(done: dict, leaders: list[Job], followers: dict[int, list[Job]], rows: dict[int, dict],
            store, ranks: Ranks, copy: Callable) -> None:
    """A computed row (from any rank): store it, and the rows of the jobs that copy it."""
    lead = next(j for j in leaders if j.key == done["key"])
    rows[lead.index] = done
    _save(store, ranks, done)
    for f in followers[lead.index]:
        rows[f.index] = copy(f, result=done)
        _save(store, ranks, rows[f.index])


def _compute(model, job: Job, base_row: dict, identity: dict, compute: Callable) -> dict:
    started = time.perf_counter()
    _enter(model, job.cell)
    try:
        result = compute(job.cell)
    finally:
        _leave(model, job.cell)
    return _row(job, base_row=base_row, identity=identity, result=result, copied=None,
                seconds=time.perf_counter() - started)


def _row(job: Job, *, base_row: dict, identity: dict, result: dict, copied: Sequence[str] | None,
         seconds: float = 0.0) -> dict:
    """One tidy row: what the cell is, the run's identity, the result, and where it came from."""
    cell = job.cell
    values = {k: result[k] for k in copied if k in result} if copied is not None else result
    source = f"{result['method']} s={result['factor']:g}" if copied is not None else ""
    return {**base_row, "method": cell.method, "factor": cell.factor,
            "factor_spec": cell.factor_spec, "knobs": knob_text(cell.knobs),
            "length": cell.length, "protocol": cell.protocol, **cell.extra, **cell.columns, **values,
            "seconds": round(seconds, 3), **identity, "signature": job.signature,
            "same_as": source, "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "key": job.key}


def knob_text(knobs: Mapping) -> str:
    """Knobs as the rows write them: `name=value,...`, sorted."""
    def text(v):
        if isinstance(v, bool):                  # before int: True is an int
            return str(v).lower()
        return f"{v:g}" if isinstance(v, (int, float)) else str(v)
    return ",".join(f"{k}={text(v)}" for k, v in sorted(knobs.items()))


def _save(store, ranks: Ranks, row: dict) -> None:
    if store is not None and ranks.is_main and not store.has(row["key"]):
        store.add(row)

"""`evaluate_retrieval`: the grid of cells (`RetrievalGrid`) through `grid.run_grid` (the
results store, resume and the reuse of identical cells shared with perplexity), each cell's
trials answered by `decode.answer_cell` and scored by `stats`."""

from __future__ import annotations

import dataclasses
import hashlib

from ...patcher import trained_length
from ..shared.data import tokenizer_fingerprint
from ..shared.grid import Cell, knob_text, run_grid
from ..shared.identity import model_dtype, run_identity
from ..shared.inputs import check_device
from ..perplexity.loss import PeakMemory
from ..shared.settings import RunInfo, settings_only
from .blocks import check_blocks
from .decode import SharedPrefix, answer_cell, takes_shared
from .haystack import Haystack, load_haystack
from .prompt import LAYOUT, CellPrompts, build_cell
from .settings import RetrievalGrid
from .stats import score_trial, wilson
from .tasks import TASKS, get_task

RESULT_FIELDS = ("prompt_tokens", "prefix_tokens", "max_new_tokens", "correct", "accuracy", "ci_low", "ci_high",
                 "score", "answers", "outputs")


def data_hash(tokenizer, haystack: Haystack, task: str) -> str:
    """A cell's prompts are a function of the tokenizer, the haystack, its task's template (seed
    0 stands for it), the layout (`prompt.LAYOUT`) and the cell (in its key). Only the cell's own task counts: a task added
    to (or reworded in) TASKS leaves every other task's cells, and their stored rows, as they
    were (hashing every template re-identified every folder when niah_single was added)."""
    text = repr((tokenizer_fingerprint(tokenizer), haystack.fingerprint, TASKS[task].trial(0), LAYOUT))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@settings_only(RetrievalGrid)   # the guard every evaluation entry point shares
def evaluate_retrieval(model, tokenizer, grid: RetrievalGrid, *, run: RunInfo | None = None,
                       haystack: Haystack | None = None, store=None, ranks=None,
                       reuse_identical: bool = True, progress: bool = True,
                       answer_fn=None, seed_blocks: bool = True, engine=None,
                       prefix_cache: SharedPrefix | None = None, stored_only: bool = False) -> list[dict] | None:
    """One row per (length, task, method, factor, depth): `correct` of `trials`, `accuracy`
    with its Wilson 95 % interval (`ci_low`, `ci_high`), RULER's mean `score`, and every
    trial's expected and generated answer (`answers`, `outputs`).

    haystack: default the grid's (`load_haystack`; a document source is read now).
    answer_fn(model, tokenizer, CellPrompts, reuse_prefix) -> answer texts: default greedy
    decoding with the shared prefix prefilled once (`decode.answer_cell`); one that takes a
    `shared` keyword gets `decode.SharedPrefix`'s (holder, key), so the depths of a (task,
    method, length) extend one prefix cache.
    seed_blocks: the stored rows of a cell are blocks of trials its tables pool (`blocks.py`), so
    seeds overlapping a stored block are refused; False where each seed list is its own series
    (the passkey's tables: a run with more seeds is a new cell, not a second block).
    engine: e.g. `vllm_engine.VllmEngine`: answers come from that engine (`model` may then be its
    weightless `planning_model`); rows and keys carry its name and version.
    prefix_cache: the `decode.SharedPrefix` the cells' prefixes come from (default a new one for
    this call; the sequential looks pass theirs, kept across looks).
    stored_only: the rows if `store` holds every cell, else None; nothing is computed."""
    run = run or RunInfo()
    check_device(run.device, "device=")
    if run.dtype not in (None, "", "auto") and model_dtype(model) != run.dtype:
        raise ValueError(f"dtype={run.dtype!r} but the model runs in {model_dtype(model)}.")
    seeds = grid.trial_seeds()
    haystack = haystack or load_haystack(tokenizer, grid.haystack, max(grid.lengths))
    answer_fn = answer_fn or answer_cell
    trained = trained_length(model)
    hashes = {t: run.data_hash or data_hash(tokenizer, haystack, t) for t in grid.tasks}
    # the data hash rides in each cell (its key and its row), not in the run identity: it is per task
    cells = [dataclasses.replace(c, extra={**c.extra, "data_hash": hashes[c.extra["task"]]})
             for c in grid.cells(trained)]
    if engine is not None:
        engine.plan(cells)   # refusals before any engine loads
    memo: dict[tuple, CellPrompts] = {}
    shared = (prefix_cache if prefix_cache is not None else SharedPrefix()) if takes_shared(answer_fn) else None

    def prompts(cell: Cell) -> CellPrompts:
        where = (cell.extra["task"], cell.length, cell.extra["depth"])
        if where not in memo:
            memo[where] = build_cell(tokenizer, get_task(where[0]), haystack, cell.length,
                                     where[2], seeds, grid.layout_seeds)
        window = cell.extra.get("window")   # the sliding baseline: the same prompts, cut to its window
        return memo[where] if window is None else memo[where].window(window)

    def compute(cell: Cell) -> dict:
        task, cp = get_task(cell.extra["task"]), prompts(cell)
        with PeakMemory(run.device) as peak:
            # the model's state for the prefix cache: the patch (run_grid's _enter) and the length
            key = (cell.method, cell.factor, knob_text(cell.knobs), cell.length, cell.as_is)
            texts = engine.answer(model, tokenizer, cell, cp) if engine is not None else \
                answer_fn(model, tokenizer, cp, grid.reuse_prefix,
                          **({"shared": (shared, key)} if shared is not None else {}))
        scores = [score_trial(t, tr.answers, task.multi_answer) for t, tr in zip(texts, cp.trials)]
        correct = sum(s == 1.0 for s in scores)
        low, high = wilson(correct, len(scores))
        return {"prompt_tokens": max(len(cp.prefix) + len(s) for s in cp.suffixes),
                "max_new_tokens": max(cp.max_new_tokens), "correct": correct,
                "accuracy": correct / len(scores), "ci_low": round(low, 4), "ci_high": round(high, 4),
                "score": round(sum(scores) / len(scores), 4),
                # whole, as JSON lists (record.py): per trial its accepted answers, and its text
                "answers": [list(tr.answers) for tr in cp.trials], "outputs": list(texts),
                "prefix_tokens": len(cp.prefix), "reuse_prefix": grid.reuse_prefix,
                "peak_rss_mb": round(peak.peak_mb, 1)}

    identity = run_identity(model, fingerprint=run.fingerprint or getattr(engine, "fingerprint", None),
                            device=run.device, data_hash=None,
                            **(engine.identity() if engine is not None else {}))
    # trials added in blocks (--seed after a stored block) must not overlap one: refused now
    check_blocks(store.rows if store is not None and seed_blocks else [],
                 [{"method": c.method, "factor": c.factor, "knobs": knob_text(c.knobs), "length": c.length,
                   **c.extra, **identity} for c in cells])
    base_row = {"model": run.model_name, "trained_length": trained, "dataset": haystack.label,
                **run.extra_columns}
    return run_grid(model, cells, identity=identity, base_row=base_row, compute=compute,
                    result_fields=RESULT_FIELDS, store=store, reuse=reuse_identical,
                    forward_lengths=lambda cell: [prompts(cell).hold_length], ranks=ranks,
                    progress=progress, desc="retrieval cells", stored_only=stored_only)

"""The search logs committed under benchmarks/results/search-*/ (written by the searches of
benchmarks/search.py, before hf_posext/search/ was split into a run and its strategies) still
resume: their settings row is accepted by the same search, the best point a resume starts from
is the best the log recorded, and resumed at any generation or step, each strategy proposes the
very point the original run scored next (the committed rows are the reference, no model runs)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from hf_posext.search import Evolution, Gradient, SearchLog, SearchSettings
from hf_posext.search.log import open_log
from hf_posext.search.space import Factors

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
LOGS = sorted(RESULTS.glob("search-*/**/search_log.jsonl"))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _log(rows: list[dict], tmp_path: Path, name: str = "log.jsonl") -> SearchLog:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return SearchLog(path)


def _algorithm(path: Path) -> str:
    return _rows(path)[0]["settings"].get("algorithm", "gradient")   # older logs: gradient


def _strategy(rows: list[dict]):
    settings = rows[0]["settings"]
    if settings.get("algorithm", "gradient") == "gradient":
        return Gradient(settings["lr"])
    return Evolution()   # every committed evolutionary search ran the defaults


def _best_of_seeds(log: SearchLog) -> dict:
    seed = min(log.of("seed"), key=lambda r: r["nll"])
    return {"factors": seed["factors"], "attention_factor": seed["attention_factor"], "nll": seed["nll"],
            "source": seed["method"]}


def test_the_committed_logs_are_there():
    kinds = {_algorithm(p).split("(")[0] for p in LOGS}
    assert len(LOGS) >= 6 and kinds == {"gradient", "evolution"}, LOGS


@pytest.mark.parametrize("path", LOGS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_a_committed_log_is_accepted_by_its_own_search(path, tmp_path):
    rows = _rows(path)
    strategy = _strategy(rows)
    s = rows[0]["settings"]
    same = SearchSettings(s["target_length"], s["proxy_length"], strategy.lr, s["baseline_window"],
                          s["data"], strategy.algorithm)
    log = _log(rows, tmp_path)
    assert open_log(log.path, same).rows == rows          # accepted, nothing written
    other = SearchSettings(**{**asdict(same), "proxy_length": same.proxy_length // 2})
    with pytest.raises(ValueError, match="is the log of another search"):
        open_log(log.path, other)
    # the best a resume starts from: the best the run recorded in its last row
    scored = [_best_of_seeds(log)] + strategy.logged(log)
    best = scored[0]
    for point in scored[1:]:
        best = point if point["nll"] < best["nll"] else best
    last = [r for r in rows if "best_nll" in r]
    assert best["nll"] == last[-1]["best_nll"]


@pytest.mark.parametrize("path", [p for p in LOGS if _algorithm(p).startswith("evolution")],
                         ids=lambda p: str(p.relative_to(RESULTS)))
def test_evolution_resumed_anywhere_draws_the_committed_candidates(path, tmp_path):
    rows = _rows(path)
    head = [r for r in rows if r["kind"] != "candidate"]
    cands = [r for r in rows if r["kind"] == "candidate"]
    dim = 2 * len(cands[0]["factors"])
    for cut in range(0, len(cands), 3):   # after a whole generation or half-way through one
        strategy = _strategy(rows)
        log = _log(head + cands[:cut], tmp_path)
        strategy.start(log, Factors([1.0] * (dim // 2), 1.0), _best_of_seeds(log))
        for row in cands[cut:cut + 9]:
            point = strategy.propose()
            assert (point.fields["generation"], point.fields["index"]) == (row["generation"], row["index"])
            # to an ulp: numpy's exp / log may round differently on another machine
            assert point.factors == pytest.approx(row["factors"], rel=1e-12, abs=0)
            assert point.attention_factor == pytest.approx(row["attention_factor"], rel=1e-12, abs=0)
            strategy.pool.append(row)   # the score the original run logged


@pytest.mark.parametrize("path", [p for p in LOGS if _algorithm(p) == "gradient"],
                         ids=lambda p: str(p.relative_to(RESULTS)))
def test_the_gradient_search_resumed_at_any_step_continues_where_it_stopped(path, tmp_path):
    rows = _rows(path)
    steps = [r for r in rows if r["kind"] == "step"]
    head = [r for r in rows if r["kind"] != "step"]
    dim = 2 * len(steps[0]["factors"])
    for k in range(1, len(steps)):
        strategy = _strategy(rows)
        log = _log(head + steps[:k], tmp_path)
        strategy.start(log, Factors([1.0] * (dim // 2), 1.0), _best_of_seeds(log))
        point = strategy.propose()
        assert point.fields == {"kind": "step", "step": steps[k]["step"]}
        assert point.factors == pytest.approx(steps[k]["factors"], rel=1e-6)
        assert point.attention_factor == pytest.approx(steps[k]["attention_factor"], rel=1e-6)
        assert strategy.rate == steps[k - 1]["lr"]

"""LongRoPE's evolutionary search (hf_posext/search/evolution.py) on a tiny model: it beats its seeds,
stays in LongRoPE's space, saves a plain longrope checkpoint, resumes to the same candidates, and
refuses bad settings before the model loads."""

from __future__ import annotations

import json

import pytest
from conftest import TRAINED, tiny_model
from test_search import TARGET, doc  # noqa: F401  (the module-scoped tuning document)

import hf_posext
from hf_posext import cli
from hf_posext.commands import search as search_cmd
from hf_posext.search import SEED_METHODS, Evolution, SearchOptions, run_search, save_best, search_factors

pytestmark = pytest.mark.usefixtures("one_thread")
KNOBS = dict(population=6, parents=2, sigma=1.0, p_mutate=0.5)


def evolve(model, doc, log, generations: int, final_check: bool = True):  # noqa: F811
    options = SearchOptions(TARGET, proxy_length=TARGET // 2, final_check=final_check, progress=False)
    return run_search(model, [doc], log, options, Evolution(max_generations=generations, **KNOBS))


def _rows(path):
    return [json.loads(line) for line in open(path)]


def test_evolution_improves_over_its_seeds_and_saves_a_plain_longrope(doc, tmp_path):  # noqa: F811
    model = tiny_model()
    result = evolve(model, doc, tmp_path / "log.jsonl", 4)
    rows = _rows(tmp_path / "log.jsonl")
    seeds = {r["method"]: r["nll"] for r in rows if r["kind"] == "seed"}
    assert set(seeds) == set(SEED_METHODS)
    candidates = [r for r in rows if r["kind"] == "candidate"]
    assert len(candidates) == 4 * 6 and {r["generation"] for r in candidates} == {1, 2, 3, 4}
    assert result.proxy_nll < min(seeds.values()) - 1e-4, (result.proxy_nll, seeds)
    assert result.source.startswith("generation")
    for r in candidates:  # every candidate lies in LongRoPE's space
        assert all(f >= 1.0 for f in r["factors"]) and r["factors"] == sorted(r["factors"])
    # the full-length check is the same objective over [0, TARGET): recomputed by `search`'s
    # own checker from the log would equal it; here: it is finite and logged once
    checks = [r for r in rows if r["kind"] == "check"]
    assert len(checks) == 1 and checks[0]["nll"] == pytest.approx(result.nll)
    rope = save_best(model, None, result, tmp_path / "ckpt", TARGET)
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == rope["long_factor"]
    assert rope["short_factor"] == pytest.approx(result.factors)
    assert not hf_posext.is_patched(model)


def test_evolution_resumes_to_the_same_candidates(doc, tmp_path):  # noqa: F811
    once = tmp_path / "once.jsonl"
    evolve(tiny_model(), doc, once, 2, final_check=False)
    twice = tmp_path / "twice.jsonl"
    evolve(tiny_model(), doc, twice, 1, final_check=False)
    first = _rows(twice)
    evolve(tiny_model(), doc, twice, 2, final_check=False)
    rows = _rows(twice)
    assert rows[:len(first)] == first                          # nothing rewritten
    pick = lambda rs: [(r["generation"], r["index"], r["factors"]) for r in rs  # noqa: E731
                       if r["kind"] == "candidate"]
    assert pick(rows) == pick(_rows(once))                     # generation 2 drawn again alike
    with pytest.raises(ValueError, match="is the log of another search"):
        search_factors(tiny_model(), [doc], TARGET, twice, max_steps=1, proxy_length=TARGET // 2,
               progress=False)


def test_a_generation_cut_short_is_completed_on_resume(doc, tmp_path):  # noqa: F811
    full = tmp_path / "full.jsonl"
    evolve(tiny_model(), doc, full, 2, final_check=False)
    rows = _rows(full)
    cut = tmp_path / "cut.jsonl"   # as if the budget ran out after 2 candidates of generation 2
    keep = [r for r in rows if not (r["kind"] == "candidate" and r["generation"] == 2 and r["index"] >= 2)]
    cut.write_text("".join(json.dumps(r) + "\n" for r in keep))
    evolve(tiny_model(), doc, cut, 2, final_check=False)
    pick = lambda rs: [(r["generation"], r["index"], r["factors"]) for r in rs  # noqa: E731
                       if r["kind"] == "candidate"]
    assert pick(_rows(cut)) == pick(rows)


def test_evolution_refuses_bad_settings():
    with pytest.raises(ValueError, match="population"):
        Evolution(population=1)


@pytest.mark.parametrize("argv,message", [
    (["--algorithm", "genetic"], "invalid choice"),
    (["--algorithm", "evolution", "--population", "1"], "--population must be at least 2"),
    (["--algorithm", "evolution", "--parents", "9"], "--parents must be between 1 and --population"),
])
def test_cli_checks_evolution_options_before_loading(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(search_cmd, "load_model_from", lambda args: pytest.fail("the model was loaded"))
    monkeypatch.setattr(search_cmd, "load_tokenizer_from", lambda args: pytest.fail("the tokenizer was loaded"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["search", "--target-length", f"{4 * TRAINED}", *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err

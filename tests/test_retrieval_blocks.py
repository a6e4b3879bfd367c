"""Trials added in blocks: `--seed 4 --trials 16` after `--trials 4` computes only the new
trials, tables and plots count each cell's blocks as one (the pooled counts and the Wilson
interval of the pooled counts, from scipy), and a block overlapping a stored one is refused
before anything is computed."""


import pytest

import hf_posext.cli as cli
from _evalkit import char_tokenizer, tiny_checkpoint, tiny_model
from hf_posext.evaluation.retrieval import RetrievalGrid, evaluate_retrieval
from hf_posext.evaluation.retrieval.blocks import merge_blocks, seed_set, seeds_text
from hf_posext.evaluation.shared.store import ResultsError, ResultsStore
from hf_posext.evaluation.shared.record import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")


def test_seed_lists_read_back():
    for seeds in ([0, 1, 2, 3], list(range(4, 20)), [3, 7], list(range(100))):
        assert seed_set(seeds_text(seeds)) == set(seeds)
    assert seeds_text(range(4, 20)) == "4..19" and seeds_text([0, 1, 2]) == "0,1,2"


def _row(seeds, correct, score, finished="2026-01-01T00:00:00+00:00", **cell):
    base = {"task": "single_needle", "haystack": "noise", "method": "yarn", "factor": 2.0, "knobs": "",
            "length": 8192, "depth": 0.5, "data_hash": "d", "model_fingerprint": "m", "dtype": "float32",
            "attn_implementation": "sdpa", "seeds_list": seeds_text(seeds), "trials": len(seeds),
            "correct": correct, "score": score, "seconds": 10.0, "answers": [["a"]], "outputs": ["o"],
            "finished_at": finished}
    return {**base, **cell}


def test_blocks_of_a_cell_merge_into_one_row():
    from scipy.stats import binomtest
    rows = [_row(range(0, 4), 1, 0.25), _row(range(4, 20), 9, 0.5625), _row(range(0, 4), 3, 0.75, depth=1.0)]
    merged = merge_blocks(rows)
    assert len(merged) == 2
    cell = merged[0]
    assert (cell["correct"], cell["trials"], cell["seeds_list"], cell["blocks"]) == (10, 20, "0..19", 2)
    assert cell["accuracy"] == 0.5 and cell["score"] == 0.5 and cell["seconds"] == 20.0
    wilson = binomtest(10, 20).proportion_ci(confidence_level=0.95, method="wilson")
    assert (cell["ci_low"], cell["ci_high"]) == (round(wilson.low, 4), round(wilson.high, 4))
    assert merged[1] == rows[2]                                   # a lone block stays as stored


def test_the_same_seeds_again_counts_once_the_latest():
    old, new = _row(range(4), 1, 0.25), _row(range(4), 3, 0.75, finished="2026-02-01T00:00:00+00:00")
    assert merge_blocks([new, old]) == [new] and merge_blocks([old, new]) == [new]


def test_overlapping_blocks_are_refused():
    with pytest.raises(ResultsError, match="overlap"):
        merge_blocks([_row(range(0, 4), 1, 0.25), _row(range(2, 6), 1, 0.25)])


def test_a_block_adds_trials_and_an_overlapping_one_is_refused_before_computing(tmp_path):
    tok, model = char_tokenizer(), tiny_model()
    asked = []

    def first_right(model, tokenizer, cell, reuse_prefix):   # right on even seeds
        asked.extend(t.seed for t in cell.trials)
        return [", ".join(t.answers) if t.seed % 2 == 0 else "no idea" for t in cell.trials]

    def run(**seeds):
        grid = RetrievalGrid(["yarn"], [700], depths=[0.5], **seeds)
        with ResultsStore(tmp_path, "retrieval", resume=True) as store:
            evaluate_retrieval(model, tok, grid, store=store, answer_fn=first_right, progress=False)
            return store.rows

    run(trials=4)
    asked.clear()
    stored = run(seed=4, trials=6)
    assert sorted(set(asked)) == list(range(4, 10))             # only the new trials ran
    merged = merge_blocks(stored)
    assert {(r["method"], r["correct"], r["trials"], r["seeds_list"]) for r in merged} == {
        ("none", 5, 10, "0..9"), ("yarn", 5, 10, "0..9")}
    asked.clear()
    with pytest.raises(ResultsError, match=r"seeds 0,1,2,3 are stored; seeds 2,3,4 would count 2,3 twice"):
        run(seed=2, trials=3)
    assert asked == []


def test_command_adds_a_block_and_reports_the_cell_whole(tmp_path, capsys):
    model = tiny_checkpoint(tmp_path / "tiny")
    out = tmp_path / "r"
    argv = ["retrieval", "--model", str(model), "--lengths", "700", "--methods", "yarn", "--depths", "1",
            "--out", str(out), "--no-progress", "--no-plot", "--dtype", "float32"]
    assert cli.main(argv + ["--trials", "2"]) == 0
    capsys.readouterr()
    assert cli.main(argv + ["--seed", "2", "--trials", "3", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "5 trial(s) per cell" in printed
    rows = read_rows(out / "retrieval.json")
    assert sorted((r["method"], r["seeds_list"]) for r in rows) == [
        ("none", "0,1"), ("none", "2,3,4"), ("yarn", "0,1"), ("yarn", "2,3,4")]
    with pytest.raises(SystemExit) as stop:                  # one line, nothing computed
        cli.main(argv + ["--seed", "1", "--trials", "2", "--resume"])
    assert stop.value.code == 2 and "seeds 0,1 are stored; seeds 1,2 would count 1 twice" in capsys.readouterr().err
    assert len(read_rows(out / "retrieval.json")) == 4

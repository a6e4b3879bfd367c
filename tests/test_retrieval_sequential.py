"""Sequential trials (hf_posext/evaluation/retrieval/sequential.py, schedule.py, and designs.py's
replay of the committed grid's trials): the exact
interval against scipy, the error rate the rule states checked by simulation at known p (and a
rule without the correction for repeated looks failing the same check), the effective length's
bounds, and the sequential grid on a tiny model with stub answers, an injected clock and a
budget that stops it and a resume that continues it."""

from pathlib import Path

import pytest

from _evalkit import char_tokenizer
from hf_posext.evaluation.retrieval import RetrievalGrid
from hf_posext.evaluation.retrieval.schedule import Budget, decisions_table, evaluate_sequential
from hf_posext.evaluation.retrieval.sequential import (ABOVE, BELOW, UNDECIDED, SequentialRule,
                                                       clopper_pearson, effective_bounds, simulate)
from hf_posext.evaluation.shared.store import ResultsError, ResultsStore
from hf_posext.patcher import is_patched
from hf_posext.evaluation.shared.record import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("k, n", [(0, 20), (5, 20), (20, 20), (38, 40), (11, 20), (37, 200), (1, 1)])
def test_clopper_pearson_is_scipys_exact_interval(k, n):
    from scipy.stats import binomtest
    for level in (0.95, 0.99, 0.998):
        ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
        assert clopper_pearson(k, n, (1 - level) / 2) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert clopper_pearson(0, 20, 0.025)[1] == pytest.approx(1 - 0.025 ** (1 / 20))   # closed form at k = 0


def test_the_bonferroni_rule_splits_the_error_over_its_looks():
    rule = SequentialRule(look=4, max_trials=20, confidence=0.95, boundary="bonferroni")
    assert rule.looks == 5 and rule.look_seeds(0, 2) == [4, 5, 6, 7] and rule.look_seeds(10, 5) == [26, 27, 28, 29]
    assert SequentialRule(look=8, max_trials=20).looks == 3 and SequentialRule(8, 20).look_seeds(0, 3) == [16, 17, 18, 19]
    assert rule.interval(3, 20) == pytest.approx(clopper_pearson(3, 20, 0.05 / 5))
    assert rule.decide(0, 20, 0.3)[0] == BELOW                  # upper bound 1 - 0.01^(1/20) = 0.21
    assert rule.decide(20, 20, 0.79)[0] == ABOVE and rule.decide(20, 20, 0.8)[0] == UNDECIDED   # low 0.01^(1/20) = 0.794
    assert rule.decide(4, 20, 0.3)[0] == UNDECIDED
    assert rule.decide(20, 20, None)[0] == UNDECIDED            # no bar: nothing to decide
    for bad in (dict(look=0), dict(look=8, max_trials=4), dict(confidence=1.0), dict(max_trials=2.5),
                dict(boundary="pocock")):
        with pytest.raises(ValueError):
            SequentialRule(**bad)


# (depths' accuracies, bar): just above and just below the bar, one depth, five depths, and
# depths that differ (the pooled rate is their mean: Hoeffding 1956's case)
CASES = [([0.35] * 5, 0.30), ([0.25] * 5, 0.30), ([0.95, 0.95], 0.90), ([0.85, 0.85], 0.90),
         ([0.6], 0.5), ([0.4], 0.5), ([1.0, 0.5, 0.0, 0.0, 0.25], 0.30), ([1.0, 0.5, 0.0, 0.0, 0.25], 0.40)]


@pytest.mark.parametrize("boundary", ["exact", pytest.param("bonferroni", marks=pytest.mark.slow)])
@pytest.mark.parametrize("p_depths, bar", CASES)
def test_wrong_decisions_stay_below_the_stated_rate(p_depths, bar, boundary):
    rule, runs = SequentialRule(look=4, max_trials=20, confidence=0.90, boundary=boundary), 4000
    counts, mean_trials = simulate(p_depths, bar, rule, runs, seed=1)
    p = sum(p_depths) / len(p_depths)
    wrong = counts[BELOW] if p >= bar else counts[ABOVE]
    # the stated rate: a wrong decision needs the bound on its side to miss at some look, <= alpha;
    # 4000 runs: 3 binomial standard errors of slack at that rate
    alpha = 1 - rule.confidence
    assert wrong / runs <= alpha + 3 * (alpha / runs) ** 0.5, (counts, mean_trials)
    assert mean_trials <= 20 * len(p_depths)
    print(f"p={p:.3f} bar={bar}: {counts}, {mean_trials:.1f} trials per cell of at most {20 * len(p_depths)}")


# the zone's edges and beyond: p >= bar + delta must not be called below, p < bar - delta not above
ZONE_CASES = [([0.40] * 5, 0.30), ([0.19] * 5, 0.30), ([1.0, 1.0], 0.90), ([0.79, 0.79], 0.90),
              ([1.0, 0.6, 0.0, 0.0, 0.4], 0.30)]


@pytest.mark.parametrize("p_depths, bar", ZONE_CASES)
def test_an_indifference_zone_keeps_the_rate_outside_it_and_stops_sooner(p_depths, bar):
    zone = SequentialRule(look=4, max_trials=20, confidence=0.90, indifference=0.1)
    plain = SequentialRule(look=4, max_trials=20, confidence=0.90)
    runs = 4000
    counts, mean_trials = simulate(p_depths, bar, zone, runs, seed=3)
    p = sum(p_depths) / len(p_depths)
    assert p >= bar + 0.1 or p < bar - 0.1   # the cases lie outside the zone, where the rate is stated
    wrong = counts[BELOW] if p >= bar else counts[ABOVE]
    alpha = 1 - zone.confidence
    assert wrong / runs <= alpha + 3 * (alpha / runs) ** 0.5, counts
    # the zone moves each bound's threshold towards the cell, so it never needs more trials
    assert mean_trials <= simulate(p_depths, bar, plain, runs, seed=3)[1]


def test_inside_the_zone_the_point_estimate_calls_it():
    rule = SequentialRule(look=400, max_trials=400, confidence=0.95, indifference=0.1, boundary="bonferroni")
    # one look, 300/400 = 0.75, bar 0.78: the interval (about [0.71, 0.79]) lies in [0.68, 0.88)
    decision, low, high = rule.decide(300, 400, 0.78)
    assert 0.68 <= low and high < 0.88 and decision == BELOW
    assert rule.decide(300, 400, 0.74)[0] == ABOVE
    # without the zone the same counts stay open against 0.78
    assert SequentialRule(400, 400, 0.95, boundary="bonferroni").decide(300, 400, 0.78)[0] == UNDECIDED
    for bad in (-0.1, 0.5, True):
        with pytest.raises(ValueError, match="indifference must be in"):
            SequentialRule(indifference=bad)


def test_clear_cells_stop_early():
    rule = SequentialRule(look=4, max_trials=20, confidence=0.95)
    counts, mean_trials = simulate([0.0] * 5, 0.3, rule, 500)
    assert counts[BELOW] == 500 and mean_trials == 20           # one look of 4 trials at 5 depths, not 100
    counts, mean_trials = simulate([1.0] * 5, 0.3, rule, 500)
    assert counts[ABOVE] == 500 and mean_trials == 20


def test_a_fixed_interval_read_at_every_look_breaks_the_rate():
    """The check above can fail: a 0.90 bound without the split, read after every look, decides
    wrongly more often than 10 % at p on the bar (Armitage, McPherson & Rowe 1969)."""
    class Naive(SequentialRule):
        def interval(self, k, n, bar=None, depths=None):
            return clopper_pearson(k, n, 1 - self.confidence)

    runs = 4000
    counts, _ = simulate([0.5], 0.5, Naive(look=4, max_trials=40, confidence=0.90), runs, seed=2)
    assert counts[BELOW] / runs > 0.10 + 3 * (0.10 / runs) ** 0.5
    counts, _ = simulate([0.5], 0.5, SequentialRule(look=4, max_trials=40, confidence=0.90), runs, seed=2)
    assert counts[BELOW] / runs <= 0.10


def test_effective_bounds_follow_the_decisions():
    assert effective_bounds([(8192, ABOVE), (16384, BELOW)]) == (8192, 8192)
    assert effective_bounds([(8192, ABOVE), (16384, ABOVE)]) == (16384, 16384)
    assert effective_bounds([(8192, ABOVE), (16384, UNDECIDED), (32768, BELOW)]) == (8192, 16384)
    assert effective_bounds([(8192, BELOW), (16384, ABOVE)]) == (None, None)
    assert effective_bounds([(16384, UNDECIDED), (8192, ABOVE), (32768, ABOVE)]) == (8192, 32768)


# --- the grid, on a tiny model with stub answers ---------------------------------------------

L = 1024
RIGHT = {("none", 1): True, ("yarn", 1): True, ("yarn", 2): False, ("yarn", 3): True,
         ("none", 2): False, ("none", 3): False}


class Stub:
    """Answers right by (method, length / 700) as RIGHT says; each trial advances a fake clock by
    length / 700 seconds (1, 2, 3 s at 700, 1400, 2100 tokens)."""

    def __init__(self):
        self.now, self.asked = 0.0, []

    def clock(self):
        return self.now

    def __call__(self, model, tokenizer, cell, reuse_prefix):
        size = round(len(cell.prompt(0)) / 700)
        method = "yarn" if is_patched(model) else "none"
        self.asked += [(method, size, t.seed) for t in cell.trials]
        self.now += size * len(cell.trials)
        return [", ".join(t.answers) if RIGHT[method, size] else "no idea" for t in cell.trials]


@pytest.fixture(scope="module")
def model():
    from _evalkit import TINY
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, "max_position_embeddings": L})).eval()


def run(model, tmp_path, stub, budget=None):
    grid = RetrievalGrid(["yarn"], [700, 1400, 2100], depths=[0.0, 1.0], factors=[2.0], margin=0.4)
    rule = SequentialRule(look=4, max_trials=8, confidence=0.90)   # 2 looks; 8/8 -> low 0.05^(1/8) = 0.69, 0/8 -> high 0.31
    with ResultsStore(tmp_path, "retrieval", resume=True) as store:
        return evaluate_sequential(model, char_tokenizer(), grid, rule, store=store, budget=budget,
                                   answer_fn=stub, clock=stub.clock, log=lambda s: None)


def decisions(state):
    return {(q.method, q.length): (q.decision, q.trials) for q in state.questions}


def test_sequential_grid_stops_each_cell_when_decided(model, tmp_path):
    stub = Stub()
    state = run(model, tmp_path, stub)
    assert state.bars == {"single_needle": pytest.approx(0.6)}      # reference 16/16, margin 0.4
    assert decisions(state) == {("none", 700): (ABOVE, 16), ("yarn", 700): (ABOVE, 8),
                                ("none", 1400): (BELOW, 8), ("yarn", 1400): (BELOW, 8),
                                ("none", 2100): (BELOW, 8), ("yarn", 2100): (ABOVE, 8)}
    assert len(stub.asked) == 16 + 5 * 8                             # the fixed design: 6 x 16 = 96
    assert stub.asked[:16] == [("none", 1, s) for s in (0, 1, 2, 3) * 2] + [("none", 1, s) for s in (4, 5, 6, 7) * 2]
    eff = state.effective()
    assert eff[("single_needle", "yarn", "2.0", "")] == (700, 700)  # 2100 passes, 1400 does not
    table = decisions_table(state)
    assert "effective length 700" in table and "stopped" not in table
    rows = read_rows(tmp_path / "retrieval.json")
    assert len(rows) == 2 * (2 + 5)                                  # a row per depth and look
    first = [r for r in rows if r["method"] == "none" and r["length"] == 700 and r["look"] == 1]
    assert {(r["decision"], r["bar"], r["confidence"], r["max_trials"], r["rule"]) for r in first} == {
        (ABOVE, 0.6, 0.9, 8, "exact")}
    assert {r["decision"] for r in rows if r["method"] == "yarn" and r["length"] == 1400} == {BELOW}


def test_a_budget_stops_cleanly_and_resume_continues_the_plan(model, tmp_path):
    stub = Stub()
    state = run(model, tmp_path, stub, Budget(seconds=30))
    # reference 16 s; yarn at 700 (8 x 1 s, measured at 700) fits the 14 s left; a look at 1400 is
    # estimated at 8 x 1 s x (1400/700)^2 = 32 s and does not
    assert len(stub.asked) == 24 and stub.now == 24
    assert {q.label() for q in state.open_questions()} == {   # nothing below 2100 decided below yet
        f"single_needle {m} at {n}" for m in ("none", "yarn s=2") for n in (1400, 2100)}
    assert "the budget (0.5 min) is spent" in decisions_table(state)
    assert len(read_rows(tmp_path / "retrieval.json")) == 6
    stub.asked.clear()
    state = run(model, tmp_path, stub, Budget(trials=16))             # the stored looks are not rerun
    assert {(m, size) for m, size, _ in stub.asked} == {("none", 2), ("yarn", 2)}
    assert not state.open_questions() and state.stopped == "the budget (16 trials) is spent"
    stub.asked.clear()
    state = run(model, tmp_path, stub)
    assert {(m, size) for m, size, _ in stub.asked} == {("none", 3), ("yarn", 3)}   # coverage, last
    assert decisions(state)[("yarn", 2100)] == (ABOVE, 8) and not state.stopped


def test_a_sequential_look_overlapping_a_stored_block_is_refused(model, tmp_path):
    from hf_posext.evaluation.retrieval import evaluate_retrieval
    with ResultsStore(tmp_path, "retrieval") as store:
        evaluate_retrieval(model, char_tokenizer(), RetrievalGrid(["yarn"], [700], depths=[0.0], trials=6),
                           store=store, answer_fn=Stub(), progress=False)
    with pytest.raises(ResultsError, match="would count 0,1,2,3 twice"):
        run(model, tmp_path, Stub())


def test_no_length_within_the_trained_one_is_an_error(model, tmp_path):
    grid = RetrievalGrid(["yarn"], [1400], depths=[0.0])
    with pytest.raises(ValueError, match="need a length <= the trained length 1024"):
        evaluate_sequential(model, char_tokenizer(), grid, SequentialRule(), answer_fn=Stub())


# --- the command ------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--look", "4"], "--look is for sequential trials; add --sequential"),
    (["--confidence", "0.9"], "--confidence is for sequential trials"),
    (["--sequential", "--confidence", "1.2"], "--confidence must be in [0.5, 1)"),
    (["--sequential", "--trials", "4", "--look", "8"], "--look 8 is more than --trials 4 (a cell's most)"),
    (["--sequential", "--trials", "2"], "--look 4 (the default) is more than --trials 2"),
    (["--sequential", "--look", "0"], "--look (trials per look) must be at least 1"),
    (["--indifference", "0.1"], "--indifference is for sequential trials"),
    (["--sequential", "--indifference", "0.5"], "--indifference must be in [0, 0.5)"),
    (["--budget", "30x"], "--budget '30x': give wall time as 30m, 2h or 90s"),
    (["--budget", "0"], "--budget must be at least 1 trial"),
    (["--boundary", "exact"], "--boundary is for sequential trials"),
    (["--prefix-cache-gb", "2"], "--prefix-cache-gb is for sequential trials"),
    (["--sequential", "--prefix-cache-gb", "-1"], "--prefix-cache-gb must be >= 0"),
    (["--sequential", "--prefix-cache-gb", "nan"], "--prefix-cache-gb must be >= 0"),
    (["--bar", "0.7"], "--bar is for sequential trials"),
    (["--sequential", "--bar", "1.5"], "--bar must be an accuracy in (0, 1]"),
])
def test_bad_sequential_flags_fail_before_loading(extra, message, tmp_path, capsys, monkeypatch):
    import hf_posext.cli as cli
    from hf_posext.commands import model_args
    monkeypatch.setattr(model_args, "load_model_from", lambda args: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["retrieval", "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def stubbed_checkpoint(tmp_path, monkeypatch):
    """A tiny Llama (trained length L) saved with the character tokenizer, and the `Stub` that
    answers every cell the command runs in its place."""
    from hf_posext.evaluation.retrieval import schedule
    from _evalkit import TINY
    from transformers import LlamaConfig, LlamaForCausalLM
    path = tmp_path / "tiny"
    LlamaForCausalLM(LlamaConfig(**{**TINY, "max_position_embeddings": L})).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    stub = Stub()
    monkeypatch.setattr(schedule, "answer_cell", stub)
    return path, stub


def test_command_budget_then_resume(tmp_path, capsys, monkeypatch):
    """`--budget 24` (trials) stops after the reference (16) and one look (8), saying what is open;
    `--resume` with a larger budget continues without recomputing."""
    import hf_posext.cli as cli
    path, stub = stubbed_checkpoint(tmp_path, monkeypatch)
    argv = ["retrieval", "--model", str(path), "--lengths", "700,1400", "--methods", "yarn", "--factor", "2",
            "--depths", "0,1", "--margin", "0.4", "--trials", "8", "--look", "4", "--confidence", "0.9",
            "--boundary", "bonferroni",   # its bounds in closed form: 0.05^(1/8) = 0.69, 1 - 0.69
            "--out", str(tmp_path / "r"), "--no-progress", "--no-plot"]
    assert cli.main(argv + ["--budget", "24"]) == 0
    printed = capsys.readouterr().out
    assert len(stub.asked) == 24 and "the budget (24 trials) is spent; open:" in printed
    assert "single_needle none at 1400" in printed.splitlines()[-1]
    assert "700 above 16/16" in printed and "effective length" in printed
    stub.asked.clear()
    assert cli.main(argv + ["--budget", "100", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert len(stub.asked) == 16 and "stopped" not in printed               # one look of each at 1400
    assert "yarn s=2: 700 above 8/8 [0.69, 1.00]; 1400 below 0/8 [0.00, 0.31] -> effective length 700" in printed


def test_after_the_last_look_the_point_estimate_decides_flagged():
    from hf_posext.evaluation.retrieval.sequential import call
    assert call(UNDECIDED, 38, 40, 0.9, complete=True) == (ABOVE, True)      # 0.95 >= 0.9
    assert call(UNDECIDED, 4, 20, 0.3, complete=True) == (BELOW, True)
    assert call(UNDECIDED, 38, 40, 0.9, complete=False) == (UNDECIDED, False)   # looks left: open
    assert call(BELOW, 0, 8, 0.9, complete=False) == (BELOW, False)
    assert call(UNDECIDED, 0, 8, None, complete=True) == (UNDECIDED, False)


def test_replay_stops_where_the_rule_does_and_says_when_the_folder_runs_out():
    from hf_posext.evaluation.retrieval.designs import replay
    rule = SequentialRule(look=4, max_trials=20, confidence=0.95, boundary="bonferroni")
    none_right = {d: [False] * 20 for d in (0.0, 0.5)}
    assert replay(none_right, rule, 0.9) == dict(decision=BELOW, used=8, more=False, call=(BELOW, False))
    few = {d: [True] * 4 for d in (0.0, 0.25, 0.5, 0.75, 1.0)}             # 20/20, then no more trials
    assert replay(few, rule, 0.9) == dict(decision=UNDECIDED, used=20, more=True, call=(UNDECIDED, False))
    all_right = {d: [True] * 20 for d in (0.5, 1.0)}                          # 40/40 against 0.9: 44 needed
    assert replay(all_right, rule, 0.9) == dict(decision=UNDECIDED, used=40, more=False, call=(ABOVE, True))
    # the exact levels: 32/32 has P = 0.9^32 = 0.034 at the bar, the crossing's whole chance by then
    exact = SequentialRule(look=4, max_trials=20, confidence=0.95)
    assert replay(all_right, exact, 0.9) == dict(decision=ABOVE, used=32, more=False, call=(ABOVE, False))


GRID = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "retrieval-2x" / "retrieval.json"


def test_replay_rescoring_equals_the_committed_counts():
    from hf_posext.evaluation.retrieval.designs import outcomes
    rows = read_rows(GRID)
    per = outcomes(rows)                              # raises if a row's outcomes disagree with its count
    assert sum(sum(map(len, q.values())) for q in per.values()) == sum(int(r["trials"]) for r in rows)
    bad = {**rows[0], "correct": int(rows[0]["correct"]) + 1}
    with pytest.raises(ValueError, match="scored again"):
        outcomes([bad])


@pytest.mark.slow
def test_the_replay_script_writes_its_page(tmp_path):
    """`python benchmarks/retrieval_sequential.py` (few simulated runs) writes the replay's page."""
    import os
    import subprocess
    import sys
    script = GRID.parents[2] / "retrieval_sequential.py"
    proc = subprocess.run([sys.executable, str(script), "--runs", "20", "--mixes", "3", "--out", str(tmp_path / "r.md")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(GRID.parents[3])}, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "A replay of the committed per-trial outcomes, not a rerun" in (tmp_path / "r.md").read_text()


def test_a_length_after_a_point_estimate_below_gets_no_more_looks():
    from hf_posext.evaluation.retrieval.schedule import Question, SequentialResult, _priority
    rule = SequentialRule(look=4, max_trials=8, confidence=0.95)
    q8 = Question("t", "yarn", "2", 2.0, "", 8192, 1, False, 0, looks=[(3, 4), (4, 4)])     # 7/8, undecided
    q16 = Question("t", "yarn", "2", 2.0, "", 16384, 1, False, 1, looks=[(0, 4)])
    state = SequentialResult([], [q8, q16], {"t": 0.9}, rule)
    assert state.call(q8) == (BELOW, True) and _priority(q16, state) is None     # 0.875 < 0.9: ends at 8k
    state.bars = {"t": 0.8}
    assert state.call(q8) == (ABOVE, True) and _priority(q16, state) is not None


def test_a_methods_first_look_is_estimated_at_its_own_pace():
    """The budget's estimate for a method's first look at a length: another method's looks there,
    times the two methods' ratio where both ran (the live 2x grid: DualChunk's first 16k look cost
    1.5x YaRN's, as its 8k look had cost 1.6x; estimated at YaRN's pace it overran the budget)."""
    from hf_posext.evaluation.retrieval.schedule import Question, SequentialResult, _estimate

    def question(method, length, seconds, looks=1):
        return Question("single_needle", method, "2", 2.0, "", length, 5, False, 0,
                        looks=[(0, 20)] * looks, seconds=[seconds] * looks)
    rule = SequentialRule(look=4, max_trials=20, confidence=0.95)
    yarn8, dc8, yarn16 = question("yarn", 8192, 72.0), question("dual_chunk", 8192, 115.0), question("yarn", 16384, 238.0)
    dc16 = question("dual_chunk", 16384, 0.0, looks=0)
    state = SequentialResult(rows=[], questions=[yarn8, dc8, yarn16, dc16], bars={}, rule=rule)
    assert _estimate(dc16, state, rule, Budget(seconds=60)) == pytest.approx(238.0 * 115.0 / 72.0)
    state.questions.remove(dc8)                                        # no length both ran: the other's pace
    assert _estimate(dc16, state, rule, Budget(seconds=60)) == pytest.approx(238.0)
    assert _estimate(yarn16, state, rule, Budget(seconds=60)) == pytest.approx(238.0)   # its own looks
    assert _estimate(dc16, state, rule, Budget(trials=10)) == 20.0     # trials: the look's size


def test_command_with_a_fixed_bar_asks_the_unpatched_model_within_l_only(tmp_path, capsys, monkeypatch):
    """`--bar 0.5`: every cell is decided against 0.5 (the closed-form bound 0.05^(1/8) = 0.69 at
    8/8), no reference runs in full, and the unpatched model is not asked past L."""
    import hf_posext.cli as cli
    path, stub = stubbed_checkpoint(tmp_path, monkeypatch)
    argv = ["retrieval", "--model", str(path), "--lengths", "700,1400", "--methods", "yarn", "--factor", "2",
            "--depths", "0,1", "--trials", "8", "--look", "4", "--confidence", "0.9",
            "--boundary", "bonferroni", "--sequential", "--bar", "0.5",
            "--out", str(tmp_path / "r"), "--no-progress", "--no-plot"]
    assert cli.main(argv) == 0
    rows = read_rows(tmp_path / "r" / "retrieval.json")
    assert {(r["method"], r["length"]) for r in rows} == {("none", 700), ("yarn", 700), ("yarn", 1400)}
    assert {r["bar"] for r in rows} == {0.5}
    assert len(stub.asked) == 3 * 8   # three questions, each decided at its first look (4 trials x 2 depths)

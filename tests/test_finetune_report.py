"""hf_posext/training/arms_report.py, the report benchmarks/finetune_retrieval.py writes, stands
for every grid the script accepts: several tasks and haystacks, two training seeds (with how far
they differ), a grid without a length past L (no sliding baseline: "—"), an arm not finished (left
out). Perplexity rows are the committed experiment's; retrieval rows are made up here, and the
expected cells are Wilson intervals from the literature (Wilson 1927; e.g. 3/6 -> [0.188, 0.812])."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest

from _recipekit import ROOT
from hf_posext.evaluation.shared.inputs import comma_items
from hf_posext.evaluation.shared.record import read_rows
from hf_posext.training.arms import ARMS, run_name
from hf_posext.training.arms_report import arm_line, report

RESULTS = ROOT / "benchmarks" / "results" / "finetune-retrieval"
TASKS, HAYSTACKS = ["single_needle", "multi_key"], ["noise", "embedded:shakespeare/hamlet"]
# (correct at depth 0.25, correct at depth 0.75) of 3 trials each, per run and (task, haystack)
CORRECT = {"free": lambda t, h: (0, 0), "mix": lambda t, h: (3, 3) if (t, h) == ("single_needle", "noise") else (2, 1),
           "mix-seed1": lambda t, h: (2, 1)}
PPL_FROM = {"free": "free", "mix": "mix", "mix-seed1": "docs"}   # committed rows standing in for a seed


def ppl_rows(arm: str, within_l: bool) -> list[dict]:
    rows = read_rows(RESULTS / arm / "perplexity" / "perplexity.json")
    return [r for r in rows if not within_l or (r["protocol"] == "truncate" and int(r["length"]) <= 8192)]


def make_out(tmp_path, within_l: bool):
    for name, src in PPL_FROM.items():
        for part, rows in (("perplexity", ppl_rows(src, within_l)), ("retrieval", [
                {"task": t, "haystack": h, "length": 16384, "depth": d, "trials": 3, "correct": c,
                 "outputs": ["12345", "0"]} for t in TASKS for h in HAYSTACKS
                for d, c in zip((0.25, 0.75), CORRECT[name](t, h))])):
            (tmp_path / name / part).mkdir(parents=True)
            (tmp_path / name / part / f"{part}.json").write_text(json.dumps({"rows": rows}))
        (tmp_path / name / "done.json").write_text("{}")
    (tmp_path / "docs").mkdir()            # started, not finished: no done.json, not reported
    return Namespace(out=tmp_path, task_list=TASKS, haystack_list=["noise", "hamlet"], sequential=False,
                     depths="0.25,0.75", trials=3, factor=2.0, eval_document="hamlet", look=None, bar=None)


def table(report: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in report.splitlines()
            if line.startswith(("| training-free", "| fine-tuned"))]


def report_of(tmp_path, within_l: bool) -> str:
    args = make_out(tmp_path, within_l)
    path = report(args, ["free", "docs", "docs-seed1", "mix", "mix-seed1"], plots=False)
    return path.read_text()


def test_a_grid_of_tasks_haystacks_and_seeds(tmp_path):
    report = report_of(tmp_path, within_l=False)
    head = next(line for line in report.splitlines() if line.startswith("| arm |"))
    columns = [c.strip() for c in head.strip("|").split("|")]
    assert columns[-4:] == [f"{t}, {h} 16k [Wilson 95 %]" for t in TASKS for h in ("noise", "hamlet")]
    rows = {r[0]: r for r in table(report)}
    assert list(rows) == ["training-free", "fine-tuned, documents + synthetic",
                          "fine-tuned, documents + synthetic (seed 1)"]
    assert rows["training-free"][-4:] == ["0/6 = 0.00 [0.00, 0.39]"] * 4
    assert rows["fine-tuned, documents + synthetic"][-4:] == ["6/6 = 1.00 [0.61, 1.00]"] + ["3/6 = 0.50 [0.19, 0.81]"] * 3
    assert rows["fine-tuned, documents + synthetic (seed 1)"][-4:] == ["3/6 = 0.50 [0.19, 0.81]"] * 4
    # how far the seeds differ: ppl at 4k from the rows themselves, accuracy 1.0 vs 0.5
    ppl4k = [next(r["perplexity"] for r in ppl_rows(a, False) if r["protocol"] == "truncate"
                  and int(r["length"]) == 4096) for a in ("mix", "docs")]
    spread = next(line for line in report.splitlines() if line.startswith("Seeds of"))
    assert f"ppl 4k {abs(ppl4k[0] - ppl4k[1]):.3g};" in spread
    assert "single_needle, noise 16k [Wilson 95 %] 0.5;" in spread and "multi_key, hamlet 16k [Wilson 95 %] 0 " in spread
    assert "## docs" not in report and "## mix-seed1" in report
    assert "| multi_key | hamlet | 16384 | 0.75 | 1 / 3 |" in report


def test_a_sequential_grid_says_its_looks_and_most_in_the_flags_words(tmp_path):
    args = make_out(tmp_path, within_l=False)
    args.sequential, args.look, args.trials, args.bar = True, 1, 3, 0.9
    text = report(args, ["free", "mix"], plots=False).read_text()
    assert "(depths 0.25,0.75, sequential trials: looks of 1 a depth, at most 3, bar 0.9;" in text


def test_a_grid_within_the_trained_length_reports_no_past_l_column(tmp_path):
    rows = table(report_of(tmp_path, within_l=True))
    assert len(rows) == 3 and all(r[4] == "—" for r in rows)          # arm, 4k, 8k, change, past L
    assert rows[0][3] == "+0.0 %"


def test_the_report_line_of_a_grid_within_the_trained_length():
    """A grid with no length past L has no sliding baseline: the arm's line says "—" there instead
    of dying in the report after the training (it once died with a raw StopIteration after 45 minutes)."""
    rows = [{"trained_length": 8192, "protocol": "truncate", "length": 4096, "perplexity": 20.0}]
    line = arm_line("mix", rows, [], None, [8192])
    assert line == "| fine-tuned, documents + synthetic | 20.00 | — | — | not run |"


COMMITTED = sorted(p.parent for p in (ROOT / "benchmarks" / "results").glob("finetune-retrieval*/report.md"))


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_each_committed_report_is_its_rows(folder, tmp_path):
    """Each committed report.md is what the report makes of the committed rows (nothing edited by
    hand), read with the settings its arms stored in done.json; on a copy, without the plots.
    tests/test_finetune_retrieval.py runs the script itself on the first experiment's rows."""
    import shutil
    names = list(dict.fromkeys(run_name(arm, seed) for arm in ARMS for seed in range(10)))
    done = [n for n in names if (folder / n / "done.json").exists()]
    for name in done:
        for part in ("perplexity", "retrieval"):
            (tmp_path / name / part).mkdir(parents=True)
            shutil.copy(folder / name / part / f"{part}.json", tmp_path / name / part)
        shutil.copy(folder / name / "done.json", tmp_path / name)
    stored = json.loads((folder / done[0] / "done.json").read_text())
    args = Namespace(out=tmp_path, task_list=comma_items(stored.get("tasks", "single_needle")),
                     haystack_list=comma_items(stored.get("haystacks", "noise")),
                     sequential=stored.get("sequential", False), bar=stored.get("bar"),
                     # a sequential run's done.json: `trials` the trials per look, `max_trials` a cell's most
                     look=stored["trials"] if stored.get("sequential") else None,
                     trials=stored.get("max_trials", stored["trials"]),
                     **{k: stored[k] for k in ("depths", "factor", "eval_document")})
    assert report(args, names, plots=False).read_text() == (folder / "report.md").read_text()

"""benchmarks/retrieval_live.py: the sequential run and the fixed design, live in one invocation.
Answers come from a stub (right or wrong by method and length), so the trials each design runs
and the calls follow from the rule's closed-form bounds, worked by hand below."""

import importlib.util
from pathlib import Path

import pytest

from _evalkit import TINY, char_tokenizer
from hf_posext.patcher import is_patched

ROOT = Path(__file__).resolve().parents[1]


def script():
    spec = importlib.util.spec_from_file_location("retrieval_live", ROOT / "benchmarks" / "retrieval_live.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RIGHT = {("none", 1): True, ("yarn", 1): True, ("none", 2): False, ("yarn", 2): True}


def stub(model, tokenizer, cell, reuse_prefix):
    size = round(len(cell.prompt(0)) / 700)
    right = RIGHT["yarn" if is_patched(model) else "none", size]
    return [(", ".join(t.answers) if right else "no idea") + f" (seed {t.seed})" for t in cell.trials]


@pytest.mark.parametrize("argv, says", [
    (["--", "--trials", "4"], "--trials after `--`"),
    (["--", "--out=x"], "--out after `--`"),
    (["--trials", "3", "--max-trials", "8"], "not a whole number of looks"),
    (["--trials", "0"], "need 1 <= trials"),
    (["--", "--dtype", "auto"], "--dtype auto after `--`"),
    (["--", "--dtype=auto"], "--dtype auto after `--`"),
])
def test_bad_inputs_fail_before_any_run(tmp_path, capsys, argv, says):
    with pytest.raises(SystemExit) as stop:
        script().parse(["--out", str(tmp_path / "o"), *argv])
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_live_run_trials_calls_and_report(tmp_path, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posext.evaluation.retrieval import run, schedule
    path = tmp_path / "tiny"
    LlamaForCausalLM(LlamaConfig(**{**TINY, "max_position_embeddings": 1024})).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    monkeypatch.setattr(run, "answer_cell", stub)        # the fixed design's answers
    monkeypatch.setattr(schedule, "answer_cell", stub)   # the sequential looks'
    live = script()
    out = tmp_path / "live"
    common = ["--", "--model", str(path), "--lengths", "700,1400", "--methods", "yarn", "--factor", "2",
              "--depths", "0,1", "--margin", "0.4", "--confidence", "0.9", "--boundary", "bonferroni"]
    assert live.main(["--out", str(out), "--trials", "4", "--max-trials", "8", *common]) == 0
    table = {tuple(c.strip() for c in line.split("|")[1:4]): [c.strip() for c in line.split("|")[4:12]]
             for line in (out / "report.md").read_text().splitlines() if line.startswith("| single_needle")}
    # bar = 16/16 - 0.4 = 0.6; Bonferroni 0.1 / 2 looks = 0.05 a look: 8/8 has lower bound
    # 0.05^(1/8) = 0.69 >= 0.6 (above after one look of 4 trials x 2 depths), 0/8 upper bound
    # 1 - 0.69 = 0.31 < 0.6 (below); the fixed design runs 8 x 2 depths a cell
    ref = table["single_needle", "none s=1", "700"]
    assert (ref[0], ref[2], ref[3], ref[5]) == ("16", "reference", "16", "reference")   # in full in both
    for (method, length), call in {("yarn s=2", "700"): "above", ("yarn s=2", "1400"): "above",
                                   ("none s=1", "1400"): "below"}.items():
        seq_n, _, seq_call, fix_n, _, fix_call, same, text = table["single_needle", method, length]
        assert (seq_n, seq_call, fix_n, fix_call, same, text) == ("8", call, "16", f"{call} (0.60)", "yes", "8/8")
    total = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("| all"))
    assert "**40** (62%)" in total and "| 64 |" in total      # 16 + 3 x 8 of 16 + 3 x 16
    assert total.endswith("| 40/40 |")                       # every trial both ran, by (depth, seed)
    seq_rows = [{"depth": 0.0, "seeds_list": "0,1", "outputs": "a | b"}, {"depth": 1.0, "seeds_list": "0", "outputs": "c"}]
    fix_rows = [{"depth": 0.0, "seeds_list": "0,1,2", "outputs": "a | x | y"}, {"depth": 1.0, "seeds_list": "0", "outputs": "c"}]
    assert live.same_text(seq_rows, fix_rows) == (2, 3)      # seed 1 at depth 0 differs
    with pytest.raises(SystemExit):                          # a second run must say --resume
        live.parse(["--out", str(out)])
    assert live.without_rule(["--confidence", "0.9", "--lengths", "8k", "--boundary=exact"]) == ["--lengths", "8k"]

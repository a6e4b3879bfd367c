"""The sliding-window baseline of `hf-posext retrieval --baseline`: the unpatched model asked each
prompt cut to its trained window (the task's instruction kept, the haystack cut from the left).
Checked against what the window must hold (the instruction, the question, a needle inside it and
not one before it) and against transformers' own greedy `generate` of an unpatched model."""

from __future__ import annotations

import pytest
import torch

import hf_posext.cli as cli
from _evalkit import char_tokenizer, tiny_checkpoint, tiny_model
from hf_posext.commands import model_args
from hf_posext.evaluation.retrieval import RetrievalGrid, build_cell, evaluate_retrieval, get_task
from hf_posext.evaluation.retrieval.haystack import load_haystack
from hf_posext.evaluation.shared.record import read_rows
from hf_posext.evaluation.shared.store import ResultsStore

WINDOW = 512   # the trained length of the model below: a character tokenizer's prompts pass it at 900


def model_at(trained: int = WINDOW):
    return tiny_model(max_position_embeddings=trained)


@pytest.mark.parametrize("depth, needle_inside", [(0.0, False), (1.0, True)])
def test_the_window_keeps_the_instruction_the_question_and_only_the_needles_inside_it(depth, needle_inside):
    tok, task = char_tokenizer(), get_task("single_needle")
    full = build_cell(tok, task, load_haystack(tok, "noise", 1500), 1500, depth, [0, 1])
    cut = full.window(WINDOW)
    for i, trial in enumerate(cut.trials):
        text, whole = tok.decode(cut.prompt(i)), tok.decode(full.prompt(i))
        assert len(cut.prompt(i)) + cut.max_new_tokens[i] <= WINDOW < len(full.prompt(i))
        assert text.startswith(trial.head) and text.rstrip().endswith(trial.question.strip())
        assert whole.endswith(text[len(trial.head):])            # the rest is the full prompt's tail
        assert (trial.needles[0] in text) is needle_inside and trial.needles[0] in whole
    assert cut.hold_length <= WINDOW


def test_a_window_too_short_for_the_instruction_is_refused():
    tok = char_tokenizer()
    full = build_cell(tok, get_task("single_needle"), load_haystack(tok, "noise", 900), 900, 0.5, [0])
    with pytest.raises(ValueError, match="cannot hold the task's instruction"):
        full.window(40)


def test_the_baseline_answers_as_transformers_generate_on_the_cut_prompt_and_only_past_l(tmp_path):
    tok, model = char_tokenizer(), model_at()
    grid = RetrievalGrid(["yarn"], [400, 900], depths=[0.0, 1.0], trials=2, baseline=True)
    with ResultsStore(tmp_path, "retrieval", resume=False) as store:
        rows = evaluate_retrieval(model, tok, grid, store=store, progress=False)
    base = [r for r in rows if r["method"] == "baseline"]
    assert {(r["length"], r["depth"]) for r in base} == {(900, 0.0), (900, 1.0)}   # past L only
    assert {r["window"] for r in base} == {WINDOW} and all(r["prompt_tokens"] <= WINDOW for r in base)
    assert all("window" not in r for r in rows if r["method"] != "baseline")
    haystack = load_haystack(tok, "noise", 900)
    reference = model_at()   # a fresh unpatched model of the same weights
    for r in base:
        cut = build_cell(tok, get_task("single_needle"), haystack, 900, r["depth"], [0, 1]).window(WINDOW)
        for i, said in enumerate(r["outputs"]):
            ids = torch.tensor([cut.prompt(i)])
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=cut.max_new_tokens[i], pad_token_id=0)
            assert said == tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_adding_the_baseline_to_a_finished_run_computes_only_its_cells(tmp_path):
    """The baseline's cells carry `window` in their key; the others' keys are as before, so a run
    asked again with the baseline resumes every cell it holds."""
    tok, model = char_tokenizer(), model_at()
    asked = []

    def answer(model, tokenizer, cell, reuse_prefix):
        asked.append(len(cell.prompt(0)))
        return ["no idea"] * len(cell.trials)

    for baseline in (False, True):
        asked.clear()
        grid = RetrievalGrid(["yarn"], [900], depths=[0.5], trials=2, baseline=baseline)
        with ResultsStore(tmp_path, "retrieval", resume=True) as store:
            rows = evaluate_retrieval(model, tok, grid, store=store, answer_fn=answer, progress=False)
    assert len(asked) == 1 and asked[0] <= WINDOW        # the second run asked the baseline alone
    assert [r["method"] for r in rows] == ["baseline", "none", "yarn"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny512"), max_position_embeddings=WINDOW)


@pytest.mark.parametrize("extra, message", [
    (["--lengths", "500"], "--baseline asks the sliding-window baseline past the trained length (512 tokens)"),
    (["--lengths", "900", "--sequential"], "--baseline is a reference asked on the fixed design"),
    (["--lengths", "900", "--budget", "5m"], "drop --sequential / --budget"),
    (["--lengths", "900", "--engine", "vllm"], "drop --engine vllm or ask the baseline in a command of its own"),
])
def test_the_baseline_s_bad_inputs_fail_before_loading(extra, message, checkpoint, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(model_args, "load_model_from", lambda args: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["retrieval", "--model", str(checkpoint), "--baseline", "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_a_window_that_cannot_hold_the_instruction_is_refused_before_loading(capsys, monkeypatch, tmp_path):
    path = tiny_checkpoint(tmp_path / "tiny64")   # trained length 64
    monkeypatch.setattr(model_args, "load_model_from", lambda args: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["retrieval", "--model", str(path), "--baseline", "--lengths", "800", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--baseline: a window of 64 tokens cannot hold the task's instruction" in err, err
    assert not (tmp_path / "o").exists()


def test_the_command_reports_the_baseline_beside_the_methods(checkpoint, capsys, tmp_path):
    out = tmp_path / "r"
    assert cli.main(["retrieval", "--model", str(checkpoint), "--lengths", "900", "--methods", "yarn", "--baseline",
                     "--depths", "0,1", "--trials", "1", "--dtype", "float32", "--no-progress", "--no-plot",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = read_rows(out / "retrieval.json")
    assert sorted({r["method"] for r in rows}) == ["baseline", "none", "yarn"]
    # named as perplexity's baseline is, by its window (the tiny model's 512 tokens)
    assert "single_needle  none, sliding 512 window" in printed, printed


def test_the_baseline_follows_the_unpatched_model_and_a_skipped_cell_stays_out():
    """Cells of a length: the baseline (its prompts the shortest: a run stopped early has them),
    `none`, the methods; a (method, length, s) in `skip` (a sequential run with a fixed bar skips the
    unpatched model past L) is left out, baseline or not."""
    def order(grid):
        return [(c.method, c.length) for c in grid.cells(WINDOW)]
    grid = RetrievalGrid(["yarn"], [400, 900], depths=[0.5], trials=1, factors=[2.0], baseline=True)
    assert order(grid) == [("none", 400), ("yarn", 400), ("baseline", 900), ("none", 900), ("yarn", 900)]
    skipped = RetrievalGrid(["yarn"], [400, 900], depths=[0.5], trials=1, factors=[2.0], skip=[("none", 900, 1.0)])
    assert order(skipped) == [("none", 400), ("yarn", 400), ("yarn", 900)]

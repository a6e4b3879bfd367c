"""`evaluate_sequential(..., bar=b)` (a target accuracy as the bar): no cell is a
reference, a grid needs no length within L, and a cell stops at the look whose Clopper-Pearson
bound clears b. At k = n the lower bound has the closed form tail^(1/n) (and the upper bound at
k = 0 is 1 - tail^(1/n)), the reference the decisions are checked against here."""

import pytest

from _evalkit import TINY, char_tokenizer
from hf_posext.evaluation.retrieval import RetrievalGrid
from hf_posext.evaluation.retrieval.schedule import evaluate_sequential
from hf_posext.evaluation.retrieval.sequential import ABOVE, BELOW, SequentialRule

pytestmark = pytest.mark.usefixtures("one_thread")
L = 1024
RULE = SequentialRule(look=4, max_trials=8, boundary="bonferroni")   # 2 looks: tail 0.05 / 2 in each


@pytest.fixture(scope="module")
def model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, "max_position_embeddings": L})).eval()


def answers(right: bool, asked: list):
    def answer(model, tokenizer, cell, reuse_prefix):
        asked.extend(t.seed for t in cell.trials)
        return [", ".join(t.answers) if right else "no idea" for t in cell.trials]
    return answer


@pytest.mark.parametrize("right, decision", [(True, ABOVE), (False, BELOW)])
def test_a_fixed_bar_decides_past_l_alone(model, right, decision):
    low = 0.025 ** (1 / 8)                           # 8/8 at look 1: 0.631; 0/8: high 0.369
    asked: list = []
    grid = RetrievalGrid(["none"], [1400], depths=[0.0, 1.0])   # no length <= L
    state = evaluate_sequential(model, char_tokenizer(), grid, RULE, bar=0.5, answer_fn=answers(right, asked),
                                log=lambda s: None)
    q, = state.questions
    assert (q.decision, q.trials, len(asked)) == (decision, 8, 8) and state.bars == {"single_needle": 0.5}
    assert (q.low, q.high) == ((pytest.approx(low), 1.0) if right else (0.0, pytest.approx(1 - low)))
    assert not q.reference


def test_with_a_fixed_bar_a_length_within_l_is_no_reference(model):
    asked: list = []
    grid = RetrievalGrid(["none"], [700, 1400], depths=[0.0, 1.0])
    state = evaluate_sequential(model, char_tokenizer(), grid, RULE, bar=0.5, answer_fn=answers(True, asked),
                                log=lambda s: None)
    assert [(q.length, q.reference, q.trials) for q in state.questions] == [(700, False, 8), (1400, False, 8)]
    assert len(asked) == 16                          # a reference would have run to 8 a depth: 16 + 8


@pytest.mark.parametrize("bar", [0.0, 1.5])
def test_a_bar_outside_0_1_is_refused(model, bar):
    with pytest.raises(ValueError, match="a fixed bar must be in"):
        evaluate_sequential(model, char_tokenizer(), RetrievalGrid(["none"], [700]), RULE, bar=bar)


def test_a_checkpoint_asked_as_is_is_the_question_past_l(tmp_path, run_cli):
    """`--methods none --sequential --bar b` on a checkpoint whose config carries its extension
    (a fine-tuned one): the unpatched-reference rule (asked within L only) must not leave the
    grid empty; every depth past L is looked at and decided against b."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import hf_posext
    folder = tmp_path / "extended"
    model = LlamaForCausalLM(LlamaConfig(**{**TINY, "max_position_embeddings": L}))
    hf_posext.patch(model, "yarn", factor=2)             # saved as yarn s = 2 over L = 1024
    model.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    code, out, err = run_cli(["retrieval", "--model", folder, "--methods", "none", "--tasks", "niah_single",
                              "--lengths", "1600", "--depths", "0,1", "--trials", "4", "--look", "2",
                              "--sequential", "--bar", "0.7", "--out", tmp_path / "run", "--no-progress", "--no-plot"])
    assert code == 0, err
    from hf_posext.evaluation import read_rows
    rows = read_rows(tmp_path / "run" / "retrieval.json")
    assert {(r["method"], int(r["length"]), float(r["depth"])) for r in rows} == {("none", 1600, 0.0), ("none", 1600, 1.0)}
    assert all(r["decision"] is not None and r["bar"] == 0.7 for r in rows)

"""The needle probe (retrieval/probe.py) against independent references on a tiny random Llama:
the attention mass on the needle equals the last row of transformers' own `output_attentions`
over the whole prompt (a full eager forward), the answer's loss equals a cross-entropy from a
full forward's logits, the greedy answer is the suite's (`answer_cell`), the needle's span is
where the needle's text is, and the model attends as before once the probe is done."""

import types

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_posext
from _evalkit import TINY, char_tokenizer
from hf_posext.evaluation.retrieval import answer_cell, build_cell, get_task, noise_haystack
from hf_posext.evaluation.retrieval.probe import check_attention, control_span, probe_cell

pytestmark = pytest.mark.usefixtures("one_thread")


def sdpa_model(method: str, attn: str = "sdpa"):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY, attn_implementation=attn)).eval()
    if method != "none":
        hf_posext.patch(model, method, 16.0)
    return model


@pytest.mark.parametrize("method", ["none", "yarn"])
def test_masses_and_loss_equal_a_full_forward(method):
    tok, model = char_tokenizer(), sdpa_model(method)
    reference = sdpa_model(method, attn="eager")   # the same weights, attending eagerly throughout
    cell = build_cell(tok, get_task("single_needle"), noise_haystack(tok), 700, 0.3, [0, 1])
    rows = probe_cell(model, tok, cell, multi_answer=False)
    assert model.config._attn_implementation == "sdpa"   # switched back after the eager step
    assert len(cell.prefix) > 100                          # the shared prefix was really used
    for i, row in enumerate(rows):
        ids = cell.prompt(i)
        with torch.no_grad():
            att = reference(torch.tensor([ids]), output_attentions=True).attentions
        for spans, got in ((row["needle_span"], row["needle_mass"]), (row["control_span"], row["control_mass"])):
            want = [a[0, :, -1, spans[0]:spans[1]].sum(-1).mean().item() for a in att]
            assert got == pytest.approx(want, abs=1e-5)
        assert all(0 <= n and 0 <= c and n + c <= 1 + 1e-6 for n, c in zip(row["needle_mass"], row["control_mass"]))
        assert row["needle_max"] == max(row["needle_mass"]) and len(row["needle_mass"]) == TINY["num_hidden_layers"]
        # the answer's loss: cross-entropy of a full forward's logits over prompt + answer
        answer = tok(" " + cell.trials[i].answers[0], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = reference(torch.tensor([ids + answer])).logits[0, len(ids) - 1:-1]
        nll = torch.nn.functional.cross_entropy(logits, torch.tensor(answer), reduction="none")
        assert row["answer_tokens"] == len(answer) == 6 and tok.decode(answer[:1]) == " "
        assert row["nll_tokens"] == pytest.approx(nll.tolist(), abs=1e-4)
        assert row["nll"] == pytest.approx(nll[1:].mean().item(), abs=1e-4)   # the digits, not the space
        assert row["nll_first"] == pytest.approx(nll[1].item(), abs=1e-4)
    # the greedy answers are the suite's own (answer_cell decodes fewer tokens: a prefix of ours)
    suite = answer_cell(model, tok, cell)
    assert all(r["output"].startswith(" ".join(s.split())) for r, s in zip(rows, suite))
    assert [r["correct"] for r in rows] == [False, False]   # a random model finds no needle


@pytest.mark.parametrize("task, depth", [("single_needle", 0.0), ("niah_single", 0.5),
                                         ("multi_key", 0.25), ("multi_key", 1.0)])
def test_needle_span_is_where_the_needle_text_is(task, depth):
    tok = char_tokenizer()
    cell = build_cell(tok, get_task(task), noise_haystack(tok), 900, depth, [3, 4])
    for i, trial in enumerate(cell.trials):
        start, end = cell.needle_spans[i]
        assert tok.decode(cell.prompt(i)[start:end]) == trial.needles[0]   # the queried needle's text


def test_control_span_is_far_and_as_long():
    assert control_span((100, 140), 1000) == (750, 790)   # the needle before 3/5: at 3/4
    assert control_span((560, 600), 1000) == (750, 790)
    assert control_span((610, 650), 1000) == (250, 290)   # else at 1/4
    with pytest.raises(ValueError, match="no room"):
        control_span((10, 60), 100)


def test_an_attention_the_probe_cannot_read_is_refused_in_one_line():
    fake = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="flash_attention_2"))
    with pytest.raises(ValueError, match="flash_attention_2") as err:
        check_attention(fake)
    assert "\n" not in str(err.value)

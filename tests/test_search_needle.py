"""The needle-driven search objective (LongRoPE2, arXiv 2502.20082; hf_posext/search/needle.py):
loss on the answer tokens only, against a masked cross-entropy computed here from the model's
own logits; its wording is neither the recipe's nor the retrieval suite's; `--objective` reaches
the search log and is checked before the model loads."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _evalkit import char_tokenizer
from conftest import tiny_model

from hf_posext import cli
from hf_posext.commands import search as search_cmd
from hf_posext.evaluation.retrieval import tasks
from hf_posext.search.needle import WORDING, build, needle_objective, needles
from hf_posext.training.synthetic import FORMATS

pytestmark = pytest.mark.usefixtures("one_thread")


def text_doc(n: int, seed: int = 0) -> np.ndarray:
    tok = char_tokenizer()
    rng = random.Random(seed)
    words = ["castle", "storm", "daughter", "crown", "heath", "fool", "letter", "night"]
    text = " ".join(rng.choice(words) for _ in range(n))
    return np.array(tok(text)["input_ids"][:n])


def reference_answer_nll(model, tok, ids, pos) -> float:
    """Mean NLL of the answer, found by reading the text: the last ' {value}.' after the
    question, each answer token predicted from the token before it."""
    text = tok.decode(ids.tolist())
    value = re.search(r"The ticket number of \w+ is (\d+)\.$", text).group(1)
    answer = tok(f" {value}.", add_special_tokens=False)["input_ids"]
    n, k = len(ids), len(answer)
    assert ids[n - k:].tolist() == answer
    with torch.no_grad():
        logits = model(input_ids=ids[None], position_ids=pos[None]).logits[0].float()
    return F.cross_entropy(logits[n - k - 1:n - 1], ids[n - k:]).item()


@pytest.mark.parametrize("target,proxy", [(256, 256), (1024, 512)])
def test_the_needle_loss_is_the_answer_tokens_only(target, proxy):
    tok, model = char_tokenizer(), tiny_model()
    doc = text_doc(target + 1)
    built = [build(doc, tok, target, proxy, depth, random.Random(depth)) for depth in (0.0, 1.0)]
    for needle in built:
        assert len(needle.ids) == min(proxy, target) and needle.positions[-1].item() == target - 1
        text = tok.decode(needle.ids.tolist())
        assert "Keep in mind that the ticket number of" in text     # the fact inside the pieces
        assert (needle.targets != -100).sum().item() == len(re.search(r" \d+\.$", text).group())
    if proxy < target:   # two pieces at their true positions: the fact far from the question
        far = built[0]
        assert far.positions[0].item() == 0 and far.positions[proxy // 2].item() == target - proxy // 2
    want = np.mean([reference_answer_nll(model, tok, n.ids, n.positions) for n in built])
    got = needle_objective(model, built, grad=False).item()
    assert got == pytest.approx(want, rel=1e-5)
    # the plain next-token loss over the same tokens is another number: only answers count
    with torch.no_grad():
        logits = model(input_ids=built[0].ids[None], position_ids=built[0].positions[None]).logits[0]
    assert F.cross_entropy(logits[:-1], built[0].ids[1:]).item() != pytest.approx(got, rel=1e-3)


def test_the_wording_is_its_own():
    mine = (WORDING.fact + WORDING.question).lower()
    others = [f.fact + f.question for f in FORMATS.values()] + [tasks.NEEDLE, tasks.RULER_NEEDLE]
    for phrase in ("pass key", "magic number", "code for", "remember", "goes together"):
        assert phrase not in mine
    assert all(WORDING.fact != o and WORDING.question not in o for o in others)
    assert "ticket number" not in " ".join(others).lower()


def test_a_needle_set_is_a_pure_function_of_its_inputs():
    tok, docs = char_tokenizer(), [text_doc(257, 0), text_doc(257, 1)]
    a, b = needles(docs, tok, 256, None), needles(docs, tok, 256, None)
    assert len(a) == 6 and all(torch.equal(x.ids, y.ids) for x, y in zip(a, b))
    assert len({tok.decode(x.ids.tolist()) for x in a}) == 6


def test_cli_objective_reaches_the_log(tmp_path, capsys):
    folder = tmp_path / "tiny"
    tiny_model().save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text(char_tokenizer().decode(text_doc(320).tolist()))
    out = tmp_path / "searched"
    assert cli.main(["search", "--model", str(folder), "--dataset", str(text), "--target-length", "256",
                     "--max-steps", "1", "--no-progress", "--no-final-check", "--objective", "needle",
                     "--out", str(out)]) == 0
    rows = [json.loads(line) for line in open(out / "search_log.jsonl")]
    assert rows[0]["settings"]["objective"] == "needle"
    assert "answer-token loss" in capsys.readouterr().out
    # the same folder with the other objective is another search: refused, not mixed
    with pytest.raises(SystemExit) as stop:
        cli.main(["search", "--model", str(folder), "--dataset", str(text), "--target-length", "256",
                  "--max-steps", "1", "--no-progress", "--no-final-check", "--out", str(out)])
    assert stop.value.code != 0 and "is the log of another search" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--objective", "retrieval"], "invalid choice: 'retrieval'"),
    (["--objective", "needle", "--proxy-length", "64"], "too short for the needle objective"),
])
def test_cli_objective_checked_before_the_model_loads(argv, message, tmp_path, capsys, monkeypatch):
    text = tmp_path / "text.txt"
    text.write_text(char_tokenizer().decode(text_doc(1100).tolist()))
    monkeypatch.setattr(search_cmd, "load_model_from", lambda args: pytest.fail("the model was loaded"))
    monkeypatch.setattr(search_cmd, "load_tokenizer_from", lambda args: char_tokenizer())
    with pytest.raises(SystemExit) as stop:
        cli.main(["search", "--dataset", str(text), "--target-length", "1024", *argv, "--out", str(tmp_path / "o")])
    assert stop.value.code == 2 and message in capsys.readouterr().err

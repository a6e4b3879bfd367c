"""Shorter synthetic examples beside full document windows (`data.synthetic.window`,
hf_posext/training/synthetic.py): an example keeps the front of its window, laid out as a
full-window example would be at that length; document windows keep every token; the collator
spans both lengths over the same target; the loop counts the tokens it really trained on; bad
values are refused before the model loads."""

from __future__ import annotations

import csv
import math

import pytest

from _recipekit import format_pattern, load_finetune, make_assets, recipe_argv
from hf_posext.training.pose import PoseCollator, span_of
from hf_posext.training.recipe_config import SyntheticConfig
from hf_posext.training.synthetic import FORMATS, mix_synthetic
from test_recipe_mix import TARGET, WINDOW, packed, tok, wide_tokenizer  # noqa: F401  (fixtures)

finetune = load_finetune()
pytestmark = pytest.mark.usefixtures("one_thread")
SHORT = 128            # the longest format with its longest key needs 119 of a character tokenizer's


@pytest.fixture(scope="module")
def mixed(packed, tok, tmp_path_factory):  # noqa: F811
    return mix_synthetic(packed, tok, SyntheticConfig(share=0.5, window=SHORT), seed=0, num_chunks=2,
                         cache_dir=tmp_path_factory.mktemp("short"))


def test_examples_are_cut_from_the_front_of_their_window_and_documents_stay_whole(mixed, packed, tok):  # noqa: F811
    lengths = {}
    for i in range(len(mixed)):
        r, orig = mixed[i], packed[i]["input_ids"].tolist()
        ids = r["input_ids"].tolist()
        lengths.setdefault(bool(r["format"]), set()).add(len(ids))
        if not r["format"]:
            assert ids == orig
            continue
        a, b, q, ans = (int(r[k]) for k in ("fact_start", "fact_end", "question_start", "answer_start"))
        assert 0 <= a <= SHORT // 16 < b < q < ans < SHORT          # "early" is the example's W/16
        assert ids[:a] == orig[:a]                                   # the window's own text first
        fmt = FORMATS[r["format"]]
        m = format_pattern(fmt.fact).fullmatch(tok.decode(ids[a:b]).strip())
        assert m and tok.decode(ids[ans:]) == fmt.answer.format(value=m["value"])
        # the text between fact and question continues the window's front, nothing past SHORT
        assert tok.decode(ids[b:q]).strip() in tok.decode(orig[:SHORT])
    assert lengths == {True: {SHORT}, False: {WINDOW}}


def test_the_collator_spans_a_short_example_over_the_whole_target(mixed):
    collate = PoseCollator(WINDOW, TARGET, 2, min_span=0.9)
    seen = set()
    for i in range(len(mixed)):
        r = mixed[i]
        batch = collate([r["input_ids"]], [i], [span_of(r)])
        pos = batch["position_ids"][0]
        n = len(r["input_ids"])
        seen.add(n)
        assert pos.shape == (n,) and batch["labels"].shape == (1, n)
        assert int(pos[0]) == 0 and bool((pos[1:] > pos[:-1]).all()) and int(pos[-1]) <= TARGET - 1
        if r["format"]:   # the fact before the jump, the question at >= 0.9 x target
            jump = int(((pos[1:] - pos[:-1]) > 1).nonzero()[0]) + 1
            assert int(r["fact_end"]) <= jump <= int(r["question_start"])
            assert int(pos[-1]) >= math.ceil(0.9 * TARGET) - 1
    assert seen == {SHORT, WINDOW}


def test_the_collator_refuses_mixed_lengths_and_short_document_windows(mixed):
    collate = PoseCollator(WINDOW, TARGET, 2)
    rows = [mixed[i] for i in range(len(mixed))]
    short = next(r for r in rows if r["format"])
    whole = next(r for r in rows if not r["format"])
    with pytest.raises(ValueError, match="all of a batch alike"):
        collate([short["input_ids"], whole["input_ids"]], [0, 1], [span_of(short), None])
    with pytest.raises(ValueError, match=f"must hold window={WINDOW} tokens"):
        collate([whole["input_ids"][:SHORT]], [0], [None])


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("short_assets"), archs=("llama",))


def test_recipe_trains_on_both_lengths_and_counts_their_tokens(assets, tmp_path, monkeypatch, capsys):
    lengths = []
    call = PoseCollator.__call__

    def spy(self, examples, indices, spans=None):
        batch = call(self, examples, indices, spans)
        lengths.append((spans[0] is not None, batch["input_ids"].shape[1]))
        return batch

    monkeypatch.setattr(PoseCollator, "__call__", spy)
    out = tmp_path / "run"
    finetune.main(recipe_argv(assets, out, data__synthetic__share="0.5", data__synthetic__window="128",
                              training__seq_len="256", training__max_steps="6", eval__enabled="false"))
    assert set(lengths) == {(True, 128), (False, 256)}
    # the count it announces is the count the collator was handed
    synthetic = sum(is_example for is_example, _ in lengths)
    assert f"the 6 steps read 6 windows, {synthetic} of them synthetic examples" in capsys.readouterr().out
    rows = list(csv.DictReader((out / "train_log.csv").open()))
    assert [int(float(r["tokens"])) for r in rows] == [sum(n for _, n in lengths[:k + 1]) for k in range(6)]


@pytest.mark.parametrize("over,match", [
    ({"data__synthetic__window": "300"}, r"data.synthetic.window must be a whole number of tokens in \[2, "
                                         r"training.seq_len=256\] or null"),
    ({"data__synthetic__window": "1"}, r"data.synthetic.window must be"),
    ({"data__synthetic__window": "128", "data__synthetic__share": "0"}, r"data.synthetic.share is 0, so no example"),
    ({"data__synthetic__window": "128", "training__batch_size": "2"},
     r"set training.batch_size 1 and raise training.gradient_accumulation_steps"),
    ({"data__synthetic__window": "24"}, r"more than the 24-token window; raise training.seq_len "
                                        r"\(and data.synthetic.window if set\)"),
])
def test_bad_windows_fail_in_one_line_before_the_model_loads(assets, tmp_path, recipe_model_forbidden, over, match):
    out = tmp_path / "bad"
    with pytest.raises(ValueError, match=match) as err:
        finetune.main(recipe_argv(assets, out, **{"data__synthetic__share": "0.5", "training__seq_len": "256", **over}))
    assert "\n" not in str(err.value)
    assert not (out / "train_log.csv").exists()


@pytest.mark.parametrize("examples", [0, 5, 37, 40, 111])
def test_the_synthetic_count_follows_the_loops_order_across_epochs(examples):
    """The count the recipe logs, against the loop's own ExampleOrder read one example at a time."""
    import datasets
    from hf_posext.training.loop import ExampleOrder, synthetic_read
    ds = datasets.Dataset.from_dict({"answer_start": [5 if i % 3 == 0 else -1 for i in range(37)]})
    order = ExampleOrder(37, 4)
    assert synthetic_read(ds, 4, examples) == sum(ds[order(i)]["answer_start"] >= 0 for i in range(examples))

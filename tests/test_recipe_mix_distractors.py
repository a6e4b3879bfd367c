"""Distractor facts in the recipe's synthetic examples (`data.synthetic.distractors`,
hf_posext/training/synthetic.py): other facts of the asked one's form in the same window, read
back from the example's text with the formats' own sentences (not through the module's offsets);
the asked fact is not always the first, the PoSE cut falls after it, and bad counts are refused
before the model loads."""

from __future__ import annotations

import math
import re

import pytest

from _recipekit import format_pattern, load_finetune, make_assets, recipe_argv
from hf_posext.training.pose import PoseCollator, span_of
from hf_posext.training.recipe_config import SyntheticConfig, parse_args
from hf_posext.training.synthetic import FORMATS, mix_synthetic
from test_recipe_mix import TARGET, WINDOW, packed, tok, wide_tokenizer  # noqa: F401  (fixtures)

finetune = load_finetune()
pytestmark = pytest.mark.usefixtures("one_thread")
D = 2                  # a 256-character window holds three facts of the longest format


@pytest.fixture(scope="module")
def mixed(packed, tok, tmp_path_factory):  # noqa: F811
    return mix_synthetic(packed, tok, SyntheticConfig(share=1.0, distractors=D), seed=0, num_chunks=2,
                         cache_dir=tmp_path_factory.mktemp("distractors"))


def _facts(tok, ids, fmt):  # noqa: F811
    """(key, value, char offset) of every fact line of `fmt` in the example's text before the question."""
    text = tok.decode(ids)
    body = text[:text.rindex("\n")]                       # the question is the last line
    return [(m["key"], m["value"], m.start()) for m in re.finditer(r"(?<=\n)" + format_pattern(fmt.fact).pattern + r"(?=\n)", body)]


def test_each_example_holds_the_asked_fact_among_distractors_of_its_form(mixed, tok):  # noqa: F811
    ranks = set()
    for i in range(len(mixed)):
        r = mixed[i]
        fmt, ids = FORMATS[r["format"]], r["input_ids"].tolist()
        assert len(ids) == WINDOW
        facts = _facts(tok, ids, fmt)
        assert len(facts) == D + 1, tok.decode(ids)
        words = [w.lower() for k, v, _ in facts for w in (k, v)]
        assert len(set(words)) == len(words)              # no key or value written twice
        q, ans = int(r["question_start"]), int(r["answer_start"])
        asked = format_pattern(fmt.question).fullmatch(tok.decode(ids[q:ans]).strip())["key"]
        (key, value, _), = [f for f in facts if f[0] == asked]
        assert tok.decode(ids[ans:]) == fmt.answer.format(value=value)
        # the span columns point at that fact's line
        a, b = int(r["fact_start"]), int(r["fact_end"])
        assert tok.decode(ids[a:b]).strip() == fmt.fact.format(key=key, value=value)
        ranks.add([f[0] for f in sorted(facts, key=lambda f: f[2])].index(key))
    assert len(ranks) > 1                                 # not always the first fact written


def test_the_cut_follows_the_asked_fact_and_the_question_sits_near_the_target(mixed):
    collate = PoseCollator(WINDOW, TARGET, 2, min_span=0.9)
    for i in range(len(mixed)):
        span = span_of(mixed[i])
        pos = collate([mixed[i]["input_ids"]], [i], [span])["position_ids"][0]
        assert pos[:span.fact_end].tolist() == list(range(span.fact_end))           # first chunk from 0
        assert int(pos[span.question_start]) - int(pos[span.fact_end - 1]) >= math.ceil(0.9 * TARGET) - WINDOW


def test_zero_distractors_writes_one_fact_per_example(packed, tok, tmp_path):  # noqa: F811
    plain = mix_synthetic(packed, tok, SyntheticConfig(share=1.0), seed=0, num_chunks=2, cache_dir=tmp_path)
    for i in range(len(plain)):
        r = plain[i]
        assert len(_facts(tok, r["input_ids"].tolist(), FORMATS[r["format"]])) == 1
        assert int(r["fact_start"]) <= WINDOW // 16


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


@pytest.mark.parametrize("count, match", [
    ("-1", r"data.synthetic.distractors must be a whole number in \[0, 16\] .*got -1"),
    ("1.5", r'"data.synthetic.distractors": Expected a <class .int.>\. Got value: 1.5'),   # the parser's own check
    ("17", r"data.synthetic.distractors must be a whole number in \[0, 16\] .*got 17"),
    ("16", r"needs up to \d+ tokens \(fact and 16 distractors .*lower data.synthetic.distractors"),
])
def test_bad_distractor_counts_fail_in_one_line_before_the_model_loads(assets, tmp_path, recipe_model_forbidden, count, match):
    with pytest.raises(ValueError, match=match) as err:
        finetune.main(recipe_argv(assets, tmp_path / "bad", data__synthetic__share="0.5",
                                  data__synthetic__distractors=count, training__seq_len="128"))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "bad" / "train_log.csv").exists()


def test_the_flag_reaches_the_config():
    cfg, _ = parse_args(["--data.synthetic.share", "0.25", "--data.synthetic.distractors", "3"])
    assert cfg.data.synthetic.distractors == 3
    assert parse_args([])[0].data.synthetic.distractors == 0

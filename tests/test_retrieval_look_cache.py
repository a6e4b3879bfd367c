"""Sequential looks laid out as their whole series and served from prefix caches kept across
looks (prompt.py `layout_seeds`, decode.SharedPrefix, schedule.evaluate_sequential): every look's
trials are the fixed design's at max_trials, token for token, and a later look prefills nothing."""

from __future__ import annotations


import pytest

from _evalkit import TINY, char_tokenizer
from hf_posext.evaluation.retrieval import RetrievalGrid, build_cell, evaluate_retrieval, get_task, noise_haystack
from hf_posext.evaluation.retrieval.schedule import evaluate_sequential
from hf_posext.evaluation.retrieval.sequential import SequentialRule
from hf_posext.evaluation.shared.store import ResultsStore
from hf_posext.evaluation.shared.record import read_rows

L = 1024


@pytest.fixture(scope="module")
def model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, "max_position_embeddings": L})).eval()


def test_a_blocks_prompts_are_the_whole_series_prompts():
    """multi_key's trials differ in length (seeds 0, 1 need 382 tokens beside the haystack, 0..3
    need 384), so a block laid out alone has another haystack; laid out as the series it has the
    series' prefix, suffixes and rope hold."""
    tok, hay, task = char_tokenizer(), noise_haystack(char_tokenizer()), get_task("multi_key")
    whole = build_cell(tok, task, hay, 694, 0.5, [0, 1, 2, 3])
    alone = build_cell(tok, task, hay, 694, 0.5, [2, 3])
    block = build_cell(tok, task, hay, 694, 0.5, [2, 3], layout_seeds=[0, 1, 2, 3])
    first = build_cell(tok, task, hay, 694, 0.5, [0, 1])
    assert first.prefix != whole.prefix or first.suffixes != whole.suffixes[:2]   # the case that matters
    assert block.prefix == whole.prefix and block.suffixes == whole.suffixes[2:]
    assert block.hold_length == whole.hold_length and block.max_new_tokens == whole.max_new_tokens[2:]
    assert block.needle_spans == whole.needle_spans[2:] and alone.trials == block.trials
    with pytest.raises(ValueError, match=r"seeds \[5\] are not among the layout's seeds"):
        build_cell(tok, task, hay, 694, 0.5, [3, 5], layout_seeds=[0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"layout_seeds must include every trial seed; missing \[4\]"):
        RetrievalGrid(["yarn"], [694], seeds=[3, 4], layout_seeds=[0, 1, 2, 3])


def sequential(model, folder, cache_bytes=0):
    grid = RetrievalGrid(["yarn"], [694], depths=[0.25, 1.0], tasks=["multi_key"], factors=[2.0])
    # bar 0.05: a random model's 0/n never decides in 2 looks, so both questions (none, yarn) run
    # both looks, in turn
    rule = SequentialRule(look=2, max_trials=4, confidence=0.9)
    with ResultsStore(folder, "retrieval") as store:
        state = evaluate_sequential(model, char_tokenizer(), grid, rule, store=store, bar=0.05,
                                    prefix_cache_bytes=cache_bytes, log=lambda s: None)
    assert all(len(q.looks) == 2 for q in state.questions)
    return state, read_rows(folder / "retrieval.json")


def test_looks_are_the_fixed_designs_trials_and_later_looks_prefill_nothing(model, tmp_path, monkeypatch):
    from hf_posext.evaluation.retrieval import decode
    counted, real = [], decode.prefill
    monkeypatch.setattr(decode, "prefill", lambda m, p, cache=None: counted.append(
        len(p) - (cache.get_seq_length() if cache is not None else 0)) or real(m, p, cache))
    _, looks = sequential(model, tmp_path / "kept", 1 << 30)
    kept = list(counted)
    counted.clear()
    _, again = sequential(model, tmp_path / "one", 0)
    # with one prefix kept, the questions' looks alternate, so each later look prefills anew
    tok, hay = char_tokenizer(), noise_haystack(char_tokenizer())
    deepest = len(build_cell(tok, get_task("multi_key"), hay, 694, 1.0, [0, 1, 2, 3]).prefix)
    assert sum(kept) == 2 * deepest                           # each method: its deepest prefix once
    assert sum(counted) == 2 * sum(kept)                      # and again at the second look
    assert {r["layout_seeds"] for r in looks} == {"0,1,2,3"}
    assert [r["outputs"] for r in looks] == [r["outputs"] for r in again]
    fixed = evaluate_retrieval(model, tok, RetrievalGrid(["yarn"], [694], depths=[0.25, 1.0],
                                                         tasks=["multi_key"], factors=[2.0], trials=4),
                               progress=False)
    assert len(fixed) == 4 and len(looks) == 8 and all(r["seeds_list"] == "0,1,2,3" for r in fixed)
    for row in fixed:   # the two looks' outputs, in order, are the fixed cell's
        mine = sorted((r for r in looks if all(r[k] == row[k] for k in ("method", "length", "depth"))),
                      key=lambda r: r["look"])
        assert [r["seeds_list"] for r in mine] == ["0,1", "2,3"]
        assert [o for r in mine for o in r["outputs"]] == row["outputs"]
        assert {r["prompt_tokens"] for r in mine} <= {row["prompt_tokens"], row["prompt_tokens"] - 1,
                                                      row["prompt_tokens"] - 2}
        assert {r["prefix_tokens"] for r in mine} == {row["prefix_tokens"]}


def test_resuming_looks_laid_out_for_another_series_is_refused(model, tmp_path):
    """Stored looks laid out for max_trials 4 are not another run's looks at max_trials 8 (their
    prompts differ): refused with the fix, not recomputed beside them; the same max_trials resumes."""
    from hf_posext.evaluation.shared.store import ResultsError
    sequential(model, tmp_path)
    grid = RetrievalGrid(["yarn"], [694], depths=[0.25, 1.0], tasks=["multi_key"], factors=[2.0])
    with ResultsStore(tmp_path, "retrieval", resume=True) as store:
        with pytest.raises(ResultsError, match=r"seeds 0,1 are stored laid out for seeds 0,1,2,3; this run lays "
                                               r"them out for seeds 0,1,2,3,4,5,6,7 .* Resume with the stored run's --trials"):
            evaluate_sequential(model, char_tokenizer(), grid, SequentialRule(look=2, max_trials=8, confidence=0.9),
                                store=store, bar=0.05, log=lambda s: None)
        state = evaluate_sequential(model, char_tokenizer(), grid, SequentialRule(look=2, max_trials=4, confidence=0.9),
                                    store=store, bar=0.05, log=lambda s: None,
                                    answer_fn=lambda *a, **k: pytest.fail("a stored look was recomputed"))
    assert all(len(q.looks) == 2 for q in state.questions)

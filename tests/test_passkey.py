"""Passkey retrieval: prompt construction, scoring on stubs that do and do not copy the key,
patching through the grid, determinism and the heat map."""

import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_posext
from _evalkit import TINY, char_tokenizer
from hf_posext.evaluation.passkey import (build_prompt, evaluate_passkey, first_number,
                                          passkey_for_seed)
from hf_posext.evaluation.shared.results import plot_passkey_heatmap
from hf_posext.evaluation.retrieval.settings import RetrievalGrid
from hf_posext.evaluation.retrieval.tasks import NOISE
from hf_posext.evaluation.shared.store import ResultsStore


class KeyModel(LlamaForCausalLM):
    """A tiny Llama whose `generate` reads the prompt and answers: the key (a copier) or a
    fixed wrong number. It records the rope state it was called with."""

    copy_key = True

    def generate(self, input_ids, max_new_tokens, **kw):
        assert kw.get("do_sample") is False
        self.seen.append((hf_posext.is_patched(self), self.config.max_position_embeddings))
        text = self.tok.decode(input_ids[0])
        key = re.search(r"The pass key is (\d{5})", text).group(1) if self.copy_key else "11111"
        new = self.tok(" " + key + ".", add_special_tokens=False, return_tensors="pt")["input_ids"]
        return torch.cat([input_ids, new[:, :max_new_tokens]], dim=1)


def _stub(copy_key: bool):
    torch.manual_seed(0)
    model = KeyModel(LlamaConfig(**TINY)).eval()
    model.tok, model.seen, model.copy_key = char_tokenizer(), [], copy_key
    return model


def test_prompt_length_depth_and_key():
    tok = char_tokenizer()
    for depth in (0.0, 0.5, 1.0):
        p = build_prompt(tok, 2000, depth, 12345)
        assert 2000 - len(NOISE) < len(p.input_ids) <= 2000
        text = tok.decode(p.input_ids)
        assert text.count("12345") == 2 and text.endswith("The pass key is")
        frac = p.needle_start / len(p.input_ids)
        assert abs(frac - depth) < 0.12
    with pytest.raises(ValueError, match="too short"):
        build_prompt(tok, 100, 0.5, 12345)


def test_keys_are_seeded_five_digit_numbers():
    keys = [passkey_for_seed(s) for s in range(20)]
    assert keys == [passkey_for_seed(s) for s in range(20)]
    assert all(10000 <= k <= 99999 for k in keys) and len(set(keys)) > 15
    assert first_number(" 12345. Remember") == 12345 and first_number("no") is None
    assert first_number("123456") == 123456   # a longer number is not the key


@pytest.mark.slow
@pytest.mark.parametrize("copy_key,expected", [(True, 1.0), (False, 0.0)])
def test_stub_accuracy(copy_key, expected):
    model = _stub(copy_key)
    rows = evaluate_passkey(model, model.tok,
                            RetrievalGrid(methods=["yarn"], lengths=[400, 800],
                                          depths=[0.0, 0.5, 1.0], seeds=[0, 1, 2]),
                            progress=False)
    assert len(rows) == 2 * 2 * 3   # (none, yarn) × lengths × depths
    assert all(r["accuracy"] == expected and r["seeds"] == 3 for r in rows)
    assert all(r["correct"] == 3 * expected for r in rows)
    # yarn rows ran patched with s = length / 64, none rows unpatched; the model is restored.
    yarn800 = next(r for r in rows if r["method"] == "yarn" and r["length"] == 800)
    assert yarn800["factor"] == 800 / 64
    assert (True, 800) in model.seen and (False, 64) in model.seen
    assert not hf_posext.is_patched(model)


@pytest.mark.slow
def test_real_tiny_model_runs_and_is_deterministic(tmp_path):
    """The default greedy path on a real (random) tiny Llama: same answers on a rerun."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    tok = char_tokenizer()
    grid = RetrievalGrid(["dynamic_ntk"], [400], depths=[0.5], seeds=[0, 1])
    a = evaluate_passkey(model, tok, grid, progress=False)
    b = evaluate_passkey(model, tok, grid, progress=False)
    assert [r["answers"] for r in a] == [r["answers"] for r in b]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in a)


def test_results_resume_and_heatmap(tmp_path):
    model = _stub(True)
    grid = RetrievalGrid([], [400, 800], depths=[0.0, 1.0], seeds=[0])
    with ResultsStore(tmp_path, "passkey") as store:
        rows = evaluate_passkey(model, model.tok, grid, store=store, progress=False)
    calls = len(model.seen)
    with ResultsStore(tmp_path, "passkey", resume=True) as store:
        again = evaluate_passkey(model, model.tok, grid, store=store, progress=False)
    assert len(model.seen) == calls and again == rows
    path = plot_passkey_heatmap(rows, tmp_path / "h.png", "none")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_a_later_run_with_more_lengths_and_depths_resumes_the_cells_already_there(tmp_path):
    model = _stub(True)
    with ResultsStore(tmp_path, "passkey") as store:
        first = evaluate_passkey(model, model.tok, RetrievalGrid([], [400], depths=[0.5], seeds=[0]),
                                 store=store, progress=False)
    assert len(model.seen) == 1
    with ResultsStore(tmp_path, "passkey", resume=True) as store:
        rows = evaluate_passkey(model, model.tok,
                                RetrievalGrid([], [400, 800], depths=[0.0, 0.5], seeds=[0]),
                                store=store, progress=False)
    assert len(model.seen) == 1 + 3            # only the three new cells decoded
    assert len(rows) == 4 and first[0] in rows


def test_a_passkey_run_with_more_seeds_is_a_new_cell_not_a_refused_block(tmp_path):
    """The passkey's tables show each seed list as its own series, so `--trials 2` after `--trials
    1` (overlapping) runs as a new cell; the retrieval suite would refuse it (blocks.py)."""
    model = _stub(True)
    for seeds in ([0], [0, 1]):
        with ResultsStore(tmp_path, "passkey", resume=True) as store:
            rows = evaluate_passkey(model, model.tok, RetrievalGrid([], [400], depths=[0.5], seeds=seeds),
                                    store=store, progress=False)
    assert [r["seeds_list"] for r in rows] == ["0,1"] and len(model.seen) == 1 + 2


def test_the_data_hash_follows_the_prompt_pieces():
    tok = char_tokenizer()
    model = _stub(True)
    a = evaluate_passkey(model, tok,
                         RetrievalGrid(methods=[], lengths=[400], depths=[0.5], seeds=[0]),
                         progress=False)
    with pytest.MonkeyPatch.context() as mp:   # another filler: other prompts, another data hash
        mp.setattr("hf_posext.evaluation.retrieval.tasks.NOISE", "Grass is green. " * 4 + "\n")
        b = evaluate_passkey(model, tok,
                             RetrievalGrid(methods=[], lengths=[400], depths=[0.5], seeds=[0]),
                             progress=False)
    assert a[0]["data_hash"] != b[0]["data_hash"]


def test_cells_with_identical_rope_reuse_answers():
    """Below the trained length every method at s = 1 encodes positions exactly as the
    unpatched model, so its answers are copied; with reuse off they are recomputed, equal."""
    torch.manual_seed(0)
    model = KeyModel(LlamaConfig(**{**TINY, "max_position_embeddings": 1024})).eval()
    model.tok, model.seen, model.copy_key = char_tokenizer(), [], True
    grid = RetrievalGrid(["linear", "yarn"], [400], depths=[0.5], seeds=[0, 1])
    rows = evaluate_passkey(model, model.tok, grid, progress=False)
    assert len(model.seen) == 2                      # only `none` decoded
    assert [r["same_as"] for r in rows] == ["", "none s=1", "none s=1"]
    fresh = evaluate_passkey(model, model.tok, grid, reuse_identical=False, progress=False)
    assert len(model.seen) == 2 + 6
    assert [r["answers"] for r in rows] == [r["answers"] for r in fresh]


def test_repeated_seeds_are_refused():
    model = _stub(True)
    with pytest.raises(ValueError, match="repeat a seed"):
        evaluate_passkey(model, model.tok,
                         RetrievalGrid(methods=[], lengths=[400], depths=[0.5], seeds=[1, 1]),
                         progress=False)


def test_a_long_caption_stays_inside_a_one_method_heat_map(tmp_path, monkeypatch):
    """A one-method map of two lengths is narrow: its title (the task, the series and the run's
    caption) is wrapped, and every line of it is drawn inside the figure."""
    from matplotlib.figure import Figure
    inside, real = [], Figure.savefig

    def spy(fig, *a, **k):
        fig.canvas.draw()
        box, title = fig.bbox, fig.axes[0].title.get_window_extent(fig.canvas.get_renderer())
        inside.append((title.x0 >= box.x0, title.x1 <= box.x1, title.y1 <= box.y1))
        return real(fig, *a, **k)
    monkeypatch.setattr(Figure, "savefig", spy)
    rows = [{"length": n, "depth": d, "accuracy": 0.5, "correct": 2, "trials": 4, "trained_length": 8192}
            for n in (8192, 16384) for d in (0.0, 0.5, 1.0)]
    caption = ("single_needle: yarn (s=2.0) — embedded:smollm2-135m (bfloat16), noise haystack, "
               "4–20 trial(s) per cell")
    plot_passkey_heatmap(rows, tmp_path / "h.png", caption)
    assert inside == [(True, True, True)]

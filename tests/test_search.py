"""`hf-posext search` / `hf_posext.search` on a tiny random Llama (hf_posext/search/).

The objective improves over the best seed (the rope-only methods in their longrope form); the
saved checkpoint is transformers' own `longrope`, reloaded in a fresh process without hf_posext
under both transformers versions with the logits the search measured; a second run resumes
from the log; bad options fail before any model loads.
"""

import json
import shutil
import sys

import numpy as np
import pytest
import torch
from conftest import TRAINED, VOCAB, tiny_model
from test_cross_version import other_python
from test_longrope import load_plain

import hf_posext
from hf_posext import cli
from hf_posext.commands import search as search_cmd
from hf_posext.portability import config_audit
from hf_posext.search import SEED_METHODS, SearchResult, save_best, search_factors
from hf_posext.search.objective import proxy_chunks
from hf_posext.search.space import Factors, Installed
from hf_posext.rope.longrope import factors_of, rope_powers
from hf_posext.rope.registry import compute

pytestmark = pytest.mark.usefixtures("one_thread")

TARGET = 4 * TRAINED


@pytest.fixture(scope="module")
def doc():
    # a repetitive sequence with long-range structure, so positions past L matter to the loss
    g = np.random.default_rng(0)
    motif = g.integers(0, VOCAB, 48)
    return np.concatenate([motif + (k % 3) for k in range(12)]) % VOCAB   # [576] > TARGET + 1


def test_the_public_search_is_the_gradient_search():
    """`hf_posext.search_factors` (README) is the keyword function; `hf_posext.search` is the
    package of that name, not shadowed by it, and read by `from hf_posext.search import`."""
    import inspect
    import types

    from hf_posext.search import Gradient, gradient

    assert hf_posext.search_factors is gradient.search_factors
    assert isinstance(hf_posext.search, types.ModuleType)
    knobs = inspect.signature(hf_posext.search_factors).parameters   # its defaults are the strategy's
    assert (Gradient().lr, Gradient().max_steps) == (knobs["lr"].default, knobs["max_steps"].default)


def test_proxy_spans_cover_the_target_at_true_positions():
    spans = proxy_chunks(16384, 4096)
    assert spans[0] == (0, 1024) and spans[-1] == (15360, 16384) and len(spans) == 4
    assert proxy_chunks(256, 256) == [(0, 256)]


@pytest.mark.slow
def test_search_improves_over_its_seed_and_saves_a_plain_longrope(doc, tmp_path):
    model = tiny_model()
    result = search_factors(model, [doc], TARGET, tmp_path / "log.jsonl", max_steps=6, lr=0.2,
                    proxy_length=TARGET // 2, progress=False)
    rows = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    seeds = {r["method"]: r["nll"] for r in rows if r["kind"] == "seed"}
    assert set(seeds) == set(SEED_METHODS)
    assert result.proxy_nll < min(seeds.values()) - 1e-4, (result, seeds)
    assert result.source.startswith("step")
    # the searched config lies in LongRoPE's space: f_i >= 1, non-decreasing to low frequencies
    assert all(f >= 1.0 for f in result.factors) and result.factors == sorted(result.factors)
    # what the search measured over the whole target length, through its own rotary module
    params = Factors(result.factors, result.attention_factor)
    ids = torch.as_tensor(doc[:TARGET], dtype=torch.long)[None]
    with Installed(model, params, rope_powers(16, 10_000.0)), torch.no_grad():
        searched = model(ids).logits
    rope = save_best(model, None, result, tmp_path / "ckpt", TARGET)
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == rope["long_factor"]
    assert rope["attention_factor"] == pytest.approx(result.attention_factor)
    assert not hf_posext.is_patched(model)  # saving leaves the model as it was
    torch.save({"ids": ids, "logits": searched}, tmp_path / "ckpt" / "expected.pt")
    report = load_plain(sys.executable, [tmp_path / "ckpt"], tmp_path)
    assert report.pop("hf_posext_imported") is False
    assert max(report.values()) <= 1e-5, report
    other = other_python()
    if other is None:
        pytest.skip("the other transformers version's python is missing (HF_POSEXT_OTHER_PYTHON)")
    report = load_plain(other, [tmp_path / "ckpt"], tmp_path)
    assert report.pop("hf_posext_imported") is False
    assert max(report.values()) <= 1e-5, report


@pytest.mark.slow
def test_identity_short_factors_run_plain_rope_within_L_and_the_searched_set_beyond(doc, tmp_path):
    """`save_best(..., short_factors="identity")` (LongRoPE §3.3's separate short set): reloaded
    by plain transformers of both versions, a sequence <= L runs plain RoPE with cos/sin x the
    attention factor and a longer one the searched factors, each compared with the search's own
    rotary module (not transformers' longrope code). 4.57 switches at the top-level
    original_max_position_embeddings the patcher writes; without it, at max_position_embeddings
    (the target here), and the long check fails."""
    model = tiny_model()
    factors, a = [1.0 + 0.4 * i for i in range(8)], 1.07    # head_dim 16: 8 frequencies
    result = SearchResult(factors, a, 0.0, 0.0, 0.0, "step 1", 1)
    rope = save_best(model, None, result, tmp_path / "ckpt", TARGET, short_factors="identity")
    assert rope["short_factor"] == [1.0] * 8 and rope["long_factor"] == factors
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["original_max_position_embeddings"] == TRAINED
    assert not config_audit.problems(saved)
    expected = {"short": ([1.0] * 8, TRAINED), "long": (factors, TARGET)}
    paths = []
    for name, (f, n) in expected.items():
        folder = tmp_path / name
        shutil.copytree(tmp_path / "ckpt", folder)
        ids = torch.as_tensor(doc[:n], dtype=torch.long)[None]
        with Installed(model, Factors(f, a), rope_powers(16, 10_000.0)), torch.no_grad():
            torch.save({"ids": ids, "logits": model(ids).logits}, folder / "expected.pt")
        paths.append(folder)
    for python in (sys.executable, other_python()):
        if python is None:
            pytest.skip("the other transformers version's python is missing (HF_POSEXT_OTHER_PYTHON)")
        report = load_plain(python, paths, tmp_path)
        assert report.pop("hf_posext_imported") is False
        assert len(report) == 2 and max(report.values()) <= 1e-5, (python, report)


def test_a_seed_saved_with_identity_short_factors_is_a_longrope(tmp_path):
    """The seed's own type (yarn) has one factor set: asked for identity short factors, the
    seed is written as longrope rather than the option being dropped."""
    model = tiny_model()
    inv, scale = compute(hf_posext.RopeExtensionConfig("yarn", 4.0, TRAINED), 16, 10_000.0)
    f = factors_of(inv, 16, 10_000.0)
    result = SearchResult(f, float(scale), 0.0, 0.0, 0.0, "yarn", 0)
    assert save_best(model, None, result, tmp_path / "a", TARGET)["rope_type"] == "yarn"
    rope = save_best(model, None, result, tmp_path / "b", TARGET, short_factors="identity")
    assert rope["rope_type"] == "longrope" and rope["short_factor"] == [1.0] * 8
    with pytest.raises(ValueError, match="short_factors must be one of"):
        save_best(model, None, result, tmp_path / "c", TARGET, short_factors="ones")


def test_search_resumes_from_its_log(doc, tmp_path):
    log = tmp_path / "log.jsonl"
    search_factors(tiny_model(), [doc], TARGET, log, max_steps=2, lr=0.2, proxy_length=TARGET // 2, progress=False)
    first = [json.loads(line) for line in open(log)]
    search_factors(tiny_model(), [doc], TARGET, log, max_steps=4, lr=0.2, proxy_length=TARGET // 2, progress=False)
    rows = [json.loads(line) for line in open(log)]
    assert rows[:len(first)] == first                      # nothing rewritten
    kinds = [r["kind"] for r in rows]
    assert kinds.count("settings") == 1 and kinds.count("baseline") == 1 and kinds.count("seed") == len(SEED_METHODS)
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # step 3 starts where step 2 left off
    assert steps[2]["factors"] == pytest.approx(steps[1]["next_factors"], rel=1e-6)
    with pytest.raises(ValueError, match="is the log of another search"):
        search_factors(tiny_model(), [doc], TARGET, log, max_steps=5, lr=0.1, proxy_length=TARGET // 2, progress=False)


def test_search_refuses_an_extended_model(doc, tmp_path):
    with pytest.raises(ValueError, match="search starts from a model with plain RoPE"):
        search_factors(hf_posext.patch(tiny_model(), "yarn", 2.0), [doc], TARGET, tmp_path / "log.jsonl")


@pytest.mark.parametrize("argv,message", [
    (["--target-length", "16k", "--proxy-length", "32k"], "--proxy-length 32768 is longer than --target-length"),
    (["--target-length", "16k", "--budget", "0m"], "--budget '0m': give a wall time"),
    (["--target-length", "sixteen"], "--target-length"),
    (["--target-length", "16k", "--lr", "-1"], "--lr must be a positive number"),
])
def test_cli_checks_options_before_loading_anything(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(search_cmd, "load_model_from", lambda args: pytest.fail("the model was loaded"))
    monkeypatch.setattr(search_cmd, "load_tokenizer_from", lambda args: pytest.fail("the tokenizer was loaded"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["search", *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_cli_search_tunes_on_every_dataset_named(tmp_path, capsys, monkeypatch):
    """--dataset repeated: --max-docs documents from each source reach the search, in order;
    the same source twice is refused before anything loads."""
    from _evalkit import char_tokenizer

    texts = []
    for k in (3, 7):
        texts.append(tmp_path / f"text{k}.txt")
        texts[-1].write_text("".join(chr(32 + (k * i) % 90) for i in range(TARGET + 50)))
    seen = {}

    def fake_search(model, docs, log, options, strategy):
        seen["docs"], seen["data"] = docs, options.data
        raise SystemExit(0)   # the documents are all this test is about

    monkeypatch.setattr(search_cmd, "load_tokenizer_from", lambda args: char_tokenizer())
    monkeypatch.setattr(search_cmd, "load_model_from", lambda args: tiny_model())
    monkeypatch.setattr(search_cmd, "run_search", fake_search)
    argv = ["search", "--dataset", str(texts[0]), "--dataset", str(texts[1]), "--target-length", str(TARGET),
            "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit):
        cli.main(argv)
    tok = char_tokenizer()
    expected = [tok(t.read_text())["input_ids"] for t in texts]
    assert [list(d) for d in seen["docs"]] == expected
    assert "2 document(s)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        cli.main(["search", "--dataset", str(texts[0]), "--dataset", str(texts[0]), "--target-length",
                  str(TARGET), "--out", str(tmp_path / "p")])
    assert stop.value.code == 2 and "names a source twice" in capsys.readouterr().err


def test_cli_search_runs_end_to_end_on_a_local_model_and_text(tmp_path, capsys):
    """`hf-posext search` with the real loaders (nothing stubbed): a saved tiny model with its
    tokenizer, a local text file; it finishes, saves the best config in the exact form it prints
    (a seed that wins is saved as its own rope type, e.g. yarn) and prints its result."""
    import re

    from _evalkit import char_tokenizer

    folder = tmp_path / "tiny"
    tiny_model().save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text("".join(chr(32 + (7 * i) % 90) for i in range(TARGET + 50)))
    out = tmp_path / "searched"
    assert cli.main(["search", "--model", str(folder), "--dataset", str(text), "--target-length", str(TARGET),
                     "--max-steps", "1", "--no-progress", "--no-final-check", "--out", str(out)]) == 0
    printed = re.search(r"saved as rope_type '(\w+)'", capsys.readouterr().out)
    config = json.loads((out / "config.json").read_text())
    # 5.x: rope_parameters; 4.x: rope_scaling, None for a plain theta change (saved as default)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    assert printed and rope.get("rope_type", rope.get("type", "default")) == printed.group(1)

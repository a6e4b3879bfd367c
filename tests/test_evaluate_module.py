"""The `evaluate` measurement module: `evaluate.load` finds it locally (offline, in a fresh
process) and its perplexities equal plain transformers' own loss; bad arguments fail before any
model loads."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from _evalkit import char_tokenizer, tiny_model
from hf_posext.errors import ConfigError
from hf_posext.evaluation.integrations import MODULE
from hf_posext.evaluation.integrations.texts import check_text_inputs, evaluate_texts

pytest.importorskip("evaluate")

LOAD_AND_COMPUTE = """
import json, sys
import evaluate
module = evaluate.load(sys.argv[1])
out = module.compute(data=json.loads(sys.argv[3]), model_id=sys.argv[2], lengths=[32, 128],
                     methods=["yarn"], factors=[2])
print(json.dumps(out))
"""


def _texts(n: int = 2, chars: int = 300) -> list[str]:
    rng = random.Random(0)
    return ["".join(rng.choice("abcdefgh ijklmnop\n") for _ in range(chars)) for _ in range(n)]


def _saved(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    tiny_model().save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder


def _reference_perplexity(folder: Path, texts: list[str], n: int) -> float:
    """exp(mean NLL) of the first n tokens of every text, from transformers' own loss."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = char_tokenizer()
    total, count = 0.0, 0
    for t in texts:
        ids = torch.tensor([tok(t)["input_ids"][:n]])
        with torch.no_grad():
            total += model(ids, labels=ids).loss.item() * (n - 1)
        count += n - 1
    return math.exp(total / count)


@pytest.mark.slow
def test_evaluate_load_finds_the_module_offline_and_matches_transformers(tmp_path):
    folder, texts = _saved(tmp_path), _texts()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_EVALUATE_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    run = subprocess.run([sys.executable, "-c", LOAD_AND_COMPUTE, MODULE, str(folder),
                          json.dumps(texts)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    rows = [dict(zip(out, values)) for values in zip(*out.values())]
    plain = {r["length"]: r for r in rows if r["method"] == "none" and r["protocol"] == "truncate"}
    for n in (32, 128):
        assert plain[n]["perplexity"] == pytest.approx(_reference_perplexity(folder, texts, n), rel=1e-5)
    yarn = [r for r in rows if r["method"] == "yarn"]
    assert {r["length"] for r in yarn} == {32, 128} and all(r["factor"] == 2.0 for r in yarn)
    # beyond the trained 64 tokens: the sliding baseline and the ratios to it
    assert [r["protocol"] for r in rows].count("baseline") == 1
    assert all(r["ratio_to_sliding"] is not None for r in rows if r["length"] == 128
               and r["protocol"] == "truncate")
    assert next(r for r in yarn if r["length"] == 32)["ratio_to_unpatched"] is not None


@pytest.mark.parametrize("kwargs, message", [
    (dict(texts="one string"), "non-empty list of strings"),
    (dict(lengths="4k"), "lengths must be a list of integers"),
    (dict(lengths=[1]), "lengths must be a list of integers >= 2"),
    (dict(methods=["nope"]), "Unknown RoPE extension method 'nope'"),
    (dict(methods="yarn"), "methods must be a list"),
    (dict(knobs={"yarn": {"window": 8}}), "not of 'yarn'"),
    (dict(knobs={"yarn": {"beta_fast": -1}}), "beta_fast"),
    (dict(dtype="int8"), "dtype must be"),
    (dict(max_docs=0), "max_docs must be a positive integer"),
    (dict(factors=[0.5]), "factors must be"),
    (dict(factors="auto"), "factors must be"),
])
def test_bad_arguments_are_one_error_before_anything_loads(kwargs, message):
    args = dict(texts=["abc"], lengths=[32], methods=["yarn"], factors=["auto"], knobs=None,
                dtype="float32", max_docs=None)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        check_text_inputs(**args)


def test_texts_too_short_fail_before_the_model_loads(tmp_path, monkeypatch):
    import hf_posext.evaluation.integrations.texts as texts_module

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(texts_module, "load_model", no_load)
    with pytest.raises(ConfigError, match="data: "):
        evaluate_texts(_texts(chars=50), str(_saved(tmp_path)), lengths=[128])


def test_the_module_in_process_hands_its_arguments_to_evaluate_texts(monkeypatch):
    """The fast tier's check of the module file itself (the offline `evaluate.load` above is slow):
    its features are one text column, and `compute`'s keywords reach `evaluate_texts` unchanged."""
    import importlib

    module = importlib.import_module("hf_posext.evaluation.integrations.long_context_perplexity")
    seen = {}
    monkeypatch.setattr(module, "evaluate_texts", lambda *a, **k: seen.update(args=a, kwargs=k) or {})
    measurement = module.LongContextPerplexity()
    assert list(measurement._info().features) == ["data"]
    measurement._compute(data=("a", "b"), model_id="m", lengths=[64], methods=["yarn"], factors=[2])
    assert seen["args"] == (["a", "b"], "m", [64])
    assert seen["kwargs"]["methods"] == ["yarn"] and seen["kwargs"]["factors"] == [2]

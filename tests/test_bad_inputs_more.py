"""Adversarial inputs, second round: each is a one-line error naming the problem
and the fix, before any weight loads, or simply works. Kept apart from test_bad_inputs.py (400
lines; the rule: tests/_badinputs.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from _badinputs import cli_refused, refused
from _recipekit import load_finetune, make_assets, recipe_argv
from conftest import TRAINED, tiny_model

import hf_posext
from hf_posext import cli
from hf_posext.errors import BeyondReach, ConfigError
from hf_posext.portability.atomic import atomic_write
from hf_posext.evaluation.shared.store import ResultsError, ResultsStore
from hf_posext.evaluation.shared.record import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("more"), archs=("llama",))


def _saved(tmp_path: Path, name: str, method: str, edit=None, **kw) -> Path:
    folder = tmp_path / name
    hf_posext.patch(tiny_model(), method, **kw).save_pretrained(folder)
    if edit:
        data = json.loads((folder / "config.json").read_text())
        edit(data)
        (folder / "config.json").write_text(json.dumps(data))
    return folder


# ------------------------------------------------------------------ numbers of any real type
@pytest.mark.parametrize("method,kw", [
    ("yarn", dict(target_length=np.int64(128))), ("yarn", dict(factor=np.float32(2.0))),
    ("yarn", dict(factor=np.float64(2.0), beta_fast=np.int32(16))), ("ntk", dict(factor=np.int64(2))),
    ("rerope", dict(factor=np.float32(2.0), window=np.int64(8))),
    ("leaky_rerope", dict(factor=np.int16(2), leak=np.float32(4.0))),
])
def test_numpy_scalars_patch_as_plain_numbers(method, kw):
    """The model patched with numpy scalars is the one patched with the same Python numbers,
    and its config.json is valid JSON holding plain numbers."""
    plain = {k: v.item() for k, v in kw.items()}
    got = hf_posext.patch(tiny_model(), method, **kw).config
    want = hf_posext.patch(tiny_model(), method, **plain).config
    assert json.loads(got.to_json_string()) == json.loads(want.to_json_string())


def test_numpy_longrope_factors_and_config_objects():
    half = 8   # head_dim 16 (hidden 64 / 4 heads) / 2
    m = hf_posext.patch(tiny_model(), "longrope", factor=np.float32(2), short_factor=np.ones(half),
                        long_factor=list(np.full(half, 2.0, dtype=np.float32)))
    assert json.loads(m.config.to_json_string())   # serialisable
    cfg = hf_posext.RopeExtensionConfig("yarn", np.float32(4), np.int64(64), beta_fast=np.int64(16))
    assert type(cfg.factor) is float and type(cfg.trained_length) is int
    with pytest.raises(TypeError, match="must be a number"):
        hf_posext.patch(tiny_model(), "yarn", factor=np.bool_(True))   # a switch is not a scale


# ------------------------------------------------------------------ factors past any length
@pytest.mark.parametrize("method", hf_posext.METHODS)
def test_absurd_factor_is_refused_naming_a_smaller_one(method):
    model = tiny_model()
    with pytest.raises(ValueError, match="positions \\(int32\\); ask for a"):
        hf_posext.patch(model, method, factor=1e308)
    assert not hf_posext.is_patched(model)


def test_absurd_factor_in_config_json_is_refused_before_loading(tmp_path, capsys):
    def huge(c):
        for key in ("rope_scaling", "rope_parameters", "hf_posext"):
            if isinstance(c.get(key), dict):
                c[key]["factor"] = 1e308
    folder = _saved(tmp_path, "huge", "yarn", huge, factor=2)
    refused(lambda: hf_posext.from_pretrained(str(folder)), "smaller factor")
    cli_refused(["check", folder], capsys, "smaller factor")


# ------------------------------------------------------------------ longrope factor lengths
@pytest.mark.parametrize("prf,n", [(1.0, 8), (0.5, 4)])
def test_longrope_factor_lists_must_have_one_per_frequency(prf, n):
    """transformers' longrope: dim = int(head_dim · partial_rotary_factor) (16 · prf here),
    dim / 2 inverse frequencies, each divided by its factor."""
    make = lambda: tiny_model(partial_rotary_factor=prf)   # noqa: E731
    for bad in (n - 1, n + 1, 3):
        with pytest.raises(ValueError, match=f"list of {n} numbers"):
            hf_posext.patch(make(), "longrope", factor=2, short_factor=[1.0] * bad, long_factor=[1.0] * n)
    with pytest.raises(ValueError, match="finite numbers > 0"):
        hf_posext.patch(make(), "longrope", factor=2, short_factor=[1.0] * n, long_factor=[0.0] * n)
    with pytest.raises(ValueError, match=f"short_factor must be a list of {n} numbers"):   # length first
        hf_posext.patch(make(), "longrope", factor=2, short_factor=[0.0] * (n + 1), long_factor=[1.0] * n)
    model = hf_posext.patch(make(), "longrope", factor=2, short_factor=[1.0] * n, long_factor=[2.0] * n)
    assert model.model.rotary_emb.inv_freq.shape[-1] == n


@pytest.mark.parametrize("method,knobs", [
    ("longrope", dict(short_factor=[1.0] * 8, long_factor=[2.0] * 8)),
    ("llama3", dict(low_freq_factor=1.0, high_freq_factor=4.0))])
@pytest.mark.parametrize("bad", [0, -64, 64.0, True, None])
def test_transformers_own_types_refuse_a_bad_trained_length(method, knobs, bad):
    """transformers' llama3 / longrope read L from their rope dict: a whole number of tokens > 0."""
    model = tiny_model()
    with pytest.raises(ValueError, match=r"trained_length must be a positive integer"):
        hf_posext.patch(model, method, factor=2, trained_length=bad, **knobs)
    assert not hf_posext.is_patched(model)


# ------------------------------------------------------------------ devices, non-models
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")
def test_evaluation_on_a_missing_device_names_it():
    from hf_posext.evaluation import PerplexityGrid, RetrievalGrid, RunInfo, evaluate_passkey, evaluate_perplexity
    with pytest.raises(ConfigError, match="device=cuda: CUDA is not available.*device=cpu"):
        evaluate_perplexity(tiny_model(), [np.arange(80) % 100],
                            PerplexityGrid(methods=["none"], lengths=[32]),
                            run=RunInfo(device="cuda"))
    with pytest.raises(ConfigError, match="device=cuda:1: CUDA is not available"):
        evaluate_passkey(tiny_model(), None,
                         RetrievalGrid(methods=["none"], lengths=[32], depths=[0.5], seeds=[0]),
                         run=RunInfo(device="cuda:1"))


def test_the_evaluations_take_typed_settings_only():
    """One calling convention: grid fields as keywords name the objects to build; a passkey
    grid of another task points to evaluate_retrieval; nothing runs (the model is never used)."""
    from hf_posext.evaluation import RetrievalGrid, evaluate_passkey, evaluate_perplexity
    with pytest.raises(TypeError, match=r"methods, lengths belong in PerplexityGrid\(\.\.\.\); device "
                                        r"belongs in RunInfo.*evaluate_perplexity\(model, docs, Perp"):
        evaluate_perplexity(None, [], methods=["none"], lengths=[32], device="cpu")
    with pytest.raises(TypeError, match=r"seeds belongs in RetrievalGrid.*model_name belongs in RunInfo"):
        evaluate_passkey(None, None, RetrievalGrid(["none"], [32]), seeds=[0], model_name="m")
    with pytest.raises(TypeError, match="grid must be a PerplexityGrid"):
        evaluate_perplexity(None, [], {"methods": ["none"], "lengths": [32]})
    with pytest.raises(ValueError, match="single_needle task.*use evaluate_retrieval"):
        evaluate_passkey(None, None, RetrievalGrid(["none"], [32], tasks=["multi_key"]))


def test_trained_length_of_a_name_is_a_type_error():
    with pytest.raises(TypeError, match="expects a loaded transformers model.*from_pretrained"):
        hf_posext.trained_length("llama")


# ------------------------------------------------------------------ damaged checkpoints
def test_deleted_attention_entry_is_refused_at_load(tmp_path):
    folder = _saved(tmp_path, "noentry", "rerope", lambda c: c.pop("hf_posext_attention"), factor=2)
    refused(lambda: hf_posext.from_pretrained(str(folder)), "no 'hf_posext_attention' entry",
            "attn_implementation='sdpa'")


def test_deleted_attention_entry_loads_with_plain_attention_when_asked(tmp_path):
    folder = _saved(tmp_path, "noentry", "rerope", lambda c: c.pop("hf_posext_attention"), factor=2)
    model = hf_posext.from_pretrained(str(folder), attn_implementation="sdpa")
    assert model.config._attn_implementation == "sdpa"


def test_zero_heads_is_named_by_check_and_load(tmp_path, capsys):
    folder = _saved(tmp_path, "heads0", "yarn",
                    lambda c: (c.update(num_attention_heads=0), c.pop("head_dim", None)), factor=2)
    cli_refused(["check", folder], capsys, "num_attention_heads")
    refused(lambda: hf_posext.from_pretrained(str(folder)), "num_attention_heads")


# ------------------------------------------------------------------ STRING's reach
def _farthest(T, S, W):
    """STRING's definition (An et al. 2024, arXiv 2410.18745): d kept below S, d − S + W from S."""
    return max(d if d < S else d - S + W for d in range(T))


@pytest.mark.parametrize("T,S,W", [(64, 21, 5), (80, 21, 5), (81, 21, 5), (83, 24, 5), (83, 23, 5),
                                   (100, 40, 4), (128, 64, 1), (128, 21, 5), (192, 21, 5)])
def test_string_target_is_kept_inside_the_trained_length(T, S, W):
    fits = _farthest(T, S, W) <= TRAINED - 1
    model = tiny_model()
    if fits:
        hf_posext.patch(model, "string", target_length=T, shifted_offset=S, local_value=W)
        return
    with pytest.raises(BeyondReach) as err:
        hf_posext.patch(model, "string", target_length=T, shifted_offset=S, local_value=W)
    least = next((s for s in range(W, TRAINED + 1) if _farthest(T, s, W) <= TRAINED - 1), None)
    assert (f"shifted_offset >= {least}" if least else "no shifted_offset <= L can") in str(err.value)
    assert not hf_posext.is_patched(model)


def test_string_without_a_target_runs_any_length(tokens):
    model = hf_posext.patch(tiny_model(), "string", shifted_offset=21, local_value=5)
    assert model.config.max_position_embeddings == TRAINED
    with torch.no_grad():
        assert torch.isfinite(model(tokens).logits).all()


# ------------------------------------------------------------------ eval: checked on the config
def _eval(assets, tmp_path, *extra):
    return ["eval", "--model", str(assets / "llama"), "--dataset", str(assets / "docs"), "--no-plot",
            "--no-progress", "--out", str(tmp_path / "out"), *extra]


def test_eval_knob_above_trained_length_fails_before_loading(assets, tmp_path, capsys):
    cli_refused(_eval(assets, tmp_path, "--methods", "rerope", "--knobs", "rerope:window=100"), capsys,
                "rerope at --lengths", "window=100 exceeds the trained length 64")
    assert not (tmp_path / "out").exists()


def test_eval_factor_past_any_length_is_a_usage_error(assets, tmp_path, capsys):
    cli_refused(_eval(assets, tmp_path, "--factor", "1e308"), capsys, "--factor: factor=1e+308 is past")


def test_eval_string_beyond_its_reach_fails_before_loading(assets, tmp_path, capsys):
    cli_refused(_eval(assets, tmp_path, "--methods", "string", "--lengths", "64,128", "--knobs",
                      "string:shifted_offset=21,string:local_value=5"), capsys,
                "--methods string at --lengths 128", "factor <= 1.25")


@pytest.mark.slow   # a real evaluation of every method
def test_eval_all_skips_string_beyond_its_reach_and_says_so(assets, tmp_path, capsys):
    knobs = "string:shifted_offset=21,string:local_value=5"
    assert cli.main(_eval(assets, tmp_path, "--methods", "all", "--lengths", "64,128", "--factor",
                          "auto,1.25", "--no-baseline", "--knobs", knobs)) == 0
    assert "note: --methods all: string skipped at 128 tokens (s = 2)" in capsys.readouterr().err
    rows = read_rows(tmp_path / "out" / "perplexity.json")
    string = sorted((r["length"], r["factor"]) for r in rows if r["method"] == "string")
    assert string == [(64, 1.0), (64, 1.25), (128, 1.25)]   # 2x at 128 left out: L + S − W = 80
    assert {r["method"] for r in rows} == {"none", *hf_posext.METHODS}


# ------------------------------------------------------------------ results files
def test_resume_refuses_rows_of_an_older_format_naming_file_and_row(tmp_path):
    row = {"key": "k1", "method": "none", "length": 64, "protocol": "truncate", "perplexity": 3.0}
    for missing in ("protocol", "perplexity", "length"):
        out = tmp_path / missing
        out.mkdir()
        bad = {k: v for k, v in row.items() if k != missing}
        (out / "perplexity.json").write_text(json.dumps({"rows": [row, bad]}))
        with pytest.raises(ResultsError, match=f"perplexity.json: row 1 \\(key k1\\) has no {missing}.*delete that row"):
            ResultsStore(out, "perplexity", resume=True)
    out = tmp_path / "ok"
    out.mkdir()
    (out / "perplexity.json").write_text(json.dumps({"rows": [row]}))
    assert ResultsStore(out, "perplexity", resume=True).rows == [row]


def test_results_folder_never_writes_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for planted in (".perplexity.lock.pid", ".perplexity.lock"):
        out = tmp_path / f"out{planted}"
        out.mkdir()
        os.symlink(victim, out / planted)
        with pytest.raises(ResultsError, match="symbolic link"):
            ResultsStore(out, "perplexity")
    out = tmp_path / "tmp_link"
    out.mkdir()
    os.symlink(victim, out / f".perplexity.json.{os.getpid()}.tmp")   # the predictable temporary
    atomic_write(out / "perplexity.json", "{}")
    link = out / "linked.json"
    os.symlink(victim, link)
    atomic_write(link, "{}")                     # the link itself replaced, not followed
    assert victim.read_text() == "precious" and not link.is_symlink()


# ------------------------------------------------------------------ the recipe
def test_recipe_output_dir_naming_a_file_fails_before_loading(assets, tmp_path, monkeypatch):
    import hf_posext.training.recipe as recipe
    monkeypatch.setattr(recipe, "load_recipe_model", lambda *a, **k: pytest.fail("the model loaded first"))
    target = tmp_path / "a_file"
    target.write_text("x")
    for out in (target, target / "run"):
        with pytest.raises(ConfigError, match="is a file, not a folder"):
            load_finetune().main(recipe_argv(assets, out))


def test_recipe_output_dir_through_a_dangling_link_fails_before_loading(assets, tmp_path, monkeypatch):
    import hf_posext.training.recipe as recipe
    monkeypatch.setattr(recipe, "load_recipe_model", lambda *a, **k: pytest.fail("the model loaded first"))
    monkeypatch.setattr(recipe, "prepare_data", lambda *a, **k: pytest.fail("the data was packed first"))
    link = tmp_path / "runs-link"
    os.symlink(tmp_path / "elsewhere", link)
    for out in (link, link / "run"):
        with pytest.raises(ConfigError, match=f"runs-link is a link to {tmp_path / 'elsewhere'}, which does not exist"):
            load_finetune().main(recipe_argv(assets, out))
    assert not (tmp_path / "elsewhere").exists()


def test_recipe_resume_with_damaged_config_names_the_file(assets, tmp_path, monkeypatch):
    import hf_posext.training.recipe as recipe
    monkeypatch.setattr(recipe, "load_recipe_model", lambda *a, **k: pytest.fail("the model loaded first"))
    out = tmp_path / "run"
    (out / "checkpoints" / "checkpoint_0").mkdir(parents=True)
    (out / "config.json").write_text('{"model": ')
    with pytest.raises(ConfigError, match=f"{out / 'config.json'} is damaged"):
        load_finetune().main(recipe_argv(assets, out) + ["--resume"])

"""Results that cannot be silently wrong: a result's identity covers the model's
content, dtype, device, attention and data; resume and reuse never cross identities; one writer
per results folder; damaged files are refused or repaired; bad inputs fail before a model loads."""

import json

import pytest
import torch

import hf_posext.cli as cli
from hf_posext.commands import model_args
from _evalkit import char_tokenizer, random_doc, tiny_model
from hf_posext.evaluation import PerplexityGrid, ResultsStore, RunInfo, evaluate_perplexity
from hf_posext.evaluation.shared import grid as grid_mod
from hf_posext.evaluation.shared.identity import checkpoint_fingerprint
from hf_posext.evaluation.shared.record import read_rows

DOCS = [random_doc(160, seed=11)]


def _save(path, seed):
    tiny_model(seed=seed).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text(("To be, or not to be, that is the question. " * 12)[:400])
    return path


def _argv(model, data, out, *extra):
    return ["eval", "--model", str(model), "--dataset", str(data), "--lengths", "32,96",
            "--methods", "linear", "--out", str(out), "--no-progress", "--no-plot", *extra]


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    return exc.value.code, capsys.readouterr().err


def one_line_error(err: str) -> str:
    """The error, which must be the last line of stderr and one line (no traceback)."""
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(args):
        raise AssertionError("the model was loaded before the input was checked")
    monkeypatch.setattr(model_args, "load_model_from", refuse)


# --- resume never crosses identities -------------------------------------------------------------

def test_resume_after_the_model_changed_at_the_same_path_is_refused(tmp_path, data, capsys):
    model = _save(tmp_path / "m", seed=0)
    assert cli.main(_argv(model, data, tmp_path / "out")) == 0
    before = checkpoint_fingerprint(model)
    _save(model, seed=1)                                    # same path, other weights
    assert checkpoint_fingerprint(model) != before
    code, err = run(_argv(model, data, tmp_path / "out", "--resume"), capsys)
    assert code == 2 and "holds results of another run" in err and "model_fingerprint" in err


def test_resume_with_another_model_is_refused_before_loading(tmp_path, data, capsys, monkeypatch):
    assert cli.main(_argv(_save(tmp_path / "a", 0), data, tmp_path / "out")) == 0
    other = _save(tmp_path / "b", 1)
    monkeypatch.setattr(model_args, "load_model_from", lambda args: pytest.fail("model loaded"))
    code, err = run(_argv(other, data, tmp_path / "out", "--resume"), capsys)
    assert code == 2 and "model_fingerprint differs" in err


def test_resume_with_another_dtype_is_refused(tmp_path, data, capsys):
    model = _save(tmp_path / "m", 0)
    assert cli.main(_argv(model, data, tmp_path / "out")) == 0
    code, err = run(_argv(model, data, tmp_path / "out", "--resume", "--dtype", "bfloat16"), capsys)
    assert code == 2 and "dtype differs" in err
    # The same run resumes: nothing recomputed, same rows.
    rows = read_rows(tmp_path / "out" / "perplexity.json")
    assert cli.main(_argv(model, data, tmp_path / "out", "--resume")) == 0
    assert read_rows(tmp_path / "out" / "perplexity.json") == rows


def test_the_api_never_reuses_another_models_rows(tmp_path):
    """Same `model_name`, other weights (e.g. the recipe retrained with another learning rate):
    nothing is copied from the first model's rows, through the key or through `same_as`."""
    with ResultsStore(tmp_path, "results") as store:
        a = evaluate_perplexity(tiny_model(seed=0), DOCS,
                                PerplexityGrid(methods=["linear"], lengths=[32, 96]),
                                run=RunInfo(model_name="final"), store=store, progress=False)
        b = evaluate_perplexity(tiny_model(seed=1), DOCS,
                                PerplexityGrid(methods=["linear"], lengths=[32, 96]),
                                run=RunInfo(model_name="final"), store=store, progress=False)
    assert {r["key"] for r in a}.isdisjoint(r["key"] for r in b)
    assert all(x["perplexity"] != y["perplexity"] for x, y in zip(a, b))
    assert all(not r["same_as"].startswith("none") or r["length"] == 32 for r in b)
    # As-is mode (the recipe's fine-tuned model): other weights, other rows.
    with ResultsStore(tmp_path / "ft", "results") as store:
        f1 = evaluate_perplexity(tiny_model(seed=0), DOCS,
                                 PerplexityGrid(methods=None, label="fine-tuned", lengths=[96]),
                                 store=store, progress=False)
        f2 = evaluate_perplexity(tiny_model(seed=2), DOCS,
                                 PerplexityGrid(methods=None, label="fine-tuned", lengths=[96]),
                                 store=store, progress=False)
    assert f1[0]["method"] == "fine-tuned" and f1[0]["perplexity"] != f2[0]["perplexity"]


def test_float32_rows_are_not_bfloat16_rows(tmp_path):
    with ResultsStore(tmp_path, "p") as store:
        f32 = evaluate_perplexity(tiny_model(), DOCS, PerplexityGrid(methods=[], lengths=[64]),
                                  store=store, progress=False)
        bf16 = evaluate_perplexity(tiny_model().to(torch.bfloat16), DOCS,
                                   PerplexityGrid(methods=[], lengths=[64]), store=store,
                                   progress=False)
    assert f32[0]["dtype"] == "float32" and bf16[0]["dtype"] == "bfloat16"
    assert f32[0]["key"] != bf16[0]["key"] and f32[0]["perplexity"] != bf16[0]["perplexity"]


def test_an_attention_level_change_is_not_reused_from_none(monkeypatch):
    """linear at s = 1 has the unpatched cos/sin; if its patch also switches attention (as an
    attention-level method does), its result must be computed, not copied from `none`."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def halved_keys(module, query, key, value, attention_mask, **kw):
        return sdpa_attention_forward(module, query, key * 0.5, value, attention_mask, **kw)

    AttentionInterface.register("test_halved_keys", halved_keys)
    real = grid_mod.apply_method

    def apply(model, method, factor, knobs=None):
        real(model, method, factor, knobs)
        model.config._attn_implementation = "test_halved_keys" if method == "linear" else "sdpa"

    monkeypatch.setattr(grid_mod, "apply_method", apply)
    model = tiny_model()
    model.config._attn_implementation = "sdpa"
    rows = evaluate_perplexity(model, DOCS, PerplexityGrid(methods=["linear", "ntk"], lengths=[48]),
                               progress=False)
    same = {r["method"]: r["same_as"] for r in rows}
    assert same == {"none": "", "linear": "", "ntk": "none s=1"}
    ppl = {r["method"]: r["perplexity"] for r in rows}
    assert ppl["linear"] != ppl["none"] and ppl["ntk"] == ppl["none"]


# --- one writer, atomic and checked files ----------------------------------------------------------

def test_a_second_writer_on_the_same_out_is_refused(tmp_path, data, capsys):
    model = _save(tmp_path / "m", 0)
    with ResultsStore(tmp_path / "out", "perplexity"):     # another run holds the folder
        code, err = run(_argv(model, data, tmp_path / "out"), capsys)
    assert code == 2 and "another run (pid" in err and "is writing to" in err
    assert cli.main(_argv(model, data, tmp_path / "out")) == 0   # free again afterwards


def test_damaged_results_files(tmp_path, data, capsys):
    model = _save(tmp_path / "m", 0)
    out = tmp_path / "out"
    assert cli.main(_argv(model, data, out)) == 0
    good_csv = (out / "perplexity.csv").read_bytes()
    (out / "perplexity.csv").write_bytes(good_csv[: len(good_csv) // 2])   # cut mid-line
    assert cli.main(_argv(model, data, out, "--resume")) == 0
    assert "perplexity.csv was missing or damaged; rewritten" in capsys.readouterr().err
    assert (out / "perplexity.csv").read_bytes() == good_csv
    text = (out / "perplexity.json").read_text()
    (out / "perplexity.json").write_text(text[: len(text) // 2])           # cut JSON
    code, err = run(_argv(model, data, out, "--resume"), capsys)
    assert code == 2 and "perplexity.json is damaged" in one_line_error(err)
    rows = json.loads(text)["rows"]
    del rows[1]["key"]                                                    # a row without key
    (out / "perplexity.json").write_text(json.dumps({"rows": rows}))
    code, err = run(_argv(model, data, out, "--resume"), capsys)
    assert code == 2 and "row 1 has no 'key'" in one_line_error(err)


# --- every input that can be checked, before the model loads ---------------------------------------

@pytest.mark.parametrize("case", ["file", "unwritable"])
def test_unusable_out_fails_before_loading(tmp_path, data, capsys, no_model_load, case):
    model = _save(tmp_path / "m", 0)
    if case == "file":
        out = tmp_path / "taken"
        out.write_text("x")
        message = "is a file, not a folder"
    else:
        out = "/proc/hf_posext_results"   # /proc refuses new entries, even to root
        message = "cannot write there"
    code, err = run(_argv(model, data, out), capsys)
    assert code == 2 and message in err


def test_binary_dataset_cuda_and_repeated_seeds_fail_before_loading(tmp_path, capsys, no_model_load):
    model = _save(tmp_path / "m", 0)
    (tmp_path / "blob.txt").write_bytes(bytes(range(256)) * 4)
    code, err = run(_argv(model, tmp_path / "blob.txt", tmp_path / "o1"), capsys)
    assert code == 2 and "is a binary file, not text" in err
    if not torch.cuda.is_available():
        code, err = run(["eval", "--model", str(model), "--device", "cuda", "--out",
                         str(tmp_path / "o2")], capsys)
        assert code == 2 and "CUDA is not available" in err
    code, err = run(["passkey", "--model", str(model), "--seed", "-2", "--out",
                     str(tmp_path / "o3")], capsys)
    assert code == 2 and "--seed must be an integer >= 0" in err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o3").exists()

"""lm-evaluation-harness: the `hf-posext` model type patches the model lm-eval loads (rope and
attention-level methods), a static method saved by hf_posext runs under lm-eval's plain `hf`
model with the same numbers, and bad model_args / a missing lm-eval are one-line errors before
any model loads. Local tasks only (tests/lm_eval_tasks, run from the repository root)."""

from pathlib import Path

import pytest
import torch

import hf_posext
import hf_posext.cli as cli
from _evalkit import char_tokenizer, tiny_checkpoint, tiny_model

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from hf_posext.evaluation.integrations.harness import MODEL_TYPE, PosextLM  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tasks():
    return TaskManager(include_path=str(ROOT / "tests" / "lm_eval_tasks"))


def _logliks(model, model_args, tasks, monkeypatch_root=True, task="tiny_choice"):
    import os
    here = os.getcwd()
    os.chdir(ROOT)   # the task's data_files are relative to the repository root
    try:
        out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task],
                                      task_manager=tasks, device="cpu", log_samples=True,
                                      verbosity="ERROR")
    finally:
        os.chdir(here)
    return [float(r[0][0]) for s in out["samples"][task] for r in s["resps"]]


def _manual_logliks(model, tok):
    """The reference: log p(" " + choice | question) summed over the continuation's tokens (lm-eval
    joins context and choice with its target_delimiter " "), one forward."""
    import json
    out = []
    for line in (ROOT / "tests" / "lm_eval_tasks" / "tiny_choice.jsonl").read_text().splitlines():
        doc = json.loads(line)
        for choice in doc["choices"]:
            ctx = tok(doc["question"])["input_ids"]
            cont = tok(doc["question"] + " " + choice)["input_ids"][len(ctx):]
            ids = torch.tensor([ctx + cont])
            with torch.no_grad():
                logp = model(ids).logits.log_softmax(-1)[0, len(ctx) - 1:-1]
            out.append(float(logp.gather(-1, torch.tensor(cont)[:, None]).sum()))
    return out


@pytest.mark.slow
def test_model_type_is_registered_and_patches_rope(tiny_dir, tasks, tmp_path):
    from lm_eval.api.registry import get_model
    assert get_model(MODEL_TYPE) is PosextLM
    patched = _logliks(MODEL_TYPE, f"pretrained={tiny_dir},method=yarn,factor=4", tasks)
    plain = _logliks("hf", f"pretrained={tiny_dir}", tasks)
    assert patched != plain                  # the method changed the numbers
    # The static method saved by hf_posext: lm-eval's plain `hf` reads the same rope config.
    model = tiny_model()
    hf_posext.patch(model, "yarn", 4.0)
    model.save_pretrained(tmp_path / "yarn")
    char_tokenizer().save_pretrained(tmp_path / "yarn")
    saved = _logliks("hf", f"pretrained={tmp_path / 'yarn'}", tasks)
    assert saved == pytest.approx(patched, abs=1e-4)
    # and both are what the patched model computes by hand
    assert patched == pytest.approx(_manual_logliks(model, char_tokenizer()), abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("method, knobs", [("leaky_rerope", {"window": 16}), ("dual_chunk", {})])
def test_attention_level_method_through_model_args(tiny_dir, tasks, method, knobs):
    extra = "".join(f",{k}={v}" for k, v in knobs.items())
    got = _logliks(MODEL_TYPE, f"pretrained={tiny_dir},method={method},factor=4{extra}", tasks)
    model = tiny_model()
    hf_posext.patch(model, method, 4.0, **knobs)
    assert got == pytest.approx(_manual_logliks(model, char_tokenizer()), abs=1e-3)
    # (these short prompts sit within the window, where the method changes nothing: that the
    # model lm-eval builds is patched is checked on the object itself)
    lm = PosextLM(pretrained=str(tiny_dir), method=method, factor=4, device="cpu", **knobs)
    assert hf_posext.is_patched(lm.model) and lm.posext_method == method


def test_generation_holds_a_dynamic_scale(tiny_dir):
    lm = PosextLM(pretrained=str(tiny_dir), method="dynamic_ntk", factor=4, device="cpu",
                  max_length=256)
    ids = torch.randint(3, 90, (1, 120), generator=torch.Generator().manual_seed(0))
    got = lm._model_generate(ids, 140, stop=["\u0000"], do_sample=False)
    want = hf_posext.generate(lm.model, ids, 20, do_sample=False,
                              pad_token_id=lm.tokenizer.pad_token_id)
    assert torch.equal(got, want)


@pytest.mark.parametrize("model_args, message", [
    ("pretrained=x,method=nope", "Unknown RoPE extension method"),
    ("pretrained=x,method=yarn,factor=0.5", "factor=0.5"),
    ("pretrained=x,factor=2", "no method="),
    ("pretrained=x,method=yarn,beta_fast=-1", "beta_fast"),
    ("method=yarn", "pretrained="),
])
def test_bad_model_args_fail_before_loading(model_args, message, capsys, monkeypatch):
    monkeypatch.setattr(HFLM, "__init__", lambda *a, **k: pytest.fail("lm-eval loaded a model"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["lm-eval", "--model", MODEL_TYPE, "--model_args", model_args, "--tasks", "tiny_choice"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_missing_lm_eval_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "lm_eval", None)   # import lm_eval -> ImportError
    with pytest.raises(SystemExit) as exc:
        cli.main(["lm-eval", "--model", MODEL_TYPE, "--tasks", "tiny_choice"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "pip install 'hf_posext[lmeval]'" in err

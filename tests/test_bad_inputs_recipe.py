"""Bad recipe configurations (the rule: tests/_badinputs.py): every flag and YAML file
below is refused by `recipes/finetune.py` with a one-line error naming the key, before the model
loads, and the output folder is not created. (The recipe's runs, resumes and checkpoints:
test_bad_inputs.py.)"""

from __future__ import annotations

import pytest
from _badinputs import refused
from _recipekit import load_finetune, make_assets, recipe_argv

finetune = load_finetune()
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("recipe"), archs=("llama",))


# section__key=value, what the message names. factor 0.5, weight_decay -0.1, learning_rate nan / inf,
# max_grad_norm nan: test_bad_inputs
FLAGS = [
    (dict(model__factor="nan"), "model.factor", "nan"), (dict(model__factor="-1"), "factor", "-1"),
    (dict(model__method="bogus"), "'bogus'"), (dict(training__learning_rate="0"), "training.learning_rate", "0"),
    (dict(training__learning_rate="-1e-3"), "training.learning_rate", "-0.001"),
    (dict(training__max_grad_norm="0"), "training.max_grad_norm"),
    (dict(training__adam_betas="[1, 0.9]"), "training.adam_betas"), (dict(training__seq_len="0"), "training.seq_len"),
    (dict(training__max_steps="0"), "training.max_steps"), (dict(training__warmup_steps="-1"), "training.warmup_steps"),
    (dict(training__batch_size="0"), "training.batch_size"), (dict(training__save_every="0"), "training.save_every"),
    (dict(training__keep_checkpoints="0"), "training.keep_checkpoints"),
    (dict(training__loss_chunk="-1"), "training.loss_chunk", "-1"), (dict(training__loss_chunk="0.5"), "training.loss_chunk"),
    (dict(training__lr_schedule="bogus"), "training.lr_schedule 'bogus'"),
    (dict(training__mixed_precision="fp8"), "training.mixed_precision", "'fp8'"),
    (dict(model__dtype="float8"), "model.dtype"), (dict(pose__num_chunks="0"), "pose.num_chunks"),
    (dict(pose__target="8"), "pose.target (8)"), (dict(eval__lengths="[1]"), "eval.lengths"),
    (dict(eval__lengths="[]"), "eval.lengths"), (dict(training__lr="1e-3"), "--training.lr"),
    (dict(model__name="{tmp}/nope"), "model.name", "nope"),
    (dict(data__source="{tmp}/nodocs"), "nodocs", "no such file or folder"),
    (dict(model__knobs="{beta_fast: .nan}"), "beta_fast", "nan"),
    (dict(data__eval_documents="{a: 1}"), "data.eval_documents"),
    # the recipe's knobs are RoPE knobs: an attention method's is refused by name
    (dict(model__method="rerope", model__knobs="{window: 100000}"), "'window'"),
]


@pytest.mark.parametrize("over,says", [(o, s) for o, *s in FLAGS], ids=[str(o) for o, *_ in FLAGS])
def test_recipe_refuses_a_bad_setting(over, says, assets, tmp_path):
    over = {k: v.replace("{tmp}", str(tmp_path)) for k, v in over.items()}
    out = tmp_path / "run"
    refused(lambda: finetune.main(recipe_argv(assets, out, **over)), *says)
    assert not out.exists()


YAML = {   # the syntax error, a duplicate key, learning_rate .inf / .nan: test_bad_inputs
    "duplicate section": ("training:\n  seq_len: 32\ntraining:\n  seq_len: 64\n", "'training' is given twice"),
    "factor .nan": ("model:\n  factor: .nan\n", "factor"), "not a mapping": ("- a\n- b\n", "recipe configuration"),
    "binary junk": ("\x00\x01\x02", "is not valid YAML"), "unknown section": ("trainng:\n  seq_len: 32\n", "'trainng.seq_len'"),
    "weight_decay -1": ("training:\n  weight_decay: -1\n", "training.weight_decay"),
}


@pytest.mark.parametrize("case", YAML)
def test_recipe_refuses_a_bad_yaml_file(case, tmp_path):
    text, says = YAML[case]
    (tmp_path / "recipe.yaml").write_text(text)
    refused(lambda: finetune.main(["--config", str(tmp_path / "recipe.yaml"), "--output_dir", str(tmp_path / "out")]),
            says)
    assert not (tmp_path / "out").exists()


def test_recipe_refuses_a_missing_yaml_file(tmp_path):
    refused(lambda: finetune.main(["--config", str(tmp_path / "none.yaml")]), "none.yaml", "cannot read it")

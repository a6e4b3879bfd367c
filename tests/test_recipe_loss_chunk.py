"""`training.loss_chunk`: the recipe's loss with the LM head applied per chunk of positions trains
what transformers' own loss trains (the run without it is the reference: `model(**batch).loss`),
with PoSE position ids, with synthetic examples whose loss is on the answer only, and with LoRA
and gradient checkpointing; it is refused on more than one process, before the model loads."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
import torch
from _recipekit import final_weights, load_finetune, make_assets, recipe_argv

from hf_posext.errors import ConfigError
from hf_posext.training import recipe as recipe_module
from hf_posext.training.recipe_config import parse_args

finetune = load_finetune()
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("loss-chunk"), archs=("llama",))


def losses(out) -> list[float]:
    with open(out / "train_log.csv") as fh:
        return [float(r["loss"]) for r in csv.DictReader(fh)]


SETTINGS = {
    "pose": {},
    "synthetic examples, loss on the answer": dict(data__synthetic__share="0.5", data__synthetic__loss="answer",
                                                   training__seq_len="128"),
    "lora + gradient checkpointing": dict(lora__enabled="true", lora__r="4", training__gradient_checkpointing="true",
                                          training__learning_rate="1e-2"),
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_chunked_loss_trains_what_transformers_loss_trains(assets, tmp_path, setting):
    over = dict(SETTINGS[setting], eval__enabled="false")
    finetune.main(recipe_argv(assets, tmp_path / "full", **over))
    finetune.main(recipe_argv(assets, tmp_path / "chunked", **over, training__loss_chunk="5"))
    full, chunked = losses(tmp_path / "full"), losses(tmp_path / "chunked")
    assert len(full) == 4 and len(set(full)) > 1               # four steps that moved the loss
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-6)
    a, b = final_weights(tmp_path / "full"), final_weights(tmp_path / "chunked")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5, msg=k)


def test_chunked_loss_is_refused_on_more_than_one_process(assets, tmp_path, monkeypatch):
    two = SimpleNamespace(num_processes=2, distributed_type="MULTI_CPU", print=print, is_main_process=True)
    monkeypatch.setattr(recipe_module, "make_accelerator", lambda *a, **k: two)
    loaded = []
    monkeypatch.setattr(recipe_module, "load_recipe_model", lambda *a, **k: loaded.append(1))
    cfg, _ = parse_args(recipe_argv(assets, tmp_path / "out", training__loss_chunk="1024"))
    with pytest.raises(ConfigError, match=r"training.loss_chunk 1024.*2 processes.*training.loss_chunk 0"):
        recipe_module.run(cfg)
    assert not loaded

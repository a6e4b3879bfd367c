"""benchmarks/code_mix.py's training commands train the retrieval recipe as it was when its arms
ran (the 1k-window setting, whose trained config finetune-retrieval-span09's mix arm stored), not
the recipe's default of today; the code arm differs from it by its haystacks alone."""

from __future__ import annotations

import dataclasses
import json

import pytest
from _recipekit import ROOT

THEN = ROOT / "benchmarks" / "results" / "finetune-retrieval-span09" / "mix" / "train" / "config.json"


@pytest.fixture
def code_mix(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import code_mix
    return code_mix


@pytest.mark.parametrize("arm", ["prose", "code"])
def test_an_arm_trains_the_recipe_as_it_was(code_mix, arm, tmp_path):
    from hf_posext.training.recipe_config import config_from_dict, parse_args
    argv = code_mix.train_argv(arm, tmp_path)
    argv = argv[argv.index("recipes/finetune.py") + 1:]
    argv[argv.index("--config") + 1] = str(ROOT / argv[argv.index("--config") + 1])
    cfg, _ = parse_args(argv)
    then = config_from_dict(json.loads(THEN.read_text()))
    assert (then.training.seq_len, then.training.max_steps, then.data.synthetic.share) == (1024, 200, 0.25)
    for section in ("model", "training", "pose", "lora"):
        assert getattr(cfg, section) == getattr(then, section), section
    haystacks = ["training", "embedded:python-stdlib"] if arm == "code" else then.data.synthetic.haystacks
    assert cfg.data == dataclasses.replace(then.data, synthetic=dataclasses.replace(then.data.synthetic,
                                                                                   haystacks=haystacks))
    assert cfg.output_dir == str(tmp_path / arm)

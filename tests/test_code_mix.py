"""The code-mix page's training commands (benchmarks/results/retrieval_code_mix.md, written by
`python benchmarks/code_mix.py report` from the commands it runs) train the retrieval recipe as it
was when its arms ran: the 1k-window setting, whose trained config finetune-retrieval-span09's mix
arm stored, not the recipe's default of today; the code arm differs from it by its haystacks alone."""

from __future__ import annotations

import dataclasses
import json
import shlex

from _recipekit import ROOT

THEN = ROOT / "benchmarks" / "results" / "finetune-retrieval-span09" / "mix" / "train" / "config.json"
PAGE = ROOT / "benchmarks" / "results" / "retrieval_code_mix.md"


def test_each_arm_trains_the_recipe_as_it_was():
    from hf_posext.training.recipe_config import config_from_dict, parse_args
    then = config_from_dict(json.loads(THEN.read_text()))
    assert (then.training.seq_len, then.training.max_steps, then.data.synthetic.share) == (1024, 200, 0.25)
    commands = [line for line in PAGE.read_text().splitlines() if line.startswith("accelerate launch ")]
    arms = {}
    for command in commands:
        argv = shlex.split(command.split("recipes/finetune.py ", 1)[1])
        argv[argv.index("--config") + 1] = str(ROOT / argv[argv.index("--config") + 1])
        cfg, _ = parse_args(argv)
        arms[cfg.output_dir.rsplit("/", 1)[-1]] = cfg
    assert sorted(arms) == ["code", "prose"]
    for arm, cfg in arms.items():
        for section in ("model", "training", "pose", "lora"):
            assert getattr(cfg, section) == getattr(then, section), (arm, section)
        haystacks = ["training", "embedded:python-stdlib"] if arm == "code" else then.data.synthetic.haystacks
        assert cfg.data == dataclasses.replace(then.data, synthetic=dataclasses.replace(then.data.synthetic,
                                                                                       haystacks=haystacks))

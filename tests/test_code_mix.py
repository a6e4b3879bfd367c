"""The code-mix page's training commands (benchmarks/results/retrieval_code_mix.md, written by
`python benchmarks/code_mix.py report` from the commands it runs) train the retrieval recipe in the
setting each arm names: `code` and `prose` the 1k-window setting, whose trained config
finetune-retrieval-span09's mix arm stored, not the recipe's default of today; the `-2k` arms the
recipe as shipped, whose trained config finetune-retrieval-2k-windows' mix arm stored. A code arm
differs from its setting by its haystacks alone, an arm's other seeds by `training.seed` alone."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys

from _recipekit import ROOT

STORED = ROOT / "benchmarks" / "results"
THEN = STORED / "finetune-retrieval-span09" / "mix" / "train" / "config.json"
SHIPPED = STORED / "finetune-retrieval-2k-windows" / "mix" / "train" / "config.json"
PAGE = ROOT / "benchmarks" / "results" / "retrieval_code_mix.md"
SCRIPT = ROOT / "benchmarks" / "code_mix.py"


def test_each_arm_trains_the_recipe_in_its_setting():
    from hf_posext.training.recipe_config import config_from_dict, parse_args
    settings = {path: config_from_dict(json.loads(path.read_text())) for path in (THEN, SHIPPED)}
    assert [(c.training.seq_len, c.training.max_steps, c.data.synthetic.share) for c in settings.values()] == \
        [(1024, 200, 0.25), (2048, 100, 0.5)]
    commands = [line for line in PAGE.read_text().splitlines() if line.startswith("accelerate launch ")]
    arms = {}
    for command in commands:
        argv = shlex.split(command.split("recipes/finetune.py ", 1)[1])
        argv[argv.index("--config") + 1] = str(ROOT / argv[argv.index("--config") + 1])
        cfg, _ = parse_args(argv)
        arms[cfg.output_dir.rsplit("/", 1)[-1]] = cfg
    assert {"code", "prose"} <= set(arms)
    for name, cfg in arms.items():
        arm, _, seed = name.partition("-seed")   # another training seed: `<arm>-seed<s>`
        assert arm in {"code", "prose", "code-2k", "prose-2k"}, name
        then = settings[SHIPPED if arm.endswith("-2k") else THEN]
        assert cfg.training.seed == int(seed or 0), name
        cfg = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, seed=then.training.seed))
        for section in ("model", "training", "pose", "lora"):
            assert getattr(cfg, section) == getattr(then, section), (arm, section)
        haystacks = ["training", "embedded:python-stdlib"] if arm.startswith("code") else then.data.synthetic.haystacks
        assert cfg.data == dataclasses.replace(then.data, synthetic=dataclasses.replace(then.data.synthetic,
                                                                                       haystacks=haystacks))


def shown_command(tmp_path, *argv: str) -> list[str]:
    """The hf-posext command `code_mix.py <argv>` runs (its `+` line), on a checkpoint folder that
    holds nothing, so hf-posext refuses it before any model loads (arm `code`, seed 7: a folder no
    stored result has)."""
    (tmp_path / "code-seed7" / "final").mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, str(SCRIPT), *argv, "--runs", str(tmp_path)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "the command above failed" in done.stderr.splitlines()[-1]
    line = next(line for line in done.stdout.splitlines() if line.startswith("+ "))
    return shlex.split(line[2:])


def test_another_task_asks_the_same_grid_in_its_own_folder(tmp_path):
    """`--task multi_key` changes the task hf-posext asks and the results folder, nothing else (read
    back through hf-posext's own parser, the command's consumer)."""
    from hf_posext.cli import build_parser
    for step in ("ask", "noise"):
        single, multi = (vars(build_parser().parse_args(shown_command(tmp_path, step, "code", "--seed", "7",
                                                                      "--task", task)[3:]))
                         for task in ("niah_single", "multi_key"))
        assert (single.pop("tasks"), multi.pop("tasks")) == ("niah_single", "multi_key")
        assert str(multi.pop("out")) == f"{single.pop('out')}-multi_key"
        assert single == multi
    assert not list((ROOT / "benchmarks" / "results" / "retrieval-code-mix").glob("code-seed7*"))


def test_a_task_with_a_step_that_asks_none_is_refused():
    done = subprocess.run([sys.executable, str(SCRIPT), "train", "code", "--task", "multi_key"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "--task multi_key: only `ask` and `noise` ask a task" in done.stderr
    assert "accelerate" not in done.stdout


def test_the_index_the_table_reads_names_every_stored_folder():
    """runs.json (written by `code_mix.py report`, read by the effective-length table) lists exactly
    the folders that hold rows: a run copied in without rerunning the report would be left out of
    the table, a folder removed would leave a stale entry."""
    folder = ROOT / "benchmarks" / "results" / "retrieval-code-mix"
    index = json.loads((folder / "runs.json").read_text())
    assert sorted(index) == sorted(p.parent.name for p in folder.glob("*/retrieval.json"))
    for name, run in index.items():
        assert run["commands"][-1].endswith(f"--out benchmarks/results/retrieval-code-mix/{name}"), name

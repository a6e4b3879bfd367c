"""Redraw a run's loss curve from its train_log.csv and config.json with the recipe's current
plotting code (hf_posext.training.outputs.plot_loss), e.g. the committed demo runs:

    python recipes/plot_loss.py benchmarks/results/recipes/cpu-smollm2-demo benchmarks/results/recipes/cpu-smollm2-demo-nopose
"""

import argparse
import json
from pathlib import Path


def parse(argv: list[str] | None = None) -> list[Path]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run folders (each with config.json and train_log.csv)")
    folders = p.parse_args(argv).runs
    for folder in folders:
        missing = [name for name in ("config.json", "train_log.csv") if not (folder / name).is_file()]
        if missing:
            p.error(f"{folder} is not a recipe run folder (no {' / '.join(missing)}): pass an output_dir "
                    "of recipes/finetune.py")
    return folders


def redraw(folder: Path) -> Path:
    from hf_posext.training.outputs import plot_loss, read_log
    from hf_posext.training.recipe import loss_title
    from hf_posext.training.recipe_config import config_from_dict

    cfg = config_from_dict(json.loads((folder / "config.json").read_text()))
    return plot_loss(folder / "loss_curve.png", read_log(folder / "train_log.csv"), loss_title(cfg))


if __name__ == "__main__":
    for folder in parse():
        print(redraw(folder))

"""Redraw a run's loss curve from its train_log.csv and config.json with the recipe's current
plotting code (hf_posext.training.outputs.plot_loss), e.g. the committed demo runs:

    python recipes/plot_loss.py benchmarks/results/recipes/cpu-smollm2-demo benchmarks/results/recipes/cpu-smollm2-demo-nopose
"""

import json
import sys
from pathlib import Path

from hf_posext.training.outputs import plot_loss, read_log
from hf_posext.training.recipe import loss_title
from hf_posext.training.recipe_config import config_from_dict


def redraw(folder: Path) -> Path:
    cfg = config_from_dict(json.loads((folder / "config.json").read_text()))
    return plot_loss(folder / "loss_curve.png", read_log(folder / "train_log.csv"), loss_title(cfg))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(redraw(Path(arg)))

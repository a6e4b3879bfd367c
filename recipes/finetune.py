"""Extend a Llama/Mistral model's context with hf_posext, fine-tune it at the longer length, save a
checkpoint that reloads with plain `AutoModelForCausalLM.from_pretrained`, then evaluate the
unpatched, the training-free and the fine-tuned model side by side across context lengths.

    accelerate launch --config_file recipes/accelerate/cpu.yaml recipes/finetune.py \\
        --config recipes/cpu-smollm2-demo.yaml [--training.max_steps 10] [--resume]

Every YAML key is also a flag, `--section.key value` (hf_posext/training/recipe_config.py). The
stages (setup, loop, save, evaluate) live in `hf_posext.training` (see recipe.py there); this file
is only the command line. SIGTERM/SIGINT: the current optimizer step finishes, the state is saved,
and the process exits with 128+signal; `--resume` continues exactly where it stopped.
"""

from __future__ import annotations

import signal
import sys
from typing import Callable

from hf_posext.training.recipe import end_process_group, run
from hf_posext.training.recipe_config import parse_args


def main(argv: list[str] | None = None, on_step: Callable[[int], None] | None = None) -> dict:
    cfg, resume = parse_args(argv)
    return run(cfg, resume=resume, on_step=on_step)


def stop_with_parent() -> None:
    """Ask Linux to send us SIGTERM when our parent dies. `accelerate launch` with one process
    does not forward SIGTERM to the training process (its simple launcher just waits), so `kill
    <launcher pid>` would otherwise leave training running orphaned; with this, the launcher's death
    reaches the recipe's signal handler, which saves the state and exits. No-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def cli(argv: list[str] | None = None) -> int:
    """The script's entry: every hf_posext error (and a bad value) is one line on stderr, exit 2
    for a bad configuration, 1 for a run that could not continue (diverged, damaged checkpoint);
    `--debug` shows the traceback."""
    from hf_posext.errors import PosextError, exit_status, one_line
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        main(argv)
        return 0
    except (PosextError, ValueError, TypeError, OSError) as err:
        if debug:
            raise
        sys.stderr.write(one_line("finetune.py", err))
        return exit_status(err)
    finally:
        end_process_group()


if __name__ == "__main__":
    stop_with_parent()
    sys.exit(cli())

"""Runs under `accelerate launch --config_file recipes/accelerate/cpu-ddp.yaml` for
tests/test_distributed.py: several recipe runs in the same ranks (one launch, to keep the test
fast), each given as a JSON job list in argv[1]:

    [{"argv": [...recipe flags...], "kill_rank0_at": 3 | null}, ...]

Each rank writes argv[2]/rank<r>.json: the world size it saw, per job the (global indices,
sequence rows) of every micro-batch, the exit code, and every file it wrote: Python-level opens
for writing (a `sys.addaudithook` on "open") and the tensor writers that bypass Python's open
(torch.save's zip writer, safetensors' save_file, as called by accelerate and transformers).
"""

import json
import os
import signal
import sys
from pathlib import Path

from hf_posext.training.recipe import end_process_group, run
from hf_posext.training.recipe_config import parse_args


def record_tensor_writes(writes: list) -> None:
    import accelerate.utils.other as acc_other
    import torch
    import transformers.modeling_utils as tf_modeling

    def wrap(fn, path_arg):
        def recorded(*args, **kwargs):
            target = args[path_arg] if len(args) > path_arg else kwargs.get("f") or kwargs.get("filename")
            if isinstance(target, (str, os.PathLike)):
                writes.append(os.fspath(target))
            return fn(*args, **kwargs)
        return recorded

    torch.save = wrap(torch.save, 1)
    acc_other.safe_save_file = wrap(acc_other.safe_save_file, 1)
    tf_modeling.safe_save_file = wrap(tf_modeling.safe_save_file, 1)


def main() -> None:
    jobs, report_dir = json.loads(sys.argv[1]), Path(sys.argv[2])
    writes: list[str] = []

    def audit(event, args):
        # builtin open: (path, mode string, flags); os.open: (path, None, flags) — the results
        # store creates its files with os.open (O_EXCL | O_NOFOLLOW: never through a link)
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        mode, flags = args[1], args[2]
        if (any(c in mode for c in "wax+") if isinstance(mode, str)
                else isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR)):
            writes.append(os.fsdecode(args[0]))

    sys.addaudithook(audit)
    record_tensor_writes(writes)
    rank = int(os.environ["RANK"])
    report = {"rank": rank, "world_size_env": int(os.environ["WORLD_SIZE"]), "jobs": []}
    for job in jobs:
        cfg, resume = parse_args(job["argv"])
        batches, kill = [], job.get("kill_rank0_at")

        def on_step(step, kill=kill):
            if kill is not None and rank == 0 and step == kill:
                os.kill(os.getpid(), signal.SIGTERM)      # only rank 0 gets the signal

        try:
            result = run(cfg, resume=resume, on_step=on_step, on_batch=lambda i, r, batches=batches: batches.append([i, r]))
            code, world = 0, result.get("world_size")
        except SystemExit as stop:
            code, world = stop.code, None
        report["jobs"].append({"batches": batches, "code": code, "world_size": world})
    report["writes"] = writes
    (report_dir / f"rank{rank}.json").write_text(json.dumps(report))
    end_process_group()


if __name__ == "__main__":
    main()

"""Several processes, one grid: under `torchrun` / `accelerate launch` each rank computes a share
of the cells and rank 0 gathers the rows and writes the one results file.

Built on accelerate's `PartialState` (process group from the launcher's environment: gloo on
CPU, NCCL on GPUs), `gather_object` and `broadcast_object_list`. A single process (no
`WORLD_SIZE` > 1 in the environment) never touches torch.distributed.
"""

from __future__ import annotations

import os
from typing import Any, Sequence


class Ranks:
    """This process's place among the launched ones."""

    def __init__(self):
        self.state = None
        self.rank, self.size = 0, 1
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            import torch
            from accelerate import PartialState
            # PartialState only forms a CPU (gloo) group when told `cpu=True`; Accelerator reads
            # ACCELERATE_USE_CPU for that, and so do we (and on a machine without CUDA).
            cpu = os.environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes") \
                or not torch.cuda.is_available()
            self.state = PartialState(cpu=cpu)
            self.rank, self.size = self.state.process_index, self.state.num_processes

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self):
        """The device this rank should use (its own GPU under a multi-GPU launch)."""
        return self.state.device if self.state is not None else None

    def gather(self, obj: Any) -> list:
        """`obj` of every rank, in rank order (on every rank)."""
        if self.size == 1:
            return [obj]
        from accelerate.utils import gather_object
        return gather_object([obj])

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank."""
        if self.size == 1:
            return obj
        from accelerate.utils import broadcast_object_list
        return broadcast_object_list([obj], from_process=0)[0]

    def assign(self, costs: Sequence[float]) -> list[int]:
        """The rank of each job: longest first to the least loaded rank (deterministic, so
        every rank computes the same assignment)."""
        load, owner = [0.0] * self.size, [0] * len(costs)
        for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
            r = min(range(self.size), key=lambda r: (load[r], r))
            owner[i], load[r] = r, load[r] + costs[i]
        return owner

    def run_first(self, fn, *args, **kwargs):
        """Run `fn` on rank 0 only; its error, if any, is raised on every rank (so no rank
        waits for one that stopped). Returns fn's result on rank 0, None elsewhere."""
        result, error = None, None
        if self.is_main:
            try:
                result = fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - re-raised on every rank below
                error = err
        error = self.broadcast(error)
        if error is not None:
            raise error
        return result

    def check_all(self, error: BaseException | None) -> None:
        """Raise on every rank the first error any rank met (call on every rank)."""
        errors = [e for e in self.gather(error) if e is not None]
        if errors:
            raise errors[0]

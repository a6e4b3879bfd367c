"""Stage 2 of the recipe: the training loop.

Which examples a rank sees is a pure function of (seed, optimizer step, micro-batch, rank): global
example `i` is sequence `epoch_order(epoch)[i % n]` of epoch `i // n`, and one optimizer step takes
the next `world x batch_size x accumulation` global indices, rank r taking batch r of each group.
So 2 ranks x batch b see exactly the examples 1 rank x batch 2b sees, every sequence is used once
per epoch across ranks, and a resumed run replays what an uninterrupted one would (nothing but the
step count needs saving). Accumulation is `accelerator.accumulate` (no DDP sync until the last
micro-batch; `accelerator.backward` divides by the number of micro-batches).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
import time
from typing import Callable

import torch

from ..errors import TrainingDiverged
from .accel import context_parallel, data_parallel_rank, full_gradients
from .checkpoint import save_checkpoint
from .loss import training_loss
from .data import epoch_order
from .optim import grad_norm
from .pose import span_of

LOG_COLUMNS = ["step", "loss", "lr", "grad_norm", "grad_norm_clipped", "tokens", "tokens_per_s",
               "memory_mb", "elapsed_s"]
# Columns that must match between an interrupted-and-resumed run and an uninterrupted one.
DETERMINISTIC_COLUMNS = ["step", "loss", "lr", "grad_norm", "grad_norm_clipped", "tokens"]


class TrainState:
    """Steps done and the log rows so far; saved as JSON by `checkpoint.save_checkpoint` so a resumed run
    continues the same loss curve."""

    def __init__(self):
        self.step = 0
        self.rows: list[dict] = []

    def state_dict(self) -> dict:
        return {"step": self.step, "rows": self.rows}

    def load_state_dict(self, sd: dict) -> None:
        self.step, self.rows = int(sd["step"]), list(sd["rows"])


class StopSignal:
    """SIGTERM/SIGINT ask the loop to stop at the next optimizer-step boundary (state saved);
    a second signal exits at once."""

    def __init__(self):
        self.signum: int | None = None
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.signum = signum
        print(f"\nsignal {signal.Signals(signum).name}: finishing this step, saving state, exiting "
              "(send again to exit at once)", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        return False


def example_indices(step: int, micro: int, rank: int, world: int, batch_size: int,
                    accumulation: int) -> list[int]:
    """Global example indices of one rank's micro-batch (see the module docstring)."""
    first = ((step * accumulation + micro) * world + rank) * batch_size
    return list(range(first, first + batch_size))


class ExampleOrder:
    """Global example index -> packed sequence index, reshuffled every epoch."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self._orders = n, seed, {}

    def __call__(self, index: int) -> int:
        epoch, pos = divmod(index, self.n)
        if epoch not in self._orders:
            self._orders = {epoch: epoch_order(self.n, self.seed, epoch)}   # keep one epoch
        return self._orders[epoch][pos]


def synthetic_read(sequences, seed: int, examples: int) -> int:
    """How many of the first `examples` global examples the loop reads (in ExampleOrder) are
    synthetic: `data.synthetic.share` is a share of the windows, and a run shorter than an epoch
    draws its own count from them."""
    if "answer_start" not in sequences.column_names:
        return 0
    synthetic = {i for i, start in enumerate(sequences.with_format(None)["answer_start"]) if start >= 0}
    # every whole epoch reads each window once; only the last, partial one depends on the order
    epochs, rest = divmod(examples, len(sequences))
    return epochs * len(synthetic) + sum(r in synthetic for r in epoch_order(len(sequences), seed, epochs)[:rest])


def memory_mb(device) -> float:
    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def stop_requested(accelerator, stop: StopSignal) -> int:
    """The signal any rank received (0 if none): ranks must stop at the same step, or the next
    collective (save_state, the gradient all-reduce) would hang."""
    mine = stop.signum or 0
    if accelerator.num_processes == 1:
        return mine
    flag = torch.tensor([mine], device=accelerator.device)
    return int(accelerator.reduce(flag, "max").item())


def sequence_parallel(accelerator, batch: dict, enabled: bool):
    """Context parallelism (accelerate's `maybe_context_parallel`, FSDP2 + torch ring attention):
    each rank of a CP group keeps 1/cp of the sequence. The labels are shifted here, before the
    split (transformers' loss would shift inside each shard and lose the tokens at the shard
    boundaries), and the attention mask is dropped (torch's CP attention is causal-only; plain
    0..n-1 positions need no mask). Not run on this CPU machine: see recipes/README.md."""
    if not enabled:
        return contextlib.nullcontext()
    labels = batch.pop("labels")
    batch.pop("attention_mask", None)
    batch["shift_labels"] = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)   # [b, n]
    buffers = [batch["input_ids"], batch["shift_labels"], batch["position_ids"]]
    return accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1],
                                              no_restore_buffers=set(buffers))


def global_tokens(accelerator, local: int, world: int) -> int:
    """Tokens of a step over the data-parallel ranks: the sum over all processes, divided by the
    ranks that share each batch (a context-parallel group reads one batch)."""
    if accelerator.num_processes == 1:
        return local
    total = accelerator.reduce(torch.tensor([local], device=accelerator.device), "sum").item()
    return int(total) * world // accelerator.num_processes


def finite_or_stop(accelerator, model, loss_value: float, step: int) -> None:
    """Raise TrainingDiverged (on every rank at once: the flag is reduced) when the loss or any
    weight is non-finite, so no NaN/inf weights are ever checkpointed or saved. The weights are
    checked too because a step can turn them to inf while its own loss (computed before the
    update) was still finite."""
    bad = not torch.isfinite(torch.tensor(loss_value)) or any(
        not torch.isfinite(p).all() for p in model.parameters())
    flag = accelerator.reduce(torch.tensor(float(bad), device=accelerator.device), "sum")
    if flag.item() > 0:
        raise TrainingDiverged(f"training diverged at step {step} (loss {loss_value:g}, or non-finite "
                               "weights); nothing of this step was saved, the last good checkpoint is "
                               "kept: lower training.learning_rate (or raise warmup_steps) and rerun "
                               "with --resume, or start a new output_dir.")


def train_loop(accelerator, model, optimizer, scheduler, sequences, collator, t, state: TrainState,
               output_dir,
               on_row: Callable[[dict], None] = lambda row: None,
               on_step: Callable[[int], None] | None = None,
               on_batch: Callable[[list[int], list[int]], None] | None = None) -> int:
    """Train from `state.step` to `t.max_steps` (a TrainingConfig `t`); checkpoint every
    `t.save_every` steps, at the end and on a signal. Returns 0, or 128+signal when stopped.
    `on_row(row)` receives each log row; `on_step(step)` runs after each optimizer step and
    `on_batch(indices, rows)` before each micro-batch with its global example indices and
    the packed sequences they select (tests use them)."""
    from tqdm.auto import tqdm

    (rank, world), accum = data_parallel_rank(accelerator), t.gradient_accumulation_steps
    split_sequence = context_parallel(accelerator)
    order = ExampleOrder(len(sequences), t.seed)
    tokens_before = state.rows[-1]["tokens"] if state.rows else 0
    bar = tqdm(total=t.max_steps, initial=state.step, desc="fine-tune",
               disable=not accelerator.is_local_main_process)
    elapsed_before = state.rows[-1]["elapsed_s"] if state.rows else 0.0
    start = time.time()
    with StopSignal() as stop:
        while state.step < t.max_steps:
            step_start, losses, pre, post, step_tokens = time.time(), [], None, float("nan"), 0
            for micro in range(accum):
                indices = example_indices(state.step, micro, rank, world, t.batch_size, accum)
                rows = [order(i) for i in indices]
                if on_batch is not None:
                    on_batch(indices, rows)
                examples = [sequences[r] for r in rows]   # synthetic examples carry their spans
                batch = collator([e["input_ids"] for e in examples], indices, [span_of(e) for e in examples])
                step_tokens += batch["input_ids"].numel()   # this rank's; rows may be shorter than seq_len
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                with accelerator.accumulate(model), sequence_parallel(accelerator, batch, split_sequence):
                    loss = training_loss(model, batch, t.loss_chunk)   # mean over this micro-batch
                    accelerator.backward(loss)
                    losses.append(loss.detach())
                    if accelerator.sync_gradients:               # the last micro-batch
                        pre = accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
                        if full_gradients(accelerator):
                            post = grad_norm(model.parameters())
                        lr = scheduler.get_last_lr()[0]
                        optimizer.step()
                        scheduler.step()
                        optimizer.zero_grad(set_to_none=True)
            loss_value = accelerator.reduce(torch.stack(losses).mean(), "mean").item()
            step_tokens = global_tokens(accelerator, step_tokens, world)
            finite_or_stop(accelerator, model, loss_value, state.step + 1)
            state.step += 1
            now = time.time()
            row = {"step": state.step, "loss": loss_value, "lr": lr,
                   "grad_norm": float(pre) if pre is not None else float("nan"),
                   "grad_norm_clipped": post, "tokens": tokens_before + step_tokens,
                   "tokens_per_s": step_tokens / max(now - step_start, 1e-9),
                   "memory_mb": memory_mb(accelerator.device), "elapsed_s": elapsed_before + now - start}
            state.rows.append(row)
            tokens_before += step_tokens
            accelerator.log({k: v for k, v in row.items() if k != "step"}, step=state.step)
            on_row(row)
            bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}", tok_s=f"{row['tokens_per_s']:.0f}")
            bar.update(1)
            if on_step is not None:
                on_step(state.step)
            signum = stop_requested(accelerator, stop)
            if state.step % t.save_every == 0 or signum or state.step == t.max_steps:
                save_checkpoint(accelerator, state, scheduler, output_dir, t.keep_checkpoints)
            if signum:
                bar.close()
                return 128 + signum
    bar.close()
    return 0

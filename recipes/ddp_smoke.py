"""Smoke test of multi-process training on the CPU: a tiny random Llama built on the fly, a few
optimizer steps through the recipe's own loop (hf_posext.training.loop), every rank printing the
world size it saw.

    accelerate launch --config_file recipes/accelerate/cpu-ddp.yaml recipes/ddp_smoke.py   # make ddp-smoke

Its checkpoints go to a temporary folder, removed at the end. tests/test_make_targets.py runs
`make ddp-smoke` itself, so a change of the loop's signature breaks CI, not the README.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch


def main(steps: int = 3) -> None:
    import datasets
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posext.training.accel import make_accelerator
    from hf_posext.training.loop import TrainState, train_loop
    from hf_posext.training.optim import build_optimizer, build_scheduler
    from hf_posext.training.pose import PoseCollator
    from hf_posext.training.recipe_config import TrainingConfig

    t = TrainingConfig(seq_len=32, batch_size=2, max_steps=steps, warmup_steps=1, learning_rate=1e-3,
                       save_every=1000, mixed_precision="no", gradient_checkpointing=False)
    with tempfile.TemporaryDirectory() as out:
        accelerator = make_accelerator(t, out)
        torch.manual_seed(0)   # the same random weights on every rank (DDP also broadcasts rank 0's)
        model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                             max_position_embeddings=64))
        ids = torch.randint(3, 128, (16, t.seq_len), generator=torch.Generator().manual_seed(1))
        sequences = datasets.Dataset.from_dict({"input_ids": ids.tolist()}).with_format("torch")
        optimizer = build_optimizer(model.parameters(), t.learning_rate, (t.adam_betas[0], t.adam_betas[1]), t.weight_decay)
        scheduler = build_scheduler(optimizer, t.lr_schedule, t.warmup_steps, t.max_steps)
        model, optimizer = accelerator.prepare(model.train(), optimizer)
        losses = []
        train_loop(accelerator, model, optimizer, scheduler, sequences, PoseCollator(t.seq_len, 64, 2, t.seed),
                   t, TrainState(), out, on_row=lambda row: losses.append(round(row["loss"], 4)))
        line = (f"rank {accelerator.process_index}: world size {accelerator.num_processes} "
                f"({accelerator.distributed_type}, backend {accelerator.state.backend}); losses {losses}\n")
        # The ranks share one stdout pipe: print() may issue the text and its newline as two writes
        # (unbuffered under PYTHONUNBUFFERED), so two ranks' lines could interleave. One os.write of
        # the whole line (< PIPE_BUF, atomic on a pipe), one rank at a time, keeps each line whole.
        for rank in range(accelerator.num_processes):
            if rank == accelerator.process_index:
                sys.stdout.flush()
                os.write(sys.stdout.fileno(), line.encode())
            accelerator.wait_for_everyone()
        accelerator.end_training()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Run it under accelerate launch (see above); alone it trains one rank.")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    return args


if __name__ == "__main__":
    main(parse().steps)

"""Stage 1a of the recipe: the `accelerate.Accelerator` and the checks that must pass before any
data or weights load.

- Checkpoints: named, rotated and written atomically by `checkpoint.save_checkpoint` (not
  accelerate's automatic naming, which writes in place).
- CPU ranks: accelerate only runs several CPU processes over gloo when told it is on the CPU
  (`Accelerator(cpu=True)` or ACCELERATE_USE_CPU); otherwise each rank started by torchrun on a
  machine without GPUs silently becomes its own single-process run (`DistributedType.NO`), all
  writing the same files. So the recipe asks for the CPU when no accelerator device exists, and
  refuses a launch whose WORLD_SIZE accelerate did not join (see recipes/README.md, "Distributed").
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import ConfigError
from .checkpoint import checkpoints

def has_accelerator_device() -> bool:
    acc = getattr(torch, "accelerator", None)           # torch >= 2.6: CUDA, XPU, MPS, ...
    if acc is not None and hasattr(acc, "is_available"):
        return bool(acc.is_available())
    return torch.cuda.is_available()


def resolve_mixed_precision(setting: str) -> str:
    if setting != "auto":
        return setting
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "no"   # CPU: fp32 (bf16 autocast on CPU is slow and imprecise for RoPE angles)


def make_accelerator(t, output_dir: str | Path, lora: bool = False, pose: bool = False):
    """The Accelerator for a TrainingConfig `t`; raises before training on unsupported setups."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, ProjectConfiguration

    # Naming, rotation and atomic renames are checkpoint.save_checkpoint's (accelerate writes in place).
    project = ProjectConfiguration(project_dir=str(output_dir))
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision(t.mixed_precision),
                              gradient_accumulation_steps=t.gradient_accumulation_steps,
                              log_with=t.log_with, project_config=project,
                              cpu=not has_accelerator_device())
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise RuntimeError(f"The launcher started {launched} processes but accelerate joined "
                           f"{accelerator.num_processes}: each would train alone and overwrite the "
                           "others' files. See recipes/README.md, 'Distributed'.")
    kind = accelerator.distributed_type
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and kind != DistributedType.FSDP:
        # accelerate/state.py (AcceleratorState.__init__) switches to FSDP only from the
        # MULTI_<device> types (MULTI_GPU, MULTI_XPU, ...), never from MULTI_CPU: on the CPU an
        # FSDP config would silently train as plain DDP.
        raise ValueError(f"An FSDP config was launched but accelerate set up {kind}: accelerate runs "
                         "FSDP only on GPUs/accelerators, not on CPU processes. Use "
                         "recipes/accelerate/cpu-ddp.yaml on the CPU.")
    if context_parallel(accelerator) and pose:
        raise ValueError("pose.enabled with context parallelism is not supported: torch's context "
                         "parallel attention is causal-only, and transformers turns PoSE's position "
                         "jumps without an attention mask into packed-sequence masks. Train full-length "
                         "sequences (pose.enabled false) with recipes/accelerate/fsdp2-context-parallel.yaml.")
    if lora and kind in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise ValueError("lora.enabled with FSDP/DeepSpeed is not supported: merging the adapter at "
                         "save time needs the whole model on one device. Use LoRA with one GPU or "
                         "DDP (recipes/accelerate/single-gpu.yaml, multi-gpu.yaml).")
    if kind == DistributedType.DEEPSPEED:   # DeepSpeed clips and accumulates itself
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        if float(ds.get("gradient_clipping", 0.0)) != float(t.max_grad_norm):
            raise ValueError(f"DeepSpeed gradient_clipping={ds.get('gradient_clipping')} differs from "
                             f"training.max_grad_norm={t.max_grad_norm}; set them equal.")
        if int(ds.get("gradient_accumulation_steps", 1)) != t.gradient_accumulation_steps:
            raise ValueError(f"DeepSpeed gradient_accumulation_steps={ds.get('gradient_accumulation_steps')}"
                             f" differs from training.gradient_accumulation_steps="
                             f"{t.gradient_accumulation_steps}; set them equal.")
    return accelerator


def context_parallel(accelerator) -> bool:
    """Whether the sequence of each batch is split across ranks (accelerate's ParallelismConfig
    with cp_size > 1, torch backend, FSDP2)."""
    pc = getattr(accelerator, "parallelism_config", None)
    return bool(pc is not None and pc.cp_enabled)


def data_parallel_rank(accelerator) -> tuple[int, int]:
    """(rank, number of ranks) among the ranks that receive different batches. Ranks of one
    context-parallel (or tensor-parallel) group share a batch; the mapping is the one accelerate's
    own `prepare_data_loader` uses (accelerate/data_loader.py): rank // (tp x cp), over
    dp_replicate x dp_shard ranks."""
    mesh = getattr(accelerator, "torch_device_mesh", None)
    if mesh is None:
        return accelerator.process_index, accelerator.num_processes
    size = lambda name: mesh[name].size() if name in mesh.mesh_dim_names else 1
    return (accelerator.process_index // (size("tp") * size("cp")),
            size("dp_replicate") * size("dp_shard"))


def full_gradients(accelerator) -> bool:
    """Whether this rank's gradients are the whole model's: DDP holds full gradients on every
    rank; FSDP and DeepSpeed hold shards, so a local norm would be wrong."""
    from accelerate.utils import DistributedType
    return accelerator.distributed_type in (DistributedType.NO, DistributedType.MULTI_CPU,
                                            DistributedType.MULTI_GPU)


def resume_path(output_dir: str | Path, resume: str | None) -> Path | None:
    """The checkpoint to resume from (None for a new run); refuses to overwrite a started run."""
    found = checkpoints(output_dir)
    if not resume:
        if found:   # every rank checks, so none is left waiting
            raise ConfigError(f"{Path(output_dir) / 'checkpoints'} already holds checkpoints: pass "
                                  "--resume to continue, or choose a new output_dir.")
        return None
    path = found[-1] if resume == "latest" and found else Path(resume) if resume != "latest" else None
    if path is None or not path.exists():
        raise ConfigError(f"--resume: no checkpoint found in {Path(output_dir) / 'checkpoints'}")
    return path

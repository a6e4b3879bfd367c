"""Stage 3 of the recipe: what a run leaves in `output_dir` — the loss log and its plot, and the
final model that reloads with plain `AutoModelForCausalLM.from_pretrained` (rope config inside).
Only the main process writes."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from ..adapters import is_extended, save_adapter
from ..rope.compat import checkpointing, text_config
from .loop import LOG_COLUMNS

TRAILING = 10   # steps in the trailing mean of the loss plot (one-window losses are noisy)


def write_log(path: Path, rows: Sequence[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=LOG_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def append_log(path: Path, row: dict) -> None:
    with open(path, "a", newline="") as fh:
        csv.DictWriter(fh, fieldnames=LOG_COLUMNS).writerow(row)


def read_log(path: Path) -> list[dict]:
    with open(path) as fh:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]


def trailing_mean(values: Sequence[float], k: int) -> list[float]:
    return [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1])
            for i in range(len(values))]


def plot_loss(path: Path, rows: Sequence[dict], title: str = "") -> Path:
    """Training loss per optimizer step and its trailing mean (`recipes/plot_loss.py` redraws a
    committed `train_log.csv` with this same function)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.2, 4.0))
    steps, losses = [int(r["step"]) for r in rows], [float(r["loss"]) for r in rows]
    k = min(TRAILING, len(losses))
    ax.plot(steps, losses, marker=".", alpha=0.45, label="loss of each optimizer step")
    ax.plot(steps, trailing_mean(losses, k), linewidth=2, label=f"trailing mean of {k} steps")
    ax.set_title(title or "Fine-tuning loss", fontsize=10)
    ax.legend()
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (mean token NLL)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def save_lora_model(peft_model, final_dir: Path):
    """The one place a LoRA run's weights are saved. The adapter goes to `final_dir/adapter` with
    `hf_posext.save_adapter`, so PEFT's one-liners (`AutoPeftModelForCausalLM.from_pretrained`)
    reload it on the *extended* base; then the adapter is merged into the base weights and saved
    as a plain transformers checkpoint in `final_dir`. Returns the merged model."""
    if is_extended(text_config(peft_model.get_base_model().config)):
        save_adapter(peft_model, final_dir / "adapter")
    else:  # an unextended base: peft's own save already reloads it as trained
        peft_model.save_pretrained(final_dir / "adapter")
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(final_dir)
    return merged


def save_final(accelerator, model, tokenizer, final_dir: Path, lora: bool, gradient_checkpointing: bool):
    """Save the trained model (gathering FSDP / ZeRO-3 shards first: every rank must call this) and
    the tokenizer into `final_dir` on the main process; returns the unwrapped model there, else None."""
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)    # a collective under FSDP / ZeRO-3
    if not accelerator.is_main_process:
        return None
    unwrapped = accelerator.unwrap_model(model)
    if gradient_checkpointing:
        checkpointing(unwrapped, False)
        unwrapped.config.use_cache = True
    unwrapped.eval()
    if lora:
        unwrapped = save_lora_model(unwrapped, final_dir)
    else:
        unwrapped.save_pretrained(final_dir, state_dict=state_dict, save_function=accelerator.save)
    tokenizer.save_pretrained(final_dir)
    return unwrapped

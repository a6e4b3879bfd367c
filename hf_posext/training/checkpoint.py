"""The recipe's checkpoints: written atomically, and resumed without unpickling anything that can
run code.

Why not accelerate's own rotation and custom objects:
- `accelerator.register_for_checkpointing(obj)` saves `custom_checkpoint_<i>.pkl`, and
  `load_state` reads it back with `torch.load(weights_only=False)` (accelerate/checkpointing.py,
  `load_custom_state`): code placed in that file runs on `--resume`. The recipe registers no
  custom object; its own state (step, log rows, the LR scheduler's counters) goes to
  `recipe_state.json`, which cannot execute.
- accelerate writes `checkpoints/checkpoint_<i>` in place; a crash or a full disk mid-save leaves
  a half folder that the next `--resume latest` picks. Here each save goes to a `.partial_*`
  folder, gets a manifest (sha256 of every file written), and is renamed only when complete.
- What accelerate still reads on resume (installed 1.15: `load_accelerator_state`): the model
  from `model.safetensors`, the optimizer `optimizer.bin`, the RNG `random_states_<rank>.pkl`,
  all through `accelerate.utils.load`, which defaults to `torch.load(weights_only=True)` (a
  restricted unpickler that refuses arbitrary globals); `load_checkpoint` also passes
  `weights_only=True` explicitly. Before that, `verify_checkpoint` refuses a folder whose files
  are not exactly those the manifest lists with those hashes, so a planted pickle never reaches
  torch at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from ..errors import CheckpointError

MANIFEST = "manifest.json"
STATE = "recipe_state.json"
_NAME = re.compile(r"checkpoint_(\d+)")


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (by number, as accelerate sorts them); `.partial_*`
    folders of an interrupted save are not checkpoints."""
    root = Path(output_dir) / "checkpoints"
    found = [(int(m.group(1)), p) for p in root.glob("checkpoint_*")
             if (m := _NAME.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())



def save_checkpoint(accelerator, state, scheduler, output_dir: str | Path, keep: int) -> Path:
    """Every rank calls this (accelerate's save is collective under FSDP/DeepSpeed). Returns the
    new `checkpoints/checkpoint_<i>`; older ones beyond `keep` are removed only after it is
    complete, so the last good checkpoint survives any failure here."""
    root = Path(output_dir) / "checkpoints"
    done = checkpoints(output_dir)
    index = int(_NAME.fullmatch(done[-1].name).group(1)) + 1 if done else 0
    final, tmp = root / f"checkpoint_{index}", root / f".partial_checkpoint_{index}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".partial_checkpoint_*"):   # left by a save that was killed
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (tmp / STATE).write_text(json.dumps({"train": state.state_dict(),
                                                 "scheduler": scheduler.state_dict()}))
            manifest = {name: _sha256(tmp / name) for name in _files(tmp)}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
            os.replace(tmp, final)
            for old in checkpoints(output_dir)[:-keep] if keep > 0 else []:
                shutil.rmtree(old)
    except BaseException:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    accelerator.wait_for_everyone()
    return final


def verify_checkpoint(path: Path) -> dict:
    """Refuse a checkpoint folder the recipe did not write exactly as it is (one-line
    CheckpointError naming the file and what to do); returns its recipe state."""
    fix = f"delete {path} and resume from an earlier checkpoint, or start a new output_dir"
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path} has no {MANIFEST}: it was not written by this recipe (or by an "
                              f"older version whose checkpoints load pickles); {fix}.")
    try:
        manifest = json.loads(manifest_path.read_text())
        assert isinstance(manifest, dict)
    except (ValueError, AssertionError, UnicodeDecodeError):
        raise CheckpointError(f"{manifest_path} is corrupted (not a JSON object); {fix}.") from None
    present = set(_files(path)) - {MANIFEST}
    extra, missing = sorted(present - set(manifest)), sorted(set(manifest) - present)
    if extra:
        raise CheckpointError(f"{path} holds files the recipe did not write ({', '.join(extra[:3])}); "
                              f"they are not loaded (a pickle could run code): {fix}.")
    if missing:
        raise CheckpointError(f"{path} is missing {', '.join(missing[:3])}; {fix}.")
    changed = [n for n in sorted(manifest) if _sha256(path / n) != manifest[n]]
    if changed:
        raise CheckpointError(f"{path}: {', '.join(changed[:3])} changed since the recipe wrote it "
                              f"(hash differs); {fix}.")
    try:
        return json.loads((path / STATE).read_text())
    except ValueError:
        raise CheckpointError(f"{path / STATE} is corrupted; {fix}.") from None


def load_checkpoint(accelerator, state, scheduler, path: Path, saved: dict | None = None) -> None:
    """`accelerator.load_state` with `weights_only=True`, then the recipe's JSON state `saved`
    (verify_checkpoint's, which `run` calls before the model loads; verified here when None).
    A file accelerate cannot read (truncated optimizer, ...) is one CheckpointError."""
    saved = verify_checkpoint(path) if saved is None else saved
    try:
        accelerator.load_state(str(path), load_kwargs={"weights_only": True})
    except Exception as err:   # torch/safetensors raise many types for a damaged file
        raise CheckpointError(f"{path} could not be loaded ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); delete it and resume "
                              "from an earlier checkpoint, or start a new output_dir.") from err
    state.load_state_dict(saved["train"])
    scheduler.load_state_dict(saved["scheduler"])

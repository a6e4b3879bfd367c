"""The fine-tuning recipe as library stages (torchtune style: `recipes/finetune.py` is only the
command line around `run`):

1. setup    `accel.make_accelerator`, `prepare_data` (documents, hold-out, `packing`), `model`
2. loop     `loop.train_loop`
3. save     `outputs.save_final`, the log and the loss plot (main process only)
4. evaluate `recipe_eval.evaluate_recipe` (main process only)
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..data.embedded import load_tokenizer
from ..errors import ConfigError
from ..evaluation.lm_head import check_lm_head
from ..evaluation.shared.data import TokenCache, select_documents
from . import data as datalib
from .accel import data_parallel_rank, make_accelerator, resume_path
from .checkpoint import load_checkpoint, verify_checkpoint
from .loop import TrainState, synthetic_read, train_loop
from .model import build_collator, check_window_fits_target, load_recipe_model, prepare_for_training, special_id
from .optim import build_optimizer, build_scheduler
from .outputs import append_log, plot_loss, save_final, write_log
from .packing import packed_sequences
from .recipe_eval import evaluate_recipe
from .synthetic import TRAINING_HAYSTACK, check_formats_fit, example_window, mix_synthetic

# Sections whose change would make a resumed run a different run.
_RESUME_SECTIONS = ("model", "data", "pose", "lora")
# loss_chunk changes where the logits live, not the loss: a run may resume with another value
_RESUME_TRAINING_FREE = {"max_steps", "save_every", "keep_checkpoints", "log_with", "loss_chunk"}


@dataclass
class PreparedData:
    sequences: object                  # datasets.Dataset, column input_ids [seq_len]
    train_names: list
    eval_names: list
    eval_ids: list                     # token ids of the held-out documents used for evaluation


def prepare_data(cfg, tokenizer, accelerator=None, log: Callable[[str], None] = print) -> PreparedData:
    """Load, split, tokenize and pack; every data problem surfaces here, before the model loads."""
    d, t = cfg.data, cfg.training
    docs = datalib.recipe_documents(d)
    train_docs, eval_docs = datalib.split_holdout(docs, d.eval_documents)
    bos, eos = special_id(tokenizer, d.bos_token, "bos"), special_id(tokenizer, d.eos_token, "eos")
    first = accelerator.main_process_first() if accelerator is not None else contextlib.nullcontext()
    sc, chunks = d.synthetic, cfg.pose.num_chunks if cfg.pose.enabled else 1
    if sc.share > 0:   # before tokenizing: a format that cannot fit, a source that cannot load, fail at once
        check_formats_fit(tokenizer, sc.formats, example_window(sc, t.seq_len), chunks, sc.distractors)
        hay_docs = datalib.haystack_documents(sc.haystacks, eval_docs, TRAINING_HAYSTACK)
    with first:   # rank 0 tokenizes and writes the cache; the others read it
        sequences, train_names = packed_sequences(train_docs, tokenizer, t.seq_len, bos, eos)
        if sc.share > 0:
            hays = {name: packed_sequences(docs, tokenizer, t.seq_len, bos, eos)[0] for name, docs in hay_docs.items()}
            sequences = mix_synthetic(sequences, tokenizer, sc, seed=t.seed, num_chunks=chunks, haystacks=hays)
            log(f"data: {round(sc.share * len(sequences))} of {len(sequences)} windows made synthetic "
                f"long-range examples of {example_window(sc, t.seq_len)} tokens ({', '.join(sc.formats)}; "
                f"in {', '.join(sc.haystacks)}; loss on the {sc.loss})")
    eval_names, eval_ids = [], []
    if cfg.eval.enabled:
        # The evaluation's own selection (the CLI's): the first eval.max_documents held-out
        # documents with at least max(lengths) tokens, tokenised through its on-disk cache.
        chosen = select_documents(eval_docs, TokenCache(tokenizer), max(cfg.eval.lengths),
                                  cfg.eval.max_documents)
        eval_names, eval_ids = chosen.names, chosen.docs
    log(f"data: {len(train_names)} training documents -> {len(sequences)} sequences of {t.seq_len} "
        f"tokens; held out for evaluation: {[x.name for x in eval_docs]}")
    return PreparedData(sequences, train_names, eval_names, eval_ids)


def check_resume_config(saved: dict, cfg) -> None:
    now = cfg.to_dict()
    diffs = [s for s in _RESUME_SECTIONS if saved.get(s) != now[s]]
    diffs += [f"training.{k}" for k in now["training"]
              if k not in _RESUME_TRAINING_FREE and saved.get("training", {}).get(k) != now["training"][k]]
    if diffs:
        raise ValueError(f"--resume with a different config: {diffs} changed since the run started. "
                         "Resume with the same config, or start a new output_dir.")


def check_output_dir(out: Path) -> None:
    """output_dir must be (or become) a folder: refused before anything loads if it, or the
    nearest existing folder above it, is a file, or a link on the way points nowhere (creating
    the folder would fail only after the data is packed and the model loaded)."""
    dangling = next((p for p in (out, *out.parents) if p.is_symlink() and not p.exists()), None)
    if dangling is not None:
        raise ConfigError(f"output_dir {out}: {dangling} is a link to {os.readlink(dangling)}, which does not exist; "
                          "create that folder or remove the link.")
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"output_dir {out}: {existing} is a file, not a folder; choose a folder "
                          "(it will hold the checkpoints, the log and the final model).")


def saved_run_config(out: Path) -> dict:
    """The config.json a run wrote into output_dir, read for --resume (a damaged one is named)."""
    path = out / "config.json"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--resume: {path} is missing (the run's config); resume in the folder "
                          "the run wrote, or start a new output_dir.") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(f"--resume: {path} is damaged ({err}); restore it from the run's settings "
                          "or start a new output_dir.") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"--resume: {path} is not the run's config (a JSON object); restore it or "
                          "start a new output_dir.")
    return saved


def run(cfg, resume: str | None = None, on_step: Callable[[int], None] | None = None,
        on_batch: Callable[[list[int], list[int]], None] | None = None) -> dict:
    """The whole recipe; returns {"final_dir", "log", "eval", "model" (main process)}. Raises
    SystemExit(128+signal) when stopped by SIGTERM/SIGINT (state saved for --resume)."""
    from accelerate.utils import set_seed

    t, out = cfg.training, Path(cfg.output_dir)
    check_output_dir(out)
    accelerator = make_accelerator(t, out, lora=cfg.lora.enabled, pose=cfg.pose.enabled)
    log, main = accelerator.print, accelerator.is_main_process
    if t.loss_chunk and accelerator.num_processes > 1:
        raise ConfigError(f"training.loss_chunk {t.loss_chunk}: the chunked loss calls the decoder and "
                          f"the LM head directly, which {accelerator.distributed_type} does not see "
                          f"(gradients would not be synchronised over the {accelerator.num_processes} "
                          "processes); set training.loss_chunk 0 when training on more than one process.")
    set_seed(t.seed)
    checkpoint = resume_path(out, resume)
    saved_state = None
    if checkpoint is not None:   # all before the model loads: a bad folder fails in a second
        check_resume_config(saved_run_config(out), cfg)
        saved_state = verify_checkpoint(checkpoint)
    tokenizer = load_tokenizer(cfg.model.name)
    data = prepare_data(cfg, tokenizer, accelerator, log)
    if cfg.pose.enabled:   # the model's config only: still before the weights load
        check_window_fits_target(cfg)
    model = load_recipe_model(cfg.model)
    collator = build_collator(cfg, model, log)
    model = prepare_for_training(model, cfg)
    if t.loss_chunk:   # a family whose forward post-processes logits unknown to lm_head.py: refused
        check_lm_head(model)
    optimizer = build_optimizer(model.parameters(), t.learning_rate, tuple(t.adam_betas), t.weight_decay)
    scheduler = build_scheduler(optimizer, t.lr_schedule, t.warmup_steps, t.max_steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    state = TrainState()   # with the scheduler: saved as JSON by checkpoint.save_checkpoint, never
    if checkpoint is not None:   # registered with accelerate (whose custom states are pickles)
        load_checkpoint(accelerator, state, scheduler, checkpoint, saved_state)
        log(f"resumed from {checkpoint} at step {state.step}")
    if cfg.data.synthetic.share > 0:
        reads = t.max_steps * data_parallel_rank(accelerator)[1] * t.batch_size * t.gradient_accumulation_steps
        log(f"data: the {t.max_steps} steps read {reads} windows, "
            f"{synthetic_read(data.sequences, t.seed, reads)} of them synthetic examples")
    log_path = out / "train_log.csv"
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        write_log(log_path, state.rows)   # on resume: drop rows after the checkpoint
    accelerator.init_trackers("hf_posext_finetune", config=_flat(cfg.to_dict()))
    code = train_loop(accelerator, model, optimizer, scheduler, data.sequences, collator, t, state, out,
                      on_row=(lambda row: append_log(log_path, row)) if main else (lambda row: None),
                      on_step=on_step, on_batch=on_batch)
    if code:
        log(f"stopped at step {state.step}/{t.max_steps}; state saved in {out / 'checkpoints'}. "
            "Continue with the same command plus --resume.")
        finish_trackers(accelerator)
        raise SystemExit(code)
    final_dir = out / "final"
    del optimizer
    saved = save_final(accelerator, model, tokenizer, final_dir, cfg.lora.enabled, t.gradient_checkpointing)
    result = {"final_dir": str(final_dir), "log": str(log_path), "eval": None, "model": saved,
              "world_size": accelerator.num_processes}
    if main:
        plot_loss(out / "loss_curve.png", state.rows, loss_title(cfg, accelerator.num_processes))
        log(f"saved {final_dir} (reloads with AutoModelForCausalLM.from_pretrained)")
        if cfg.eval.enabled:
            result["eval"] = evaluate_recipe(cfg, final_dir, data.eval_ids, data.eval_names,
                                             out / "eval", state.step, log)
    accelerator.wait_for_everyone()
    finish_trackers(accelerator)
    return result


def finish_trackers(accelerator) -> None:
    """`accelerator.end_training()` without its `destroy_process_group()`: `run` is a library call
    (tests run several in the same ranks); the process that launched it ends the group."""
    for tracker in accelerator.trackers:
        tracker.finish()


def end_process_group() -> None:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def loss_title(cfg, world: int = 1) -> str:
    t = cfg.training
    example = example_window(cfg.data.synthetic, t.seq_len)   # = seq_len unless examples are cut
    short = f", of which synthetic examples {example} tokens\n" if example < t.seq_len else ""
    pose = (f"PoSE positions up to {cfg.pose.target}" if cfg.pose.target else
            "PoSE positions up to s x trained length") if cfg.pose.enabled else "no PoSE"
    return (f"{cfg.model.name} {cfg.model.method} s={cfg.model.factor:g}: fine-tuning loss\n"
            f"{world * t.batch_size * t.gradient_accumulation_steps} x {t.seq_len}-token windows per "
            f"step{short or ', '}{pose}, lr {t.learning_rate:g}")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out

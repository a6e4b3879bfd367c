"""Extend a Llama/Mistral model's context with hf_posext, fine-tune it at the longer length, save a
checkpoint that reloads with plain `AutoModelForCausalLM.from_pretrained`, then evaluate the
training-free and the fine-tuned model side by side across context lengths.

    accelerate launch recipes/finetune.py --config recipes/cpu-smollm2-demo.yaml
    accelerate launch recipes/finetune.py --config recipes/cpu-smollm2-demo.yaml --resume
    python recipes/finetune.py --config ... --training.max_steps 10 --output_dir runs/x

Every YAML key is also a flag (`--section.key value`, value parsed as YAML). The recipe follows
the YaRN paper §4.1 (arXiv 2309.00071): AdamW lr 2e-5, betas (0.9, 0.95), no weight decay, 20
warm-up steps, documents packed with BOS/EOS into full-length sequences. Options: PoSE (Zhu et al.
2023, arXiv 2309.10400) trains on short windows whose position ids span the target length; LoRA
through peft, with embeddings and norms trainable as LongLoRA (Chen et al. 2023, arXiv 2309.12307)
found necessary, merged at save time.

Outputs in `output_dir`: `config.json` (the resolved config), `train_log.csv`, `loss_curve.png`,
`checkpoints/step_N/` (accelerate state, for --resume), `final/` (model + tokenizer), `eval/`
(results CSV/JSON and plot). SIGTERM/SIGINT: the current optimizer step finishes, the state is
saved, and the process exits with 128+signal; `--resume` continues exactly where it stopped.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import resource
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import yaml

import hf_posext
from hf_posext.config import canonical_method
from hf_posext.training import data as datalib
from hf_posext.training.optim import build_optimizer, build_scheduler, grad_norm
from hf_posext.training.pose import PoseCollator
# The configuration (a dataclass per YAML section, strict parsing, validation) lives in
# hf_posext/training/recipe_config.py; re-exported so `finetune.RecipeConfig` etc. keep working.
from hf_posext.training.recipe_config import (  # noqa: F401
    _SECTION_TYPES, DataConfig, EvalConfig, LoraConfig, ModelConfig, PoseConfig, RecipeConfig,
    TrainingConfig, config_from_dict, validate)

EMBEDDED_PREFIX = "embedded:"


def parse_args(argv: list[str] | None) -> tuple[RecipeConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a YAML file from recipes/")
    parser.add_argument("--resume", nargs="?", const="latest", default=None,
                        help="resume from the latest checkpoint in output_dir (or the given one)")
    parser.add_argument("--output_dir")
    for section, cls in _SECTION_TYPES.items():
        for f in dataclasses.fields(cls):
            parser.add_argument(f"--{section}.{f.name}", dest=f"{section}.{f.name}", default=None,
                                metavar="YAML", help=f"overrides {section}.{f.name}")
    args = parser.parse_args(argv)
    raw: dict = {}
    if args.config:
        with open(args.config) as fh:
            raw = yaml.safe_load(fh) or {}
    for key, value in vars(args).items():
        if "." in key and value is not None:
            section, name = key.split(".", 1)
            raw.setdefault(section, {})
            raw[section] = dict(raw[section] or {})
            raw[section][name] = yaml.safe_load(value)
    if args.output_dir:
        raw["output_dir"] = args.output_dir
    cfg = config_from_dict(raw)
    validate(cfg)
    return cfg, args


# ------------------------------------------------------------------------------------ model, data
def load_tokenizer(name: str):
    if name.startswith(EMBEDDED_PREFIX):
        from hf_posext import embedded
        return embedded.load_tokenizer()
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(name)


def load_model(mc: ModelConfig, extend: bool = True):
    kwargs = {"dtype": getattr(torch, mc.dtype)}
    if mc.attn_implementation:
        kwargs["attn_implementation"] = mc.attn_implementation
    method, factor, knobs = (mc.method, mc.factor, dict(mc.knobs)) if extend else (None, None, {})
    if mc.name.startswith(EMBEDDED_PREFIX):
        from hf_posext import embedded
        if mc.name != embedded.DEFAULT_MODEL:
            raise ValueError(f"Unknown embedded model {mc.name!r}; the only one is {embedded.DEFAULT_MODEL!r}.")
        return embedded.load_model(method, factor, **knobs, **kwargs)
    return hf_posext.from_pretrained(mc.name, method, factor, **knobs, **kwargs)


def special_id(tokenizer, setting: str | None, which: str) -> int | None:
    if setting is None:
        return None
    if setting == "auto":
        return getattr(tokenizer, f"{which}_token_id")
    ids = tokenizer.convert_tokens_to_ids(setting)
    if ids is None or tokenizer.convert_ids_to_tokens(ids) != setting:
        raise ValueError(f"data.{which}_token {setting!r} is not a token of this tokenizer.")
    return ids


@dataclass
class PreparedData:
    sequences: torch.Tensor            # [n, seq_len] packed training sequences
    eval_docs: list                    # held-out Documents
    eval_ids: list                     # their token ids
    train_names: list


def prepare_data(cfg: RecipeConfig, tokenizer, log: Callable[[str], None] = print) -> PreparedData:
    """Load, split, tokenize and pack; every data problem surfaces here, before the model loads."""
    d = cfg.data
    docs = datalib.load_documents(d.source, text_column=d.text_column, split=d.split, subset=d.subset,
                                  max_documents=d.max_documents, streaming=d.streaming)
    holdout = d.eval_documents
    train_docs, eval_docs = datalib.split_holdout(docs, holdout)
    train_ids = datalib.tokenize(tokenizer, train_docs)
    train_ids, train_docs = datalib.keep_long_documents(train_ids, train_docs, cfg.training.seq_len, "training")
    bos = special_id(tokenizer, d.bos_token, "bos")
    eos = special_id(tokenizer, d.eos_token, "eos")
    sequences = datalib.pack_documents(train_ids, cfg.training.seq_len, bos, eos)
    eval_ids = datalib.tokenize(tokenizer, eval_docs)
    if cfg.eval.enabled:
        # The truncate protocol scores the first L tokens of each document: keep those with at
        # least max(lengths) tokens (the same documents at every length).
        need = max(cfg.eval.lengths)
        long_enough = [(doc, ids) for doc, ids in zip(eval_docs, eval_ids) if len(ids) >= need]
        if not long_enough:
            short = [(doc.name, len(ids)) for doc, ids in zip(eval_docs, eval_ids)]
            raise ValueError(f"Held-out documents {short} are all shorter than the longest evaluation "
                             f"length {need} (the truncate protocol scores the first L tokens of each "
                             "document). Choose longer eval_documents or lower eval.lengths.")
        if len(long_enough) < len(eval_docs):
            log(f"eval: {len(eval_docs) - len(long_enough)} held-out documents shorter than {need} "
                "tokens are skipped (they are still never trained on)")
        long_enough = long_enough[: cfg.eval.max_documents]
        eval_docs, eval_ids = [x[0] for x in long_enough], [x[1] for x in long_enough]
    log(f"data: {len(train_docs)} training documents -> {sequences.shape[0]} sequences of "
        f"{cfg.training.seq_len} tokens; held out for evaluation: {[x.name for x in eval_docs]}")
    return PreparedData(sequences, eval_docs, eval_ids, [x.name for x in train_docs])


def apply_lora(model, lc: LoraConfig):
    """Wrap in a peft LoRA adapter; embeddings and norms trained in full (LongLoRA §3.3)."""
    from peft import LoraConfig as PeftLoraConfig, get_peft_model
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in lc.target_modules if t not in names]
    if missing:
        raise ValueError(f"lora.target_modules {missing} are not module names of this model.")
    model = get_peft_model(model, PeftLoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                                                 target_modules=list(lc.target_modules),
                                                 task_type="CAUSAL_LM"))
    for name, param in model.named_parameters():
        if any(key in name for key in lc.trainable):
            param.requires_grad_(True)
    return model


def merge_lora(model):
    """Fold the adapter into the base weights and return the plain transformers model."""
    return model.merge_and_unload()


# ------------------------------------------------------------------------------- training state
class TrainState:
    """Steps done and the log rows so far; saved with `accelerator.save_state` so a resumed run
    continues the same loss curve."""

    def __init__(self):
        self.step = 0
        self.rows: list[dict] = []

    def state_dict(self) -> dict:
        return {"step": self.step, "rows": self.rows}

    def load_state_dict(self, sd: dict) -> None:
        self.step, self.rows = int(sd["step"]), list(sd["rows"])


LOG_COLUMNS = ["step", "loss", "lr", "grad_norm", "grad_norm_clipped", "tokens", "tokens_per_s",
               "memory_mb", "elapsed_s"]
# Columns that must match between an interrupted-and-resumed run and an uninterrupted one.
DETERMINISTIC_COLUMNS = ["step", "loss", "lr", "grad_norm", "grad_norm_clipped", "tokens"]


def write_log(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=LOG_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def plot_loss(path: Path, rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps, losses = [r["step"] for r in rows], [r["loss"] for r in rows]
    ax.plot(steps, losses, marker=".", alpha=0.5, label="loss per step")
    k = min(10, len(losses))   # trailing mean: one-window losses are noisy at batch 1
    ax.plot(steps, [sum(losses[max(0, i - k + 1):i + 1]) / len(losses[max(0, i - k + 1):i + 1])
                    for i in range(len(losses))], label=f"mean of last {k}")
    ax.legend()
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def memory_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    steps = sorted((int(p.name.split("_")[1]), p) for p in ckpt_dir.glob("step_*")
                   if p.name.split("_")[1].isdigit())
    return steps[-1][1] if steps else None


# Sections whose change would make a resumed run a different run.
_RESUME_SECTIONS = ("model", "data", "pose", "lora")
_RESUME_TRAINING_FREE = {"max_steps", "save_every", "keep_checkpoints", "log_with"}


def check_resume_config(saved: dict, cfg: RecipeConfig) -> None:
    now = cfg.to_dict()
    diffs = [s for s in _RESUME_SECTIONS if saved.get(s) != now[s]]
    diffs += [f"training.{k}" for k in now["training"]
              if k not in _RESUME_TRAINING_FREE and saved.get("training", {}).get(k) != now["training"][k]]
    if diffs:
        raise ValueError(f"--resume with a different config: {diffs} changed since the run started. "
                         "Resume with the same config, or start a new output_dir.")


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


def resolve_mixed_precision(setting: str) -> str:
    if setting != "auto":
        return setting
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "no"   # CPU: fp32 (bf16 autocast on CPU is slow and imprecise for RoPE angles)


# ------------------------------------------------------------------------------------- main
def train(cfg: RecipeConfig, resume: str | None = None,
          on_step: Callable[[int], None] | None = None) -> dict:
    """Run the whole recipe; returns {"final_dir", "log", "eval"}. `on_step(step)` is called after
    every optimizer step (tests use it to deliver a signal mid-run)."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    t = cfg.training
    out = Path(cfg.output_dir)
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision(t.mixed_precision),
                              log_with=t.log_with, project_dir=str(out))
    log = accelerator.print
    set_seed(t.seed)
    deepspeed = accelerator.distributed_type.value == "DEEPSPEED"
    if cfg.lora.enabled and accelerator.distributed_type.value in ("FSDP", "DEEPSPEED"):
        raise ValueError("lora.enabled with FSDP/DeepSpeed is not supported: merging the adapter at "
                         "save time needs the whole model on one device. Use LoRA with one GPU or "
                         "DDP (recipes/accelerate/single-gpu.yaml, multi-gpu.yaml).")
    if deepspeed:   # DeepSpeed clips and accumulates itself: its settings must be the recipe's
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        if float(ds.get("gradient_clipping", 0.0)) != float(t.max_grad_norm):
            raise ValueError(f"DeepSpeed gradient_clipping={ds.get('gradient_clipping')} differs from "
                             f"training.max_grad_norm={t.max_grad_norm}; set them equal.")
        if int(ds.get("gradient_accumulation_steps", 1)) != t.gradient_accumulation_steps:
            raise ValueError(f"DeepSpeed gradient_accumulation_steps={ds.get('gradient_accumulation_steps')}"
                             f" differs from training.gradient_accumulation_steps="
                             f"{t.gradient_accumulation_steps}; set them equal.")

    # 0. The run directory: resume only a run with the same config; never overwrite one.
    ckpt_dir = out / "checkpoints"
    resume_path = None
    if resume:
        resume_path = latest_checkpoint(ckpt_dir) if resume == "latest" else Path(resume)
        if resume_path is None or not resume_path.exists():
            raise FileNotFoundError(f"--resume: no checkpoint found in {ckpt_dir}")
        check_resume_config(json.loads((out / "config.json").read_text()), cfg)
    elif latest_checkpoint(ckpt_dir) is not None:   # every rank checks, so none is left waiting
        raise FileExistsError(f"{ckpt_dir} already holds checkpoints: pass --resume to continue, "
                              "or choose a new output_dir.")

    # 1. Data first: a missing column or too-short documents fail before the model loads.
    tokenizer = load_tokenizer(cfg.model.name)
    prepared = prepare_data(cfg, tokenizer, log)

    # 2. The extended model.
    model = load_model(cfg.model)
    from hf_posext.compat import text_config
    mconf = text_config(model.config)
    spec = hf_posext.portable.method_spec(mconf)  # sees ntk saved as plain RoPE + its block
    target = int(round(spec.factor * spec.original_max_position_embeddings))
    if cfg.pose.enabled:
        pose_target = cfg.pose.target or target
        collator = PoseCollator(t.seq_len, pose_target, cfg.pose.num_chunks, t.seed)
        log(f"PoSE: windows of {t.seq_len} tokens, position ids spanning {pose_target}")
    else:
        if t.seq_len < target:
            log(f"note: training at {t.seq_len} tokens, below the extended length {target} "
                "(pose.enabled would spread positions over it)")
        collator = PoseCollator(t.seq_len, None, 1, t.seed)
    if t.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
    model.train()

    optimizer = build_optimizer(model.parameters(), t.learning_rate, tuple(t.adam_betas), t.weight_decay)
    scheduler = build_scheduler(optimizer, t.lr_schedule, t.warmup_steps, t.max_steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    state = TrainState()
    accelerator.register_for_checkpointing(scheduler)   # stepped by us, once per optimizer step
    accelerator.register_for_checkpointing(state)

    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    if resume:
        accelerator.load_state(str(resume_path))
        log(f"resumed from {resume_path} at step {state.step}")
    if accelerator.is_main_process:
        (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    accelerator.init_trackers("hf_posext_finetune", config=_flat(cfg.to_dict()))

    n_seq = prepared.sequences.shape[0]
    world, rank, bs, accum = accelerator.num_processes, accelerator.process_index, t.batch_size, \
        t.gradient_accumulation_steps
    tokens_per_step = world * bs * accum * t.seq_len
    log_path = out / "train_log.csv"
    if accelerator.is_main_process:
        write_log(log_path, state.rows)   # on resume: drop rows after the checkpoint
    from tqdm.auto import tqdm
    bar = tqdm(total=t.max_steps, initial=state.step, disable=not accelerator.is_local_main_process,
               desc="fine-tune")
    elapsed_before = state.rows[-1]["elapsed_s"] if state.rows else 0.0
    start = time.time()

    orders: dict[int, list[int]] = {}

    def example(t_index: int) -> int:
        """Global example index -> packed sequence, reshuffled every epoch (a pure function)."""
        epoch, pos = divmod(t_index, n_seq)
        if epoch not in orders:
            orders[epoch] = datalib.epoch_order(n_seq, t.seed, epoch)
        return orders[epoch][pos]

    with StopSignal() as stop:
        while state.step < t.max_steps:
            step_start = time.time()
            micro_losses = []
            for micro in range(accum):
                first = ((state.step * accum + micro) * world + rank) * bs
                indices = list(range(first, first + bs))
                batch = collator([prepared.sequences[example(i)] for i in indices], indices)
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                sync = micro == accum - 1
                ctx = accelerator.no_sync(model) if not sync and world > 1 else _nullcontext()
                with ctx:
                    loss = model(**batch).loss               # mean over this micro-batch's tokens
                    accelerator.backward(loss if deepspeed else loss / accum)  # DS scales itself
                micro_losses.append(loss.detach())
            pre = accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
            post = grad_norm(model.parameters()) if accelerator.distributed_type.value in \
                ("NO", "MULTI_GPU", "MULTI_CPU") else float("nan")
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = accelerator.reduce(torch.stack(micro_losses).mean(), "mean").item()
            state.step += 1
            now = time.time()
            row = {"step": state.step, "loss": loss_value, "lr": lr,
                   "grad_norm": float(pre) if pre is not None else float("nan"),
                   "grad_norm_clipped": post, "tokens": state.step * tokens_per_step,
                   "tokens_per_s": tokens_per_step / max(now - step_start, 1e-9),
                   "memory_mb": memory_mb(), "elapsed_s": elapsed_before + now - start}
            state.rows.append(row)
            accelerator.log({k: v for k, v in row.items() if k != "step"}, step=state.step)
            if accelerator.is_main_process:
                with open(log_path, "a", newline="") as fh:
                    csv.DictWriter(fh, fieldnames=LOG_COLUMNS).writerow(row)
            bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}", tok_s=f"{row['tokens_per_s']:.0f}",
                            mem_mb=f"{row['memory_mb']:.0f}")
            bar.update(1)
            if on_step is not None:
                on_step(state.step)
            if state.step % t.save_every == 0 or stop.signum is not None or state.step == t.max_steps:
                save_checkpoint(accelerator, ckpt_dir, state.step, t.keep_checkpoints)
            if stop.signum is not None:
                bar.close()
                log(f"stopped at step {state.step}/{t.max_steps}; state saved in {ckpt_dir}. "
                    f"Continue with the same command plus --resume.")
                accelerator.end_training()
                raise SystemExit(128 + stop.signum)
    bar.close()

    # 3. Save a plain transformers checkpoint (rope config inside, LoRA merged).
    final_dir = out / "final"
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    state_dict = accelerator.get_state_dict(model)   # gathers FSDP / ZeRO-3 shards
    result = {"final_dir": str(final_dir), "log": str(log_path), "eval": None}
    if accelerator.is_main_process:
        if cfg.lora.enabled:
            unwrapped = merge_lora(unwrapped)
            state_dict = None                          # the merged module holds the weights
        if t.gradient_checkpointing:
            unwrapped.gradient_checkpointing_disable()
            unwrapped.config.use_cache = True
        unwrapped.eval()
        kwargs = {"state_dict": state_dict} if state_dict is not None and accelerator.distributed_type.value \
            not in ("NO", "MULTI_CPU", "MULTI_GPU") else {}
        unwrapped.save_pretrained(final_dir, **kwargs)
        tokenizer.save_pretrained(final_dir)
        plot_loss(out / "loss_curve.png", state.rows)
        log(f"saved {final_dir} (reloads with AutoModelForCausalLM.from_pretrained)")
        # 4. Evaluate training-free vs fine-tuned on the held-out documents.
        if cfg.eval.enabled:
            del optimizer
            result["eval"] = evaluate(cfg, unwrapped, prepared, out / "eval", log, state.step)
        result["model"] = unwrapped
    accelerator.end_training()
    return result


def save_checkpoint(accelerator, ckpt_dir: Path, step: int, keep: int) -> None:
    path = ckpt_dir / f"step_{step}"
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        old = sorted((int(p.name.split("_")[1]), p) for p in ckpt_dir.glob("step_*")
                     if p.name.split("_")[1].isdigit())
        for _, p in old[:-keep]:
            shutil.rmtree(p, ignore_errors=True)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


# -------------------------------------------------------------------------------- evaluation
def evaluate(cfg: RecipeConfig, finetuned, prepared: PreparedData, out: Path, log,
             step: int = 0) -> dict:
    """Perplexity at each eval length (truncate protocol, REFERENCE §3) of the training-free
    extended model and the fine-tuned one, on the held-out documents only, through the project's
    evaluation API (`hf_posext.evaluation`): chunked LM head, token-weighted, rows written as each
    cell finishes (a crashed evaluation resumes from its finished cells)."""
    from hf_posext.evaluation import PeakMemory, ResultsStore, format_table, plot_perplexity, truncate_nll
    from hf_posext.evaluation.perplexity import trained_length

    method = canonical_method(cfg.model.method)
    store = ResultsStore(out, "results", resume=True)
    docs = [ids for ids in prepared.eval_ids]
    doc_names = ",".join(d.name for d in prepared.eval_docs)
    runs = (["training-free"] if cfg.eval.compare_base else []) + ["fine-tuned"]
    for which in runs:
        tag = which if which == "training-free" else f"fine-tuned@{step}"
        model = finetuned if which == "fine-tuned" else None
        for length in sorted(cfg.eval.lengths):
            key = f"{cfg.model.name}|{method}|{cfg.model.factor:g}|{tag}|{doc_names}|truncate|{length}"
            if store.has(key):
                continue
            if model is None:             # the base model, extended the same way, not trained
                model = load_model(cfg.model)
            model.eval()
            with PeakMemory("cpu") as peak:
                started = time.perf_counter()
                nll, count = truncate_nll(model, docs, length, cfg.eval.chunk_size)
                seconds = time.perf_counter() - started
            row = {"model": cfg.model.name, "method": f"{method} {which}",
                   "factor": float(cfg.model.factor), "factor_spec": f"{cfg.model.factor:g}",
                   "length": length, "protocol": "truncate", "perplexity": math.exp(nll / count),
                   "nll": nll, "tokens": count, "docs": len(docs), "documents": doc_names,
                   "finetune_steps": step if which == "fine-tuned" else 0,
                   "seconds": round(seconds, 3), "peak_rss_mb": round(peak.peak_mb, 1),
                   "trained_length": trained_length(model), "dataset": cfg.data.source, "key": key}
            store.add(row)
            log(f"eval {which:13s} L={length}: perplexity {row['perplexity']:.3f} ({seconds:.0f} s)")
        if which == "training-free" and model is not None:
            del model
    rows = [r for r in store.rows if r["key"].split("|")[3] in ("training-free", f"fine-tuned@{step}")]
    title = f"{cfg.model.name}: {method} s={cfg.model.factor:g}, held-out {doc_names}"
    plot = plot_perplexity(rows, out / "perplexity.png", title)
    table = format_table(rows, "perplexity", title)
    (out / "table.txt").write_text(table + "\n")
    log(table)
    return {"rows": rows, "csv": str(store.csv_path), "json": str(store.json_path), "plot": str(plot),
            "table": table}


def main(argv: list[str] | None = None, on_step: Callable[[int], None] | None = None) -> dict:
    cfg, args = parse_args(argv)
    return train(cfg, resume=args.resume, on_step=on_step)


def stop_with_parent() -> None:
    """Ask Linux to send us SIGTERM when our parent dies. `accelerate launch` with one process
    does not forward SIGTERM to the training process (its simple launcher just waits), so `kill
    <launcher pid>` would otherwise leave training running orphaned; with this, the launcher's death
    reaches StopSignal, which saves the state and exits. No-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    stop_with_parent()
    main()

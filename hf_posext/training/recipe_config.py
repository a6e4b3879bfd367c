"""The fine-tuning recipe's configuration (recipes/finetune.py): one dataclass per YAML section,
built strictly from a dict (unknown sections or keys raise) and validated before anything loads.
Defaults follow the YaRN paper §4.1 (arXiv 2309.00071)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..config import RopeExtensionConfig, canonical_method
from . import data as datalib
from .optim import SCHEDULES

@dataclass
class ModelConfig:
    name: str = "embedded:smollm2-135m"  # Hub id, local path, or "embedded:smollm2-135m"
    method: str = "yarn"                 # one of hf_posext.METHODS
    factor: float = 2.0                  # scale s; target length = s * trained length
    knobs: dict = field(default_factory=dict)  # beta_fast, beta_slow, mscale_coefficient, ...
    dtype: str = "float32"               # weights' dtype at load (mixed precision is separate)
    attn_implementation: str | None = "sdpa"


@dataclass
class DataConfig:
    source: str = datalib.EMBEDDED_PLAYS  # "embedded:shakespeare", a local path, or a Hub name
    text_column: str = "text"
    split: str = "train"
    subset: str | None = None
    streaming: bool = False
    max_documents: int | None = None
    eval_documents: Any = 1               # names of held-out documents, or a count from the end
    bos_token: str | None = "auto"        # "auto" = the tokenizer's; null = none; or a token string
    eos_token: str | None = "auto"


@dataclass
class TrainingConfig:
    seq_len: int = 1024                   # tokens per training sequence (the PoSE window)
    batch_size: int = 1                   # per device
    gradient_accumulation_steps: int = 1
    max_steps: int = 40                   # optimizer steps
    learning_rate: float = 2e-5
    adam_betas: list = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.0
    warmup_steps: int = 20
    lr_schedule: str = "constant_with_warmup"
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = True
    mixed_precision: str = "auto"         # auto | no | bf16 | fp16
    seed: int = 0
    save_every: int = 10                  # optimizer steps between accelerate checkpoints
    keep_checkpoints: int = 2
    log_with: str | None = None           # an accelerate tracker: tensorboard, wandb, ...


@dataclass
class PoseConfig:
    enabled: bool = False
    num_chunks: int = 2
    target: int | None = None             # default: the extended length, factor * trained length


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    trainable: list = field(default_factory=lambda: ["embed_tokens", "norm"])  # LongLoRA


@dataclass
class EvalConfig:
    enabled: bool = True
    lengths: list = field(default_factory=lambda: [8192, 16384])
    max_documents: int = 1
    compare_base: bool = True             # also evaluate the training-free extended model
    chunk_size: int = 1024                # tokens per LM-head chunk (never full logits)


@dataclass
class RecipeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    pose: PoseConfig = field(default_factory=PoseConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str = "runs/finetune"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_SECTION_TYPES = {"model": ModelConfig, "data": DataConfig, "training": TrainingConfig,
                  "pose": PoseConfig, "lora": LoraConfig, "eval": EvalConfig}


def config_from_dict(raw: dict) -> RecipeConfig:
    """Build a RecipeConfig; unknown sections or keys raise (nothing is silently dropped)."""
    raw = dict(raw or {})
    unknown = set(raw) - set(_SECTION_TYPES) - {"output_dir"}
    if unknown:
        raise ValueError(f"Unknown config section(s) {sorted(unknown)}; known: "
                         f"{sorted(_SECTION_TYPES) + ['output_dir']}.")
    kwargs = {}
    for name, cls in _SECTION_TYPES.items():
        section = raw.get(name) or {}
        if not isinstance(section, dict):
            raise ValueError(f"Config section {name!r} must be a mapping, got {section!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        bad = set(section) - known
        if bad:
            raise ValueError(f"Unknown key(s) {sorted(bad)} in section {name!r}; known: {sorted(known)}.")
        kwargs[name] = cls(**{k: _coerce(cls, k, v) for k, v in section.items()})
    return RecipeConfig(**kwargs, **({"output_dir": str(raw["output_dir"])} if "output_dir" in raw else {}))


def _coerce(cls, key: str, value):
    """YAML 1.1 reads `1e-3` as a string: turn numeric strings into floats for float fields."""
    default = getattr(cls(), key)
    if isinstance(default, float) and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{cls.__name__[:-6].lower()}.{key} must be a number, got {value!r}") from None
    return value


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate(cfg: RecipeConfig) -> None:
    """Checks that need no model or data: run first, so a bad config fails in a second."""
    m, t, p, e = cfg.model, cfg.training, cfg.pose, cfg.eval
    canonical_method(m.method)                        # unknown method -> ValueError naming METHODS
    RopeExtensionConfig(canonical_method(m.method), m.factor, **m.knobs)  # factor < 1, bad knobs
    for name in ("seq_len", "batch_size", "gradient_accumulation_steps", "max_steps", "save_every",
                 "keep_checkpoints"):
        v = getattr(t, name)
        if not _is_int(v) or v < 1:
            raise ValueError(f"training.{name} must be a positive integer, got {v!r}")
    if not _is_int(t.warmup_steps) or t.warmup_steps < 0:
        raise ValueError(f"training.warmup_steps must be an integer >= 0, got {t.warmup_steps!r}")
    if not (isinstance(t.learning_rate, (int, float)) and t.learning_rate > 0):
        raise ValueError(f"training.learning_rate must be > 0, got {t.learning_rate!r}")
    if not (isinstance(t.max_grad_norm, (int, float)) and t.max_grad_norm > 0):
        raise ValueError(f"training.max_grad_norm must be > 0 (clipping is always on), got {t.max_grad_norm!r}")
    if len(t.adam_betas) != 2 or not all(0 <= b < 1 for b in t.adam_betas):
        raise ValueError(f"training.adam_betas must be two numbers in [0, 1), got {t.adam_betas!r}")
    if t.lr_schedule not in SCHEDULES:
        raise ValueError(f"training.lr_schedule {t.lr_schedule!r} unknown; use one of {SCHEDULES}")
    if t.mixed_precision not in ("auto", "no", "bf16", "fp16"):
        raise ValueError(f"training.mixed_precision must be auto, no, bf16 or fp16, got {t.mixed_precision!r}")
    if m.dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"model.dtype must be float32, bfloat16 or float16, got {m.dtype!r}")
    if p.enabled:
        if not _is_int(p.num_chunks) or not 1 <= p.num_chunks <= t.seq_len:
            raise ValueError(f"pose.num_chunks must be an integer in [1, seq_len], got {p.num_chunks!r}")
        if p.target is not None and (not _is_int(p.target) or p.target < t.seq_len):
            raise ValueError(f"pose.target ({p.target!r}) must be an integer >= training.seq_len "
                             f"({t.seq_len}): PoSE spreads a short window over a longer target.")
    if cfg.lora.enabled:
        try:
            import peft  # noqa: F401  (only checks that it is installed)
        except ImportError:
            raise ValueError("lora.enabled needs the peft package: pip install peft") from None
        if not cfg.lora.target_modules:
            raise ValueError("lora.target_modules is empty; name the layers to adapt (q_proj, ...).")
    if e.enabled and (not e.lengths or not all(_is_int(x) and x > 1 for x in e.lengths)):
        raise ValueError(f"eval.lengths must be a non-empty list of integers > 1, got {e.lengths!r}")
    h = cfg.data.eval_documents
    if not (_is_int(h) or (isinstance(h, list) and h and all(isinstance(x, str) for x in h))):
        raise ValueError(f"data.eval_documents must be a count or a list of document names, got {h!r}")

"""The fine-tuning recipe's configuration (recipes/finetune.py): one dataclass per YAML section,
parsed from a YAML file plus `--section.key value` flags, and validated before anything loads.
Defaults follow the YaRN paper §4.1 (arXiv 2309.00071).

Parsing is jsonargparse's (the parser behind LightningCLI): it builds the flags from these
dataclasses (so knob names have one source: the fields), reads `--config` YAML, refuses unknown
keys and type-checks values. Chosen over HfArgumentParser, whose flat namespace cannot hold two
sections with the same field name (`pose.enabled`, `lora.enabled`), and over OmegaConf, whose
`key=value` dot-lists would make the recipe's flag style differ from the CLI's `--flag value`.
Abbreviations are off (`--training.lr` used to resolve to `--training.lr_schedule`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
import re
from typing import Any, Sequence

import math
import os

from ..catalog import canonical_method
from ..data.documents import EMBEDDED_TEXT, looks_like_path
from ..data.embedded import DEFAULT_MODEL
from ..errors import ConfigError, check_seed, refuse_renamed
from ..rope.config import RopeExtensionConfig
from ..rope.knobs import RENAMED_TRAINED
from .optim import SCHEDULES
from .synthetic import FORMATS as SYNTHETIC_FORMATS, LOSSES as SYNTHETIC_LOSSES, MAX_DISTRACTORS, TRAINING_HAYSTACK

@dataclass
class ModelConfig:
    name: str = "embedded:smollm2-135m"  # Hub id, local path, or "embedded:smollm2-135m"
    method: str = "yarn"                 # one of hf_posext.METHODS
    factor: float = 2.0                  # scale s; target length = s * trained length
    knobs: dict[str, Any] = field(default_factory=dict)  # the method's knobs as its unit declares them: numbers, bools (finetuned), lists
    dtype: str = "float32"               # weights' dtype at load (mixed precision is separate)
    attn_implementation: str | None = "sdpa"


@dataclass
class SyntheticConfig:
    """data.synthetic: synthetic long-range examples mixed into the windows (training/synthetic.py)."""
    share: float = 0.0                    # fraction of the packed windows turned into examples
    formats: list[str] = field(default_factory=lambda: list(SYNTHETIC_FORMATS))
    # the question's position id is drawn in [min_span x target, target); 0.9 (every question near
    # the target's far end) found RULER's needle 16k back where 0.5 missed it (docs/finetuning_mix.md)
    min_span: float = 0.9
    loss: str = "answer"                  # answer: loss on the answer tokens only; window: every token
    # the text around the fact and the question, drawn per example from these: "training" (the
    # window's own document text) or a source like data.source (e.g. embedded:python-stdlib, code)
    haystacks: list[str] = field(default_factory=lambda: [TRAINING_HAYSTACK])
    # facts of the same form with other keys written beside the asked one (RULER's niah_multikey
    # asks among 3): 0 writes the asked fact alone, near the window's start
    distractors: int = 0
    # tokens per synthetic example, cut from the front of its window; null = training.seq_len.
    # Shorter examples beside long document windows: the fact-to-question layout of a short-window
    # recipe with the documents of a long one (benchmarks/results/effective_length_4x_training.md); batch_size 1
    window: int | None = None


@dataclass
class DataConfig:
    source: str = EMBEDDED_TEXT          # "embedded:shakespeare", a local path, or a Hub name
    text_column: str = "text"
    split: str = "train"
    subset: str | None = None
    streaming: bool = False
    max_documents: int | None = None
    eval_documents: int | list[str] = 1              # names of held-out documents, or a count from the end
    bos_token: str | None = "auto"        # "auto" = the tokenizer's; null = none; or a token string
    eos_token: str | None = "auto"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class TrainingConfig:
    seq_len: int = 1024                   # tokens per training sequence (the PoSE window)
    batch_size: int = 1                   # per device
    gradient_accumulation_steps: int = 1
    max_steps: int = 40                   # optimizer steps
    learning_rate: float = 2e-5
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.0
    warmup_steps: int = 20
    lr_schedule: str = "constant_with_warmup"
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = True
    loss_chunk: int = 0                   # positions per LM-head chunk in the loss; 0: full logits
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
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    trainable: list[str] = field(default_factory=lambda: ["embed_tokens", "norm"])  # LongLoRA


@dataclass
class EvalConfig:
    enabled: bool = True
    lengths: list[int] = field(default_factory=lambda: [8192, 16384])
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


# argparse (Python < 3.13) reads "-1e-3" as an option name, not a value, so `--training.lr
# -1e-3` failed unless written with "=". This is the pattern CPython 3.13 adopted for the same fix.
_NEGATIVE_NUMBER = re.compile(r"^-\.?\d")


def build_recipe_parser():
    """The recipe's command line: `--config FILE`, every dataclass field as `--section.key`,
    `--output_dir` and `--resume [CHECKPOINT]`."""
    from jsonargparse import ActionConfigFile, ArgumentParser
    parser = ArgumentParser(prog="finetune.py", exit_on_error=False, allow_abbrev=False,
                            description="Extend a model's context with hf_posext, fine-tune it, evaluate.")
    parser._negative_number_matcher = _NEGATIVE_NUMBER
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file from recipes/")
    parser.add_argument("--resume", nargs="?", const="latest", default=None, type=str | None,
                        help="resume from the latest checkpoint in output_dir (or the given one)")
    for name, cls in _SECTION_TYPES.items():
        parser.add_class_arguments(cls, name)
    parser.add_argument("--output_dir", type=str, default=RecipeConfig.output_dir)
    return parser


def _instantiate(namespace) -> RecipeConfig:
    d = namespace.as_dict()
    d["data"] = {**d["data"], "synthetic": SyntheticConfig(**d["data"]["synthetic"])}
    return RecipeConfig(**{name: cls(**d[name]) for name, cls in _SECTION_TYPES.items()},
                        output_dir=str(d["output_dir"]))


def _one_line(err: Exception) -> ConfigError:
    text = " ".join(str(err).split())
    return ConfigError(f"Bad recipe configuration: {text}")


class _UniqueKeyLoader:
    """A yaml SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently, so an edited copy of a key would win without a word)."""

    @staticmethod
    def load(text: str, source: str):
        import yaml

        class Loader(yaml.SafeLoader):
            pass

        def mapping(loader, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = loader.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ConfigError(f"{source}: key {key!r} is given twice (line {key_node.start_mark.line + 1});"
                                      " keep one.")
                seen.add(key)
            return loader.construct_mapping(node, deep)

        Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
        try:
            return yaml.load(text, Loader=Loader)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            what = " ".join(str(getattr(err, "problem", None) or err).split())
            raise ConfigError(f"{source}:{where} is not valid YAML ({what}); fix the syntax.") from None


def _check_config_files(argv: Sequence[str]) -> None:
    """Read each `--config FILE` once with the strict loader before jsonargparse does."""
    argv = list(argv)
    for i, a in enumerate(argv):
        path = a.split("=", 1)[1] if a.startswith("--config=") else (
            argv[i + 1] if a == "--config" and i + 1 < len(argv) else None)
        if path is None:
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"--config {path}: cannot read it ({err.__class__.__name__}); "
                              "pass an existing YAML file.") from None
        _UniqueKeyLoader.load(text, path)


def parse_args(argv: Sequence[str] | None = None) -> tuple[RecipeConfig, str | None]:
    """(validated config, resume) from the command line; every problem is a one-line ValueError."""
    from jsonargparse import ArgumentError
    import sys
    argv = list(argv) if argv is not None else sys.argv[1:]
    _check_config_files(argv)
    parser = build_recipe_parser()
    try:
        ns = parser.parse_args(argv)
    except (ArgumentError, TypeError, ValueError) as err:
        raise _one_line(err) from None
    cfg = _instantiate(ns)
    validate(cfg)
    return cfg, ns.resume


def config_from_dict(raw: dict) -> RecipeConfig:
    """A RecipeConfig from a dict shaped like the YAML (unknown sections or keys raise)."""
    from jsonargparse import ArgumentError
    parser = build_recipe_parser()
    try:
        ns = parser.parse_object(dict(raw or {}))
    except (ArgumentError, TypeError, ValueError) as err:
        raise _one_line(err) from None
    return _instantiate(ns)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate(cfg: RecipeConfig) -> None:
    """Checks that need no model or data: run first, so a bad config fails in a second. Every
    failure is one ConfigError (a ValueError)."""
    try:
        _validate(cfg)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(" ".join(str(err).split())) from None


def _validate(cfg: RecipeConfig) -> None:
    m, t, p, e = cfg.model, cfg.training, cfg.pose, cfg.eval
    canonical_method(m.method)                        # unknown method -> ValueError naming METHODS
    if m.name.startswith("embedded:") and m.name != DEFAULT_MODEL:
        raise ValueError(f"model.name {m.name!r}: unknown embedded model; the only one is "
                         f"{DEFAULT_MODEL!r}.")
    if not m.name.startswith("embedded:") and looks_like_path(m.name) \
            and not os.path.isdir(os.path.expanduser(m.name)):
        raise ValueError(f"model.name {m.name!r}: no such folder; pass a saved model folder, a Hub id "
                         f"or {DEFAULT_MODEL}.")
    try:   # transformers' name for the trained length is not a knob: named in the recipe's words
        refuse_renamed(None, m.knobs, RENAMED_TRAINED)
    except ValueError as err:
        raise ValueError(f"model.knobs: {err}") from None
    RopeExtensionConfig(canonical_method(m.method), m.factor, **m.knobs)  # factor < 1, bad knobs: each checked by its spec
    for name in ("seq_len", "batch_size", "gradient_accumulation_steps", "max_steps", "save_every",
                 "keep_checkpoints"):
        v = getattr(t, name)
        if not _is_int(v) or v < 1:
            raise ValueError(f"training.{name} must be a positive integer, got {v!r}")
    check_seed("training.seed", t.seed)
    if not _is_int(t.loss_chunk) or t.loss_chunk < 0:
        raise ValueError(f"training.loss_chunk must be a whole number of positions >= 0 (0: the full "
                         f"logits), got {t.loss_chunk!r}")
    if not _is_int(t.warmup_steps) or t.warmup_steps < 0:
        raise ValueError(f"training.warmup_steps must be an integer >= 0, got {t.warmup_steps!r}")
    if not (_finite(t.learning_rate) and t.learning_rate > 0):
        raise ValueError(f"training.learning_rate must be a finite number > 0, got {t.learning_rate!r}")
    if not (_finite(t.weight_decay) and t.weight_decay >= 0):
        raise ValueError(f"training.weight_decay must be a finite number >= 0, got {t.weight_decay!r}")
    if not (_finite(t.max_grad_norm) and t.max_grad_norm > 0):
        raise ValueError(f"training.max_grad_norm must be > 0 (clipping is always on), got {t.max_grad_norm!r}")
    if len(t.adam_betas) != 2 or not all(_finite(b) and 0 <= b < 1 for b in t.adam_betas):
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
    _validate_synthetic(cfg.data.synthetic, p, t)
    h = cfg.data.eval_documents
    if not (_is_int(h) or (isinstance(h, list) and h and all(isinstance(x, str) for x in h))):
        raise ValueError(f"data.eval_documents must be a count or a list of document names, got {h!r}")


def _validate_synthetic(sc: SyntheticConfig, p: PoseConfig, t: TrainingConfig) -> None:
    if not (_finite(sc.share) and 0 <= sc.share <= 1):
        raise ValueError(f"data.synthetic.share must be a fraction in [0, 1], got {sc.share!r}")
    unknown = [f for f in sc.formats if f not in SYNTHETIC_FORMATS]
    if unknown:
        raise ValueError(f"data.synthetic.formats: unknown format(s) {unknown}; use some of "
                         f"{list(SYNTHETIC_FORMATS)}")
    if sc.share > 0 and not sc.formats:
        raise ValueError("data.synthetic.formats is empty but data.synthetic.share > 0; name at least "
                         f"one of {list(SYNTHETIC_FORMATS)}")
    if not (_finite(sc.min_span) and 0 < sc.min_span <= 1):
        raise ValueError(f"data.synthetic.min_span must be in (0, 1], got {sc.min_span!r}")
    if sc.loss not in SYNTHETIC_LOSSES:
        raise ValueError(f"data.synthetic.loss must be one of {SYNTHETIC_LOSSES}, got {sc.loss!r}")
    if not (_is_int(sc.distractors) and 0 <= sc.distractors <= MAX_DISTRACTORS):
        raise ValueError(f"data.synthetic.distractors must be a whole number in [0, {MAX_DISTRACTORS}] "
                         f"(other facts of the asked one's form), got {sc.distractors!r}")
    hays = sc.haystacks
    if not (isinstance(hays, list) and hays and all(isinstance(h, str) and h for h in hays)):
        raise ValueError(f"data.synthetic.haystacks must be a non-empty list of sources, got {hays!r}; "
                         f"e.g. [{TRAINING_HAYSTACK}, embedded:python-stdlib]")
    if len(set(hays)) != len(hays):
        raise ValueError(f"data.synthetic.haystacks names a source twice: {hays!r}; name each once.")
    if sc.window is not None:
        if sc.share == 0:
            raise ValueError(f"data.synthetic.window ({sc.window}) is set but data.synthetic.share is 0, so no "
                             "example would be cut to it; set a share > 0 or drop the window.")
        if not (_is_int(sc.window) and 2 <= sc.window <= t.seq_len):
            raise ValueError(f"data.synthetic.window must be a whole number of tokens in [2, training.seq_len="
                             f"{t.seq_len}] or null (= training.seq_len), got {sc.window!r}")
        if sc.window < t.seq_len and t.batch_size != 1:
            raise ValueError(f"data.synthetic.window ({sc.window}) shorter than training.seq_len ({t.seq_len}) "
                             f"makes windows of two lengths, which one batch cannot hold; set "
                             f"training.batch_size 1 and raise training.gradient_accumulation_steps instead.")
    if sc.share > 0 and p.enabled and p.num_chunks < 2:
        raise ValueError("data.synthetic with PoSE needs pose.num_chunks >= 2 (the fact in the first "
                         "chunk, the question in the last); set pose.num_chunks: 2")

"""The model a command loads: `ModelSpec`, built once from the flags (`--model`, `--gguf-file`,
`--revision`, `--dtype`, `--attn-implementation`, `--device-map`, `--device`) with `--dtype auto`
and the device already resolved, and the loaders that read it. Commands pass a spec, never the
parsed arguments, so what was loaded is what the results record."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path

import torch

from ..data.embedded import load_model, load_tokenizer


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    model: str
    gguf_file: str | None = None
    revision: str | None = None
    dtype: str = "float32"          # a torch dtype name; "auto" only before `session.model_spec` resolves it
    device: str = "cpu"
    attn_implementation: str | None = None
    device_map: str | None = None

    @classmethod
    def from_args(cls, args, **resolved) -> ModelSpec:
        """The flags as given (a command without one of them gets the field's default), with
        `resolved` (dtype, device) taking their place."""
        given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
                 if getattr(args, f.name, None) is not None}
        return cls(**{**given, **resolved})

    def model_kwargs(self) -> dict:
        """transformers keyword arguments: dtype, and revision, attention and device map when given."""
        kwargs = {"dtype": "auto" if self.dtype == "auto" else getattr(torch, self.dtype)}
        for key in ("revision", "attn_implementation", "device_map"):
            if getattr(self, key):
                kwargs[key] = getattr(self, key)
        return kwargs


def load_tokenizer_from(spec: ModelSpec):
    return load_tokenizer(spec.model, spec.gguf_file, **({"revision": spec.revision} if spec.revision else {}))


def load_model_from(spec: ModelSpec):
    with _no_false_packed_warning(spec):
        model = load_model(name=spec.model, gguf_file=spec.gguf_file, **spec.model_kwargs())
    return (model if spec.device_map else model.to(spec.device)).eval()


class _DropPackedAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "is fastest in float32" not in record.getMessage()


@contextlib.contextmanager
def _no_false_packed_warning(spec: ModelSpec):
    """transformers 5 warns that a GGUF "with its weights packed is fastest in float32" whenever
    a GGUF is asked for in another dtype: quantizer_gguf.py `update_dtype` runs before
    `validate_environment` decides to dequantise (no GGUF kernel for the machine). When the
    weights will be dequantised (`gguf_kept_packed` False) the model computes in the dtype asked
    and the advice is false, contradicting `--dtype auto`'s measured choice: it is dropped for
    this load only (a filter on that one logger, removed after)."""
    from .auto_dtype import gguf_kept_packed
    from ..data.embedded import resolve_model
    if spec.dtype in ("float32", "auto"):
        yield
        return
    path, gguf = resolve_model(spec.model, spec.gguf_file)
    local = Path(path) / gguf if gguf else None
    if local is None or not local.is_file() or gguf_kept_packed(str(local)):
        yield
        return
    log, drop = logging.getLogger("transformers.quantizers.quantizer_gguf"), _DropPackedAdvice()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)

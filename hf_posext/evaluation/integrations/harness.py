"""lm-evaluation-harness on a patched model: the model type `hf-posext` (docs/retrieval.md).

lm-eval has no plugin discovery for model types: an integration registers its class with
`lm_eval.api.registry.register_model` in its own process, then runs lm-eval there (what
`hf-posext lm-eval` does). `PosextLM` is lm-eval's `HFLM` with the model patched after it loads:

    lm_eval --model hf-posext --model_args pretrained=PATH,method=yarn,factor=2,max_length=16384

model_args: `method` (any hf_posext method, attention-level ones included; default none),
`factor` (a scale, or auto = max(1, max_length / trained length); default auto) and any knob of
`RopeExtensionConfig` / the attention methods (e.g. beta_fast=64, window=4096); the rest go to
HFLM. `pretrained` may also be `embedded:smollm2-135m` or an already loaded model. Generation
holds a dynamic method's scale for prompt + max_gen_toks (`generation.fixed_rope_scale`), as
hf_posext's own `generate`. A static method saved with `save_pretrained` needs none of this:
lm-eval's plain `--model hf` reads its rope config (tests/test_lm_eval.py).

RULER's task builders load their tokenizer by name only (lm-eval 0.4.13,
`tasks/ruler/common_utils.get_tokenizer`: `AutoTokenizer.from_pretrained(tokenizer or
pretrained)`, no `gguf_file`), so a model whose tokenizer lives in a GGUF (the embedded default)
needs a folder: `tokenizer_folder` saves it once and `hf-posext lm-eval` passes it as `tokenizer=`.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from contextlib import contextmanager
from pathlib import Path

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from ...data.embedded import load_tokenizer, resolve_model
from ...generation import fixed_rope_scale
from ...patcher import patch, trained_length
from ...rope.knobs import factor_spec
from ..shared.data import cache_home
from ..shared.grid import canonical, check_knobs, knob_names, resolve_factor

MODEL_TYPE = "hf-posext"


def split_model_args(kwargs: dict) -> tuple[str, str, dict, dict]:
    """(method, factor spec, knobs, HFLM's own arguments) of lm-eval's model_args, checked
    before any model loads (ValueError naming the argument)."""
    rest = dict(kwargs)
    method = canonical(str(rest.pop("method", "none")))
    factor = str(rest.pop("factor", "auto"))
    knobs = {k: rest.pop(k) for k in knob_names() if k in rest}
    try:
        factor_spec(factor)   # the one factor check (rope/knobs.py); the text is kept for the grid
    except (TypeError, ValueError) as err:
        raise ValueError(f"model_args factor={factor}: {err}.") from None
    if method == "none" and (knobs or factor != "auto"):
        raise ValueError("model_args give a factor or knobs but no method=; name the method "
                         "(e.g. method=yarn).")
    if knobs:
        check_knobs([method], {"*": knobs})
    return method, factor, knobs, rest


def tokenizer_folder(pretrained: str, gguf_file: str | None = None,
                     cache: str | Path | None = None) -> str | None:
    """A folder with the tokenizer of a model whose tokenizer is inside a GGUF file (`pretrained`
    = `embedded:smollm2-135m`, or a folder with `gguf_file`), for RULER's task builders and HFLM
    (`tokenizer=`): saved once under `<cache>/tokenizers/<gguf name>-<key>` (key: the GGUF's
    path, size and modification time, so a changed file gets a new folder), then reused (reading
    a GGUF's tokenizer takes ~20 s here, the folder ~1 s). None for a model with its own
    tokenizer files, which RULER loads as it is."""
    folder, gguf = resolve_model(pretrained, gguf_file)
    path = Path(folder, gguf or "").expanduser().resolve()
    if not gguf or not path.is_file():   # a Hub GGUF repo: left to RULER as named
        return None
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    out = Path(cache or cache_home()) / "tokenizers" / f"{path.stem}-{key}"
    if not (out / "tokenizer_config.json").is_file():
        tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
        load_tokenizer(folder, gguf).save_pretrained(tmp)
        try:
            os.replace(tmp, out)   # whole or absent; another process's copy is just as good
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (out / "tokenizer_config.json").is_file():
                raise
    return str(out)


@contextmanager
def lm_eval_random_state():
    """Python's `random` state as lm-eval seeded it, restored after a model is built. lm-eval
    seeds `random` (`--seed`, evaluator.simple_evaluate), then builds the model, then the tasks:
    RULER draws its keys and values from the global `random` (tasks/ruler/prepare_niah.py
    `generate_random_number`), so whatever model construction draws or reseeds (vLLM's
    `seed` reseeds it) would change the samples; kept, both routes (`hf-posext`,
    `hf-posext-vllm`) build the same RULER prompts."""
    state = random.getstate()
    try:
        yield
    finally:
        random.setstate(state)


@register_model(MODEL_TYPE)
class PosextLM(HFLM):
    """HFLM with an hf_posext method applied to the loaded model (see the module docstring)."""

    def __init__(self, pretrained, **kwargs):
        with lm_eval_random_state():
            self._build(pretrained, **kwargs)

    def _build(self, pretrained, **kwargs):
        method, factor, knobs, rest = split_model_args(kwargs)
        if isinstance(pretrained, str):
            pretrained, gguf = resolve_model(pretrained, rest.get("gguf_file"))
            if gguf:
                rest["gguf_file"] = gguf
        super().__init__(pretrained=pretrained, **rest)
        self.posext_method = method
        if method != "none":
            trained = trained_length(self._model)
            s = resolve_factor(factor if factor == "auto" else float(factor), self.max_length, trained)
            patch(self._model, method, s, **knobs)
            self.posext_factor = s

    def _model_generate(self, context, max_length: int, stop, **generation_kwargs):
        with fixed_rope_scale(self.model, int(max_length)):
            return super()._model_generate(context, max_length, stop, **generation_kwargs)

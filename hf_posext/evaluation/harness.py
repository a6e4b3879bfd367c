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
"""

from __future__ import annotations

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from ..data.embedded import resolve_model
from ..generation import fixed_rope_scale
from ..patcher import patch, trained_length
from ..rope.knobs import factor_spec
from .grid import canonical, check_knobs, knob_names, resolve_factor

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


@register_model(MODEL_TYPE)
class PosextLM(HFLM):
    """HFLM with an hf_posext method applied to the loaded model (see the module docstring)."""

    def __init__(self, pretrained, **kwargs):
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

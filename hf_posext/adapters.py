"""PEFT adapters trained on an extended model: save them so PEFT's usual one-liners reload them
extended.

PEFT records where the base model came from in the adapter config (`base_model_name_or_path`,
taken from the base's `name_or_path` when the adapter is created), and
`AutoPeftModelForCausalLM.from_pretrained(adapter_dir)` loads the base from there with
`AutoModelForCausalLM.from_pretrained` (peft/auto.py). For a model extended after loading (by
`hf_posext.from_pretrained(path, method, ...)` or `patch`), that path holds the *un-extended*
checkpoint: the adapter silently comes back on a model with the original context window.

`save_adapter` therefore saves the extended base beside the adapter — the base's own weights,
recovered from the PEFT model with peft's `get_base_model_state_dict` (adapter weights and PEFT's
wrapper names removed), under the extended config — and points the adapter config at it. Then
both one-liners come back extended:

    model = AutoPeftModelForCausalLM.from_pretrained(adapter_dir)
    base = AutoModelForCausalLM.from_pretrained(PeftConfig.from_pretrained(adapter_dir).base_model_name_or_path)
    model = PeftModel.from_pretrained(base, adapter_dir)
"""

from __future__ import annotations

from pathlib import Path

from .attention.interface import CONFIG_KEY as ATTENTION_ENTRY
from .rope.compat import get_rope_parameters, text_config
from .portability.portable import ENTRY

EXTENDED_BASE = "extended_base"


def is_extended(config) -> bool:
    """True when a (text) config carries an extension: a rope type other than plain RoPE, or
    plain RoPE that is the portable form of one (`ntk` saved as a raised theta, with the
    `hf_posext` entry), or an attention-level method's entry."""
    if get_rope_parameters(config).get("rope_type", "default") != "default":
        return True
    return getattr(config, ENTRY, None) is not None or getattr(config, ATTENTION_ENTRY, None) is not None


def save_adapter(peft_model, adapter_dir, base_dir=None, **save_kwargs) -> Path:
    """Save `peft_model`'s adapter(s) to `adapter_dir` and its extended base to `base_dir`
    (default `adapter_dir/extended_base`), with every adapter config pointing at the base.

    `base_dir` is recorded as an absolute path (PEFT resolves it from the working directory):
    when you move the adapter, move the base with it and re-point `base_model_name_or_path`.
    `save_kwargs` go to `peft_model.save_pretrained`. Returns the base directory.
    The PEFT model's adapter configs keep pointing at the extended base afterwards."""
    import peft
    from peft import PeftModel

    get_base_model_state_dict = getattr(peft, "get_base_model_state_dict", None)
    if get_base_model_state_dict is None:  # first in peft 0.20.0 (huggingface/peft PR #3000)
        raise ImportError(f"hf_posext.save_adapter needs peft.get_base_model_state_dict, which "
                          f"peft {peft.__version__} lacks (it arrived in peft 0.20.0; tested with 0.21.2): "
                          "pip install -U 'peft>=0.20'")

    if not isinstance(peft_model, PeftModel):
        raise TypeError(f"save_adapter expects a peft PeftModel (from get_peft_model), got "
                        f"{type(peft_model).__name__}; a plain model saves with save_pretrained.")
    base = peft_model.get_base_model()
    if not is_extended(text_config(base.config)):
        raise ValueError("The base model under this adapter is not extended (plain RoPE), so "
                         "peft_model.save_pretrained(adapter_dir) already reloads it as trained.")
    adapter_dir = Path(adapter_dir)
    base_dir = Path(base_dir) if base_dir is not None else adapter_dir / EXTENDED_BASE
    base.save_pretrained(base_dir, state_dict=get_base_model_state_dict(peft_model))  # type: ignore[operator]  # peft types it nn.Module
    # From now on this PEFT model's adapters belong to the extended base (the model in memory
    # is extended), so later saves by peft itself point there too.
    for cfg in peft_model.peft_config.values():
        cfg.base_model_name_or_path = str(base_dir.resolve())
    peft_model.save_pretrained(str(adapter_dir), **save_kwargs)
    return base_dir

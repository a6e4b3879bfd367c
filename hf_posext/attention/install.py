"""Put an attention method on (or off) one model's config: the patcher's dispatch into this package.

What a patched config carries, and what `save_pretrained` writes to config.json:
- `hf_posext_attention`: {"method", "trained_length", <knobs>} — read by the attention function;
- `attn_implementation: "hf_posext"` — transformers' config constructor turns this key into the
  model's attention implementation on load (4.57 and 5.x), so `AutoModelForCausalLM` reloads the
  method after `import hf_posext`. Without hf_posext, loading raises transformers' "Specified
  attn_implementation is not supported" error; passing `attn_implementation="sdpa"` loads the
  model with plain attention (the method ignored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..rope.compat import rotary_dim, text_config
from .config import ALL_KNOBS, ATTENTION_METHODS, AttentionExtensionConfig
from .interface import CONFIG_KEY, IMPLEMENTATION
from .units import LOGN_SCALING, UNITS

# config attributes the patcher snapshots and `unpatch` restores
RAW_KEYS = (CONFIG_KEY, "attn_implementation", "_attn_implementation_internal")


def is_attention_method(method) -> bool:
    return isinstance(method, str) and method.lower() in ATTENTION_METHODS


def split(method, params: dict[str, Any], trained: int, target_length: int | None = None):
    """(attention spec or None, the rope method or None, the rope method's params).
    `target_length` (s·L) is recorded when a knob is "auto", which is fitted to it.

    An attention method runs on plain RoPE (rope method None); a rope method with `logn=True`
    gets the log-n scaling on top. Attention knobs given to a rope method are refused."""
    params = dict(params)
    if is_attention_method(method):
        knobs = {k: params.pop(k) for k in list(params) if k in ALL_KNOBS}
        if params:
            raise TypeError(f"{method!r} does not take {sorted(params)}; it takes "
                            f"{sorted(AttentionExtensionConfig(method, trained).knobs)} and factor.")
        if "auto" in knobs.values():
            knobs["target_length"] = target_length
        spec = AttentionExtensionConfig(method.lower(), trained, **knobs)
        reach = UNITS[spec.method].reach
        if reach is not None and target_length is not None:
            reach(spec, target_length)   # a target the knobs cannot keep inside L (STRING)
        return spec, None, {}
    stray = sorted(set(params) & (set(ALL_KNOBS) - {LOGN_SCALING.name}))
    if stray:
        raise TypeError(f"{stray} are knobs of the attention methods ({', '.join(ATTENTION_METHODS)}), "
                        f"not of {method!r}.")
    logn = LOGN_SCALING.check(params.pop(LOGN_SCALING.name, LOGN_SCALING.default), trained)
    return (AttentionExtensionConfig("logn", trained) if logn else None), method, params


def saved_trained_length(raw_config: dict[str, Any]) -> int | None:
    """L recorded by an attention method in a checkpoint (its max_position_embeddings may be s·L)."""
    entry = raw_config.get(CONFIG_KEY)
    return int(entry["trained_length"]) if isinstance(entry, dict) and "trained_length" in entry else None


def install(config, spec: AttentionExtensionConfig | None, raw_config: dict[str, Any]) -> None:
    """Switch this config to `spec`, or back to the attention it had before hf_posext (None)."""
    if spec is not None:
        fits(spec, config)
        setattr(config, CONFIG_KEY, spec.to_dict())
        config.attn_implementation = IMPLEMENTATION      # what save_pretrained writes
        config._attn_implementation = IMPLEMENTATION     # what the attention modules read
        return
    if CONFIG_KEY not in config.__dict__ and config._attn_implementation != IMPLEMENTATION:
        return                                           # never had one: leave it untouched
    config.__dict__.pop(CONFIG_KEY, None)
    config.__dict__.pop("attn_implementation", None)
    original = raw_config.get("_attn_implementation_internal")
    # a checkpoint saved with a method: its "original" attention is the method; go back to SDPA
    config._attn_implementation = "sdpa" if original in (None, IMPLEMENTATION) else original


def check_entry(name, config) -> None:
    """A checkpoint saved with an attention method (config.json `attn_implementation:
    hf_posext`) must carry the method's entry: without it the model loads, then fails at the
    first forward. Refused before weights load (`loading.check_config_early`)."""
    config = text_config(config)
    wanted = IMPLEMENTATION in (getattr(config, "_attn_implementation_internal", None),
                                config.__dict__.get("attn_implementation"))
    raw_path = Path(str(name)) / "config.json"   # 4.57's config drops the key: read the file
    if not wanted and raw_path.is_file():
        try:
            raw = json.loads(raw_path.read_text(encoding="utf-8"))
        except ValueError:
            raw = {}   # refused, naming the file, by loading._check_saved_rope
        raw = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
        wanted = raw.get("attn_implementation") == IMPLEMENTATION
    if wanted and not isinstance(getattr(config, CONFIG_KEY, None), dict):
        raise ValueError(f"{name}: config.json sets attn_implementation {IMPLEMENTATION!r} but has no "
                         f"{CONFIG_KEY!r} entry (the attention method and its knobs; deleted?). "
                         "Restore the entry from the saved checkpoint, or load with "
                         "attn_implementation='sdpa' to run plain attention.")
    if isinstance(getattr(config, CONFIG_KEY, None), dict):
        fits(AttentionExtensionConfig.from_dict(getattr(config, CONFIG_KEY)), config)


def fits(spec: AttentionExtensionConfig, config) -> None:
    """The unit's check of its knobs against the model's shape (DPE's groups and key_dims)."""
    check = UNITS[spec.method].fits
    if check is not None:
        config = text_config(config)
        check(spec, config.num_hidden_layers, config.num_attention_heads, rotary_dim(config) // 2)


def after_load(model, explicit: bool = False) -> None:
    """After `hf_posext.from_pretrained`: a checkpoint saved with a method runs it again, unless
    the caller chose an attn_implementation. transformers 5.x already did (from config.json's
    `attn_implementation`); 4.57 drops that key on load. Either way it is written back, so saving
    the loaded model keeps the method."""

    config = text_config(model.config)
    entry = getattr(config, CONFIG_KEY, None)
    if not isinstance(entry, dict):
        return
    if not explicit:
        AttentionExtensionConfig.from_dict(entry)  # a hand-edited entry fails here, clearly
        config._attn_implementation = IMPLEMENTATION
    if config._attn_implementation == IMPLEMENTATION:
        config.attn_implementation = IMPLEMENTATION

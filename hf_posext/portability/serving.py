"""`hf-posext serve PATH --engine E`: the one command line that serves a checkpoint at its extended
length in engine E, exactly as transformers + hf_posext run it, or a refusal naming why
(docs/serving.md).

Every command is checked with the reader re-derivations of `engines.py` (the same check as
`export`): the config the engine will see — config.json with the command's overrides applied —
must run the checkpoint's meaning in each release of the engine hf_posext knows. What each
engine takes on its command line:

- vLLM (`vllm serve`): `--max-model-len`, and `--hf-overrides JSON` (vLLM removed `--rope-scaling`
  / `--rope-theta` in 0.11.1, PR 28006). The override carries the rope under `rope_parameters`
  with `rope_theta` inside: vLLM's `patch_rope_parameters` (vllm/transformers_utils/config.py)
  builds `rope_parameters` from `rope_scaling` when transformers 4.x is installed and
  transformers 5.x reads it natively; measured with vLLM 0.29.0 and 0.32.0
  (tests/engines/test_serve_engines.py). vLLM refuses a `--max-model-len` above the length it
  derives (`_get_and_verify_max_len`; config_audit.derived_lengths), so when that is short the
  override also sets `max_position_embeddings`.
- SGLang (`python -m sglang.launch_server`): `--context-length`, `--json-model-override-args
  JSON` with `rope_scaling` + `rope_theta` (what its model files read: `getattr(config,
  "rope_scaling")`), or the `dual_chunk_attention_config` entry (dual_chunk.py).
- llama.cpp (`llama-server`): `-c` (the server's slot context defaults to the trained one), and
  for each rope key the converter's GGUF lacks or holds differently, the run-time flag
  (`--rope-scaling`, `--rope-scale`, `--rope-freq-base`, `--yarn-orig-ctx`, `--yarn-beta-fast/-slow`:
  common/arg.cpp; llama-context.cpp takes a flag over the GGUF key). The YaRN temperature has no
  working flag (llama-context.cpp recomputes `yarn_attn_factor` when YaRN is on and multiplies it
  by the GGUF's `rope.scaling.attn_factor`): a temperature the GGUF lacks is refused, pointing to
  `export --target gguf`, whose GGUF `--gguf` then names (its keys are read).
- TGI (`text-generation-launcher`): `--max-input-tokens` / `--max-total-tokens`, and only
  `--rope-scaling linear|dynamic` + `--rope-factor` (its launcher's ROPE_SCALING / ROPE_FACTOR);
  no other config key can be overridden.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import config_audit, dual_chunk, engines, portable, readers
from .exporting import choose_form, longrope_for_vllm
from . import gguf_export
from .gguf_export import rope_keys
from .meaning import TOLERANCE, errors
from .verdicts import load_config, meaning, verdict
from ..attention.config import AttentionExtensionConfig
from ..attention.interface import CONFIG_KEY as ATTENTION_KEY
from ..rope.compat import v4_scaling
from ..rope.config import RopeExtensionConfig

ENGINES = ("vllm", "sglang", "llama.cpp", "tgi")
# llama.cpp's run-time flags for the GGUF rope keys (common/arg.cpp), and llama_cpp.Llama's names
FLAGS = {"rope.scaling.type": "--rope-scaling", "rope.scaling.factor": "--rope-scale",
         "rope.freq_base": "--rope-freq-base", "rope.scaling.original_context_length": "--yarn-orig-ctx",
         "yarn_beta_fast": "--yarn-beta-fast",
         "yarn_beta_slow": "--yarn-beta-slow"}


class ServeRefused(ValueError):
    """The engine cannot run the checkpoint exactly; the message says why."""


@dataclass(frozen=True)
class Serving:
    """A command: argv, the length it serves, and the config keys it overrides (vLLM, SGLang)."""
    engine: str
    argv: tuple[str, ...]
    length: int
    overrides: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def line(self) -> str:
        """One pasteable shell line (shlex-quoted); no environment variable is ever needed."""
        return shlex.join(self.argv)


def _number(value: float) -> str:
    return f"{value:.10g}"


def _extended(cfg: dict[str, Any], method: str, factor: float, knobs: dict[str, Any]) -> dict[str, Any]:
    """The config `hf_posext.patch(model, method, factor, **knobs)` would save for this base
    checkpoint (config.json only: nothing is loaded)."""
    base = meaning(cfg)
    if base.spec is not None or base.attention is not None:
        raise ServeRefused(f"the checkpoint is already extended ({base.label}); serve it without "
                           "--method, or pass the unmodified base checkpoint")
    L = int(cfg["max_position_embeddings"])
    if method == "dual_chunk":
        spec = AttentionExtensionConfig(method, trained_length=L, **knobs)
        attention = spec.to_dict()   # the entry `patch` saves (attention/install.py)
        return {**cfg, "max_position_embeddings": round(L * factor), ATTENTION_KEY: attention,
                "attn_implementation": "hf_posext"}
    spec = RopeExtensionConfig(method=method, factor=factor, trained_length=L, **knobs)
    rope = engines.v5_rope(cfg)
    extra = {k: v for k, v in rope.items() if k == "partial_rotary_factor"}
    saved = portable.saved_rope(spec, {"rope_type": "default", "rope_theta": float(rope["rope_theta"]),
                                       **extra}, engines.read_rotary_dim(cfg, rope))
    # patch keeps max_position_embeddings = L for the dynamic methods (docs/portability.md §1)
    length = L if spec.is_dynamic else round(L * factor)
    return {**cfg, "rope_parameters": saved, "rope_scaling": v4_scaling(saved),
            "rope_theta": saved["rope_theta"], "max_position_embeddings": length,
            portable.ENTRY: portable.entry(spec, float(rope["rope_theta"]))}


def _target_length(cfg: dict[str, Any], target) -> int:
    if target.spec is not None:
        L = target.spec.trained_length or cfg["max_position_embeddings"]
        return round(L * target.spec.factor)
    return int(cfg["max_position_embeddings"])


def _rope_changes(before: dict[str, Any], after: dict[str, Any]) -> bool:
    return engines.v5_rope(before) != engines.v5_rope(after) or \
        engines.v4_rope(before) != engines.v4_rope(after)


def _exact_config(cfg: dict[str, Any], engine: str, target) -> dict[str, Any]:
    """The config the engine must read: `cfg` itself when every release of `engine` runs it
    exactly, else the form `export` would write (exporting.choose_form), else ServeRefused."""
    ids = readers.of_target(engine) + readers.of_target("transformers")
    if all(verdict(r, cfg, target).status == "exact" for r in ids):
        return cfg
    try:
        return choose_form(cfg, engine, target) or cfg
    except ValueError as err:
        said = str(err).replace("export refused: ", "")
        raise ServeRefused(said.split(" knows: ", 1)[-1]) from None


def command(path, engine: str, method: str | None = None, factor: float | None = None,
            knobs: dict[str, Any] | None = None, gguf: str | None = None) -> Serving:
    """The command serving the checkpoint at `path` in `engine` at its extended length, or, with
    `method` / `factor`, the unmodified base checkpoint at `path` extended at serve time (no new
    folder). ServeRefused (a ValueError) when the engine cannot run it exactly."""
    key = str(engine).lower()
    if key not in ENGINES:
        raise ServeRefused(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if (method is None) != (factor is None):
        raise ServeRefused("--method and --factor go together (the override route extends a base "
                           "checkpoint at serve time)")
    cfg = load_config(path)
    found = config_audit.problems(cfg)
    if found:
        raise ServeRefused(found[0].removeprefix("error: "))
    wanted: dict[str, Any] | None = None
    try:
        wanted = _extended(cfg, method, float(factor), dict(knobs or {})) if method else cfg
        target = meaning(wanted)
    except engines.NotApplicable as err:
        if key == "vllm" and wanted is not None and engines.v5_rope(wanted)["rope_type"] == "longrope":
            # a longrope checkpoint, or a method saved as one (cope) at serve time
            return _vllm_longrope(str(path), wanted, cfg)
        raise ServeRefused(f"rope_type {err} is transformers' own, not an hf_posext method: serve it "
                           "with the engine's own command (hf-posext check PATH gives the length "
                           "each engine derives)") from None
    return _BUILDERS[key](str(path), cfg, wanted, target, gguf)


def _vllm_longrope(path: str, cfg: dict[str, Any], base: dict[str, Any]) -> Serving:
    """A `longrope` checkpoint (what `hf-posext search` saves; or `cfg`, what `patch` would save
    for the base checkpoint `base` with a method saved as longrope, e.g. cope) in vLLM: the form
    `export --target vllm` writes (short_mscale = long_mscale = attention_factor, measured exact in 0.29 and
    0.32), one factor set only: with two, vLLM runs long_factor at every position once
    max_model_len > L (measured, docs/portability.md §6)."""
    if config_audit.two_factor_sets(cfg):
        raise ServeRefused("two longrope factor sets: vLLM runs long_factor at every position "
                           "whenever max_model_len > L, so prompts <= L do not get short_factor "
                           "(hf-posext search --short-factors same writes one set)")
    try:
        chosen = longrope_for_vllm(cfg)
    except ValueError as err:
        raise ServeRefused(str(err).replace("export refused: ", "")) from None
    length = int(cfg["max_position_embeddings"])
    overrides: dict[str, Any] = {"rope_parameters": engines.v5_rope(chosen)}
    if length != base["max_position_embeddings"]:   # --method: the base checkpoint's is L
        overrides["max_position_embeddings"] = length
    argv = ("vllm", "serve", path, "--max-model-len", str(length), "--hf-overrides",
            json.dumps(overrides, sort_keys=True))
    return Serving("vllm", argv, length, overrides)


def _config_engine(cfg, wanted, target, engine: str) -> tuple[dict[str, Any], int]:
    """(overrides, length) for the engines that take config keys on the command line."""
    if target.attention is not None:
        if engine == "sglang":   # SGLang's Dual Chunk Attention (dual_chunk.py)
            reason = dual_chunk.why_not(wanted, target)
            if reason:
                raise ServeRefused(reason)
            need = dual_chunk.sglang_config(wanted, target)
            return ({k: need[k] for k in (dual_chunk.CONFIG_KEY, "max_position_embeddings")
                     if need.get(k) != cfg.get(k)}, int(need["max_position_embeddings"]))
        raise ServeRefused(f"{engine} reads no attention method from config.json: "
                           f"{target.attention.get('method')!r} would run as plain attention")
    chosen = _exact_config(wanted, engine, target)
    overrides: dict[str, Any] = {}
    if _rope_changes(cfg, chosen):
        rope = engines.v5_rope(chosen)
        overrides = ({"rope_parameters": rope} if engine == "vllm" else
                     {"rope_scaling": v4_scaling(rope), "rope_theta": rope["rope_theta"]})
    length = _target_length(wanted, target)
    seen = {**chosen, "max_position_embeddings": cfg["max_position_embeddings"]}
    # the override route sets what patch saves (max_position_embeddings = s·L but for dynamic
    # methods); any route sets it when the engine would derive less than the length served
    if wanted["max_position_embeddings"] != cfg["max_position_embeddings"] or \
            config_audit.derived_lengths(seen)[engine] < length:
        length_key = max(length, wanted["max_position_embeddings"])
        overrides["max_position_embeddings"] = length_key
        seen["max_position_embeddings"] = length_key
    # what the engine reads with the overrides applied must still be exact (e.g. vLLM's dynamic
    # table is sized by max_position_embeddings)
    bad = [v for r in readers.of_target(engine) if (v := verdict(r, seen, target)).status != "exact"]
    if bad:
        raise ServeRefused("; ".join(f"{v.name} {v.cell()}" + (f" ({v.detail})" if v.detail else "")
                                     for v in bad))
    return overrides, length


def _vllm(path, cfg, wanted, target, gguf) -> Serving:
    overrides, length = _config_engine(cfg, wanted, target, "vllm")
    argv = ["vllm", "serve", path, "--max-model-len", str(length)]
    if overrides:
        argv += ["--hf-overrides", json.dumps(overrides, sort_keys=True)]
    return Serving("vllm", tuple(argv), length, overrides)


def _sglang(path, cfg, wanted, target, gguf) -> Serving:
    overrides, length = _config_engine(cfg, wanted, target, "sglang")
    argv = ["python", "-m", "sglang.launch_server", "--model-path", path, "--context-length",
            str(length)]
    if overrides:
        argv += ["--json-model-override-args", json.dumps(overrides, sort_keys=True)]
    notes = ("SGLang is re-derived from its source, not run here (no CPU build)",)
    if dual_chunk.CONFIG_KEY in overrides or dual_chunk.CONFIG_KEY in cfg:
        notes += ("Dual Chunk Attention runs in SGLang's dual_chunk_flash_attn backend: CUDA only",)
    return Serving("sglang", tuple(argv), length, overrides, notes=notes)


def _tgi(path, cfg, wanted, target, gguf) -> Serving:
    if target.attention is not None:
        raise ServeRefused(f"TGI reads no attention method: {target.attention.get('method')!r} "
                           "would run as plain attention")
    length = _target_length(wanted, target)
    argv = ["text-generation-launcher", "--model-id", path]
    if wanted is not cfg:  # override route: only linear / dynamic can be set by the launcher
        kind = engines.v4_rope(wanted)["rope_type"]
        seen = {**cfg, "rope_scaling": {"type": kind, "factor": target.spec.factor}}
        if kind not in ("linear", "dynamic") or verdict(readers.TGI.id, seen, target).status != "exact":
            why = verdict(readers.TGI.id, seen, target) if kind in ("linear", "dynamic") else None
            raise ServeRefused("TGI's launcher sets only --rope-scaling linear|dynamic; "
                               + (f"TGI {why.cell()} ({why.detail})" if why else
                                  f"{target.spec.method} is saved as rope_type {kind!r}")
                               + ": save the checkpoint with hf_posext and serve it instead")
        argv += ["--rope-scaling", kind, "--rope-factor", _number(target.spec.factor)]
    elif _exact_config(wanted, "tgi", target) is not wanted:
        raise ServeRefused("TGI runs this checkpoint exactly only with another config form: "
                           "hf-posext export PATH OUT --target tgi, then serve OUT")
    argv += ["--max-input-tokens", str(length - 1), "--max-total-tokens", str(length)]
    return Serving("tgi", tuple(argv), length,
                   notes=("TGI is re-derived from its source, not run here",))


def _gguf_holds(cfg: dict[str, Any], gguf: str | None) -> dict[str, Any]:
    """The rope keys (without the `{arch}.` prefix) the GGUF holds: read from `gguf` when that
    file exists (e.g. written by `export --target gguf`), else what llama.cpp's converter writes
    for this config.json (engines.llama_cpp): freq base, scaling type/factor/original context,
    never `rope.scaling.attn_factor`."""
    if gguf is not None and Path(gguf).is_file():
        reader = gguf_export._gguf().GGUFReader(gguf)
        found = {k: f.contents() for k, f in reader.fields.items()}
        arch = found.get("general.architecture")
        keys = {k.removeprefix(f"{arch}."): v for k, v in found.items() if k.startswith(f"{arch}.rope.")}
        return {"rope.freq_base": 10_000.0, "rope.scaling.type": "none", **keys}
    rope = engines.converter_rope(cfg)
    kind, s = rope["rope_type"], rope.get("factor")
    keys = {"rope.freq_base": float(rope["rope_theta"]), "rope.scaling.type": "none"}
    if kind in ("linear", "yarn") and s is not None:
        keys.update({"rope.scaling.type": kind, "rope.scaling.factor": float(s)})
    if kind == "yarn" and s is not None:
        keys["rope.scaling.original_context_length"] = int(rope["original_max_position_embeddings"])
    return keys


def llama_flags(cfg: dict[str, Any], target, gguf: str | None = None) -> dict[str, Any]:
    """The llama.cpp run-time flags (FLAGS names) that make the GGUF (`gguf`, else the
    converter's of `cfg`) run `target` exactly; ServeRefused when none can."""
    if target.attention is not None:
        raise ServeRefused(f"llama.cpp reads no attention method: {target.attention.get('method')!r} "
                           "would run as plain attention")
    try:
        keys, betas = rope_keys(target)
    except ValueError as err:
        raise ServeRefused(str(err).replace("export refused: ", "")) from None
    holds = _gguf_holds(cfg, gguf)
    attn = "rope.scaling.attn_factor"
    if abs(keys.get(attn, 1.0) - holds.get(attn, 1.0)) > TOLERANCE * keys.get(attn, 1.0):
        # llama-context.cpp: with YaRN on, cparams.yarn_attn_factor is recomputed from the
        # factor and multiplied by the GGUF's rope.scaling.attn_factor: no flag sets it
        raise ServeRefused(f"llama.cpp takes the YaRN temperature of {target.label} only from the "
                           f"GGUF key {attn} (--yarn-attn-factor is overwritten when YaRN is on): "
                           "write it with hf-posext export PATH OUT.gguf --target gguf --gguf "
                           "CONVERTED.gguf, then serve with --gguf OUT.gguf")
    flags = {FLAGS[k]: v for k, v in keys.items() if k != attn and holds.get(k) != v}
    if keys.get("rope.scaling.type") == "yarn" and "rope.scaling.original_context_length" not in holds:
        flags[FLAGS["rope.scaling.original_context_length"]] = keys["rope.scaling.original_context_length"]
    flags.update({FLAGS[k]: v for k, v in betas.items()})
    # check: what the runtime computes from the GGUF's keys overridden by the flags
    run = {**holds, **{k: flags[f] for k, f in FLAGS.items() if f in flags}}
    run[attn] = holds.get(attn, 1.0)
    d, base = target.dim, run["rope.freq_base"]
    if run["rope.scaling.type"] == "yarn":
        reading = engines.gguf_reading(d, base, run["rope.scaling.factor"],
                                       run.get("rope.scaling.original_context_length",
                                               cfg["max_position_embeddings"]),
                                       run.get("rope.scaling.attn_factor", 1.0),
                                       run.get("yarn_beta_fast", 32.0), run.get("yarn_beta_slow", 1.0))
    else:
        inv = engines.plain(d, base)
        reading = engines.Reading(engines.static(inv / run.get("rope.scaling.factor", 1.0)
                                                 if run["rope.scaling.type"] == "linear" else inv))
    if max(errors(reading, target)) > TOLERANCE:  # a guard on the mapping above
        raise ServeRefused(f"llama.cpp's flags would not run {target.label} exactly")
    return flags


def _llama(path, cfg, wanted, target, gguf) -> Serving:
    flags = llama_flags(cfg, target, gguf)   # the GGUF is converted from the folder as it is
    length = _target_length(wanted, target)
    model = gguf or "MODEL.gguf"
    argv = ["llama-server", "-m", model, "-c", str(length)]
    for flag, value in flags.items():
        argv += [flag, value if isinstance(value, str) else _number(value)]
    notes = () if gguf else (f"MODEL.gguf: python convert_hf_to_gguf.py {shlex.quote(path)} "
                             "--outfile MODEL.gguf (llama.cpp's converter; flags assume its keys)",)
    return Serving("llama.cpp", tuple(argv), length, notes=notes)


_BUILDERS = {"vllm": _vllm, "sglang": _sglang, "tgi": _tgi, "llama.cpp": _llama}

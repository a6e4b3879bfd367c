"""Command-line inputs of `hf-posext`: parsing and every check that can run before a model
loads. Each error names the flag and the fix, and is reported as `hf-posext <cmd>: error: ...`
with exit status 2."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from ... import catalog as _catalog   # read at call time: methods registered later count too
from ...data.documents import looks_like_path
from ...data.embedded import resolve_model
from ...errors import BeyondReach, ConfigError, check_seed
from ...loading import check_config_early
from ...patcher import plan_for_config, trained_length
from ...rope.knobs import factor_spec
from .grid import canonical, check_knobs, integral_knobs, knob_names, knobs_for, method_factors

# the weights save_pretrained writes (transformers.utils: SAFE_WEIGHTS_NAME, WEIGHTS_NAME and their indexes)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


class InputError(ConfigError):
    """Bad command-line input, reported as `hf-posext <cmd>: error: ...` (exit status 2)."""
# --- argument types: each names the flag and the fix --------------------------------------------

def parse_length(text: str, flag: str = "--lengths") -> int:
    """`4k` -> 4096 (k = 1024, as context lengths are quoted), `16384` -> 16384; errors name `flag`."""
    m = re.fullmatch(r"\s*([+-]?\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if not m:
        raise InputError(f"{flag}: {text!r} is not a length; write e.g. 4k, 16k or 16384.")
    value = float(m.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2}[m.group(2).lower()]
    if value != int(value) or value <= 0:
        raise InputError(f"{flag}: {text!r} must be a positive whole number of tokens.")
    return int(value)


TIME_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def parse_wall_time(text: str, flag: str = "--budget") -> float:
    """`30m` -> 1800.0 seconds (also 2h, 90s): the one spelling of a wall time in every command."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)", text.strip().lower())
    if not m or float(m[1]) <= 0:
        raise InputError(f"{flag} {text!r}: give a wall time as 30m, 2h or 90s.")
    return float(m[1]) * TIME_UNITS[m[2]]


def comma_items(text: str | None) -> list[str]:
    """A comma-separated flag's items, stripped, empty ones dropped (`a, b,,c` -> [a, b, c])."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def parse_lengths(text: str) -> list[int]:
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise InputError("--lengths is empty; give e.g. 4k,8k,16k.")
    lengths = sorted({parse_length(t) for t in items})
    if lengths[0] < 2:   # a 1-token window predicts nothing: perplexity over 0 tokens
        raise InputError(f"--lengths: {lengths[0]} is too short; a window scores its tokens after "
                         "the first, so use lengths >= 2 (e.g. 4k,8k).")
    return lengths


def parse_methods(text: str) -> list[str]:
    """Names from `hf_posext.catalog.METHODS` (aliases resolved), `none`, or `all`."""
    out = []
    for name in comma_items(text):
        try:
            names = list(_catalog.METHODS) if name.lower() == "all" else [canonical(name)]
        except ValueError:
            raise InputError(f"--methods: unknown method {name!r}; use none or any of "
                             f"{', '.join(_catalog.METHODS)} (or all).") from None
        out += [n for n in names if n not in out]
    if not out:
        raise InputError("--methods is empty; give e.g. none,linear,ntk,yarn.")
    return out


def _knob_value(item: str, name: str, value: str):
    """A number, true/false (`logn`), `auto` (leaky ReRoPE's leak, Self-Extend's group_size), a
    dash-separated list (DPE's group_scales=2-8-2-8-32-32-32-4, the reference's --group_sizes
    form) or @FILE.json: the knob of that name in a JSON object (what hf-posext dpe-detect writes)."""
    if value.startswith("@"):
        try:
            data = json.loads(Path(value[1:]).read_text())
        except (OSError, ValueError) as err:
            raise InputError(f"--knobs: {item!r}: cannot read {value[1:]!r} as JSON ({err}).") from None
        if not isinstance(data, dict) or name not in data:
            raise InputError(f"--knobs: {item!r}: {value[1:]!r} holds no {name!r} (hf-posext "
                             "dpe-detect writes group_scales, and key_dims with --top-dims).")
        return data[name]
    if "-" in value.strip("-") and all(p.strip().isdigit() for p in value.split("-")):
        return [int(p) for p in value.split("-")]
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    if value.lower() == "auto":
        return "auto"
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"--knobs: {item!r}: {value!r} is not a number, true/false or auto.") from None
    # token counts stay integers (so rows and saved configs read 4096, not 4096.0)
    return int(number) if number.is_integer() and name in integral_knobs() else number


def parse_knobs(text: str | None, methods: list[str]) -> dict:
    """`beta_fast=64,yarn:mscale_coefficient=0.07` -> {"*": {...}, "yarn": {...}}; names from
    the fields of `RopeExtensionConfig`, values checked by it for every method of the grid."""

    knobs: dict = {}
    for item in comma_items(text):
        target, _, assignment = item.rpartition(":") if ":" in item.split("=")[0] else ("", "", item)
        name, eq, value = assignment.partition("=")
        if not eq:
            raise InputError(f"--knobs: {item!r} is not NAME=VALUE (knobs: {', '.join(knob_names())}).")
        knobs.setdefault(target or "*", {})[name.strip()] = _knob_value(item, name.strip(), value.strip())
    try:
        check_knobs(methods, knobs)
    except ValueError as err:
        raise InputError(f"--knobs: {err}") from None
    return knobs


def parse_factors(text: str) -> list:
    """--factor: "auto" and/or scales, each checked by the one factor spec (rope/knobs.py)."""
    out: list[float | str] = []
    for item in comma_items(text):
        try:
            out.append(factor_spec(item))
        except (TypeError, ValueError) as err:
            raise InputError(f"--factor: {err}.") from None
    if not out:
        raise InputError("--factor is empty; give auto or numbers such as 2,4.")
    return out


def parse_floats01(text: str, flag: str) -> list[float]:
    out = []
    for item in comma_items(text):
        try:
            value = float(item.rstrip("%")) / (100 if item.endswith("%") else 1)
        except ValueError:
            raise InputError(f"{flag}: {item!r} is not a number.") from None
        if not 0.0 <= value <= 1.0:
            raise InputError(f"{flag}: {item} must be between 0 and 1 (or 0%..100%).")
        out.append(value)
    if not out:
        raise InputError(f"{flag} is empty.")
    return sorted(set(out))


def parse_seed(text, flag: str = "--seed") -> int:
    """--seed: one integer >= 0 (errors.check_seed: the one seed convention)."""
    try:
        return check_seed(flag, int(str(text).strip()))
    except ValueError as err:
        raise InputError(str(err) if "must be" in str(err) else
                         f"{flag} must be an integer >= 0, got {text!r}.") from None


def positive_int(flag: str, value) -> int | None:
    if value is None:
        return None
    if value <= 0:
        raise InputError(f"{flag} must be a positive integer, got {value}.")
    return value


def check_device(device, flag: str = "--device ") -> None:
    """A device string torch accepts and this machine has (checked before loading). `flag`
    prefixes the messages: `--device ` for the CLI, `device=` for the Python API."""
    device = str(device)
    m = re.fullmatch(r"(cpu|mps|cuda|xpu)(?::(\d+))?", device)
    if not m:
        raise InputError(f"{flag}{device!r}: use cpu, cuda, cuda:N or mps.")
    kind, index = m.group(1), int(m.group(2) or 0)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"{flag}{device}: CUDA is not available on this machine (torch "
                             f"{torch.__version__}); use {flag}cpu.")
        if index >= torch.cuda.device_count():
            raise InputError(f"{flag}{device}: this machine has {torch.cuda.device_count()} "
                             "CUDA device(s).")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise InputError(f"{flag}{device}: MPS is not available here; use {flag}cpu.")
    if kind == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise InputError(f"{flag}{device}: XPU is not available here; use {flag}cpu.")


def check_model_arg(model: str, gguf_file: str | None, default_model: str,
                    revision: str | None = None, read_default: bool = False):
    """--model and --gguf-file, then the model's config.json (or GGUF metadata) read without
    weights: no RoPE, an unsupported architecture or a hand-edited config fail here. Returns
    that config; for the embedded default only with `read_default` (its GGUF header takes
    seconds to parse), else None."""
    if model == default_model:
        if gguf_file:
            raise InputError(f"--gguf-file is for your own GGUF checkpoint; {default_model} "
                             "already names its file.")
        if not read_default:
            return None
        path, gguf = resolve_model(default_model)
        return check_config_early(path, {"gguf_file": gguf} if gguf else {})
    if looks_like_path(model) or os.path.exists(model):
        path = Path(model).expanduser()
        if not path.exists():
            raise InputError(f"--model {model!r}: no such folder.")
        if gguf_file and not (path / gguf_file).is_file():
            raise InputError(f"--gguf-file {gguf_file!r} is not in {path}.")
        if path.is_dir() and not gguf_file and not any((path / name).is_file() for name in WEIGHT_FILES):
            raise InputError(f"--model {model!r} holds no weights ({', '.join(WEIGHT_FILES)}); pass the "
                             "folder save_pretrained wrote, or its GGUF with --gguf-file.")
    kwargs = {k: v for k, v in (("gguf_file", gguf_file), ("revision", revision)) if v}
    try:
        return check_config_early(model, kwargs)
    except ValueError as err:
        raise InputError(f"--model: {err}") from None


def check_cells(config, methods, lengths, factors, knobs, skip_unfit: bool = False) -> tuple:
    """Every (method, factor, length) cell planned on the model's config before its weights
    load (`patcher.plan_for_config`: knobs against the trained length L, e.g. a window above L,
    read from config.json). A cell whose target the method cannot keep inside L (`BeyondReach`,
    STRING past L + S − W), or that the method's defaults cannot plan at this L (no knobs given
    for it), is refused, or with `skip_unfit` (`--methods all`: every method, so none was asked
    for by name) left out with a note. Returns the (method, length, s) cells left out."""
    L = trained_length(SimpleNamespace(config=config))
    skipped: dict[str, list[tuple[int, float]]] = {}
    why: dict[str, str] = {}
    for length in sorted(set(lengths)):
        for method, _, s in method_factors(methods, factors, length, L):
            if method == "none":
                continue
            try:
                plan_for_config(config, method, s, None, knobs_for(method, knobs))
            except (ValueError, TypeError) as err:
                # unfit: past the knobs' reach, or the method's own defaults cannot run at this
                # L (STRING's W = 128 >= S = 0.33·L below L = 388); knobs given are the user's
                unfit = isinstance(err, BeyondReach) or not knobs_for(method, knobs)
                if skip_unfit and unfit:
                    skipped.setdefault(method, []).append((length, s))
                    why.setdefault(method, str(err))
                    continue
                if isinstance(err, BeyondReach):
                    raise InputError(f"--methods {method} at --lengths {length} (s = {s:g}): {err}") from None
                raise InputError(f"{method} at --lengths {length} (s = {s:g}, trained length "
                                 f"{L}): {err}") from None
    for method, at in skipped.items():
        print(f"note: --methods all: {method} skipped at "
              f"{', '.join(f'{n} tokens (s = {s:g})' for n, s in at)} "
              f"(docs/attention_methods.md): {why[method]}", file=sys.stderr)
    return tuple((m, n, s) for m, at in skipped.items() for n, s in at)

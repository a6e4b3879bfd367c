"""Save every method in the form most readers load exactly without hf_posext (docs/portability.md).

What config.json carries for a model patched with a method (the *saved* rope) is the method
unit's saved form (`rope/units.py`; docs/portability.md tabulates it, checked against the units
by tests/test_units.py): transformers' own type or plain RoPE wherever the method equals one
(`ntk`: plain RoPE on the raised base; `ntk_by_parts`: `yarn` with `attention_factor` 1), so
only `dynamic_yarn` needs `import hf_posext`.

These are the same frequencies and cos/sin scale bit for bit (static NTK is plain RoPE
with another base, by its definition; NTK-by-parts is YaRN without the temperature). What the
portable form loses — which method it was, the original base and the trained length L — goes into
one entry of config.json, `config.hf_posext` (ENTRY), read back by `logical_rope` so that
`trained_length`, re-patching (replace, never compound) and `unpatch` work after a reload.
Checkpoints saved before this (rope_type `ntk` / `ntk_by_parts`) still load: those types stay
registered for reading.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from packaging.version import InvalidVersion, Version

from .._version import __version__
from ..rope.compat import get_rope_parameters, rotary_dim
from ..rope.config import RopeExtensionConfig, method_of_rope_type
from ..rope.knobs import NATIVE_TRAINED_KEY, TRAINED_LENGTH_NAME
from ..rope.longrope import longrope_form
from ..rope.registry import LONGROPE_ONLY
from ..rope.methods import yarn_mscale
from ..rope.units import UNITS
from .engines import NotApplicable, transformers_reading
from .meaning import TOLERANCE, errors, meaning_of

ENTRY = "hf_posext"  # the config attribute (and config.json key) holding what hf_posext needs


def saved_rope(spec: RopeExtensionConfig, base: dict[str, Any], dim: int,
               longrope_only: bool = False) -> dict[str, Any]:
    """The rope dict (5.x flat layout, with rope_theta) written for `spec` on top of the plain
    RoPE `base` ({"rope_type": "default", "rope_theta", maybe "partial_rotary_factor"}).
    A unit `saved_as_longrope` (CoPE) is saved in its exact longrope form everywhere.
    `longrope_only`: the model's config accepts only plain RoPE and `longrope` (Phi-3,
    `registry.LONGROPE_ONLY`), so every static method goes in its longrope form unless its
    saved form is plain RoPE (NTK's raised theta). The saved form is the method unit's own
    (`units.RopeMethod.saved`), else its logical rope dict."""
    theta = float(base["rope_theta"])
    extra = {k: v for k, v in base.items() if k == "partial_rotary_factor"}
    unit = UNITS[spec.method]
    saved = unit.saved(spec, theta, dim) if unit.saved is not None else spec.to_rope_dict(theta)
    if unit.saved_as_longrope or (longrope_only and saved["rope_type"] != "default"):
        return longrope_form(spec, dim, theta, **extra)
    return {**saved, **extra}


def yarn_temperature(rope: dict[str, Any]) -> float:
    """The cos/sin scale t of a saved `yarn` rope dict as transformers runs it: its
    `attention_factor`, else YaRN's 0.1·ln s + 1 (eq. 22). Readers that take the scale from other
    keys get it in their own form from `export`."""
    scale = rope.get("attention_factor")
    return float(scale) if scale is not None else yarn_mscale(float(rope["factor"]))


def entry(spec: RopeExtensionConfig, rope_theta: float) -> dict[str, Any]:
    """The `config.hf_posext` entry: method, factor, knobs, the original theta and L, version."""
    return {**spec.to_dict(), "rope_theta": float(rope_theta), "version": __version__}


def spec_of_entry(data: dict[str, Any]) -> tuple[RopeExtensionConfig, float]:
    """(spec, original rope_theta) from a `config.hf_posext` entry; a clear error if damaged."""
    if not isinstance(data, dict) or "method" not in data or "rope_theta" not in data:
        raise ValueError(f"config.{ENTRY} = {data!r} is not an entry hf_posext wrote (it needs at "
                         f"least 'method' and 'rope_theta'). Delete config.{ENTRY} to use the "
                         "checkpoint's rope config as it is.")
    fields = {k: v for k, v in data.items() if k not in ("rope_theta", "version")}
    # Entries written before the trained length had one name hold L under
    # transformers' key: read it, so those checkpoints keep loading (a file's key, not an input:
    # `from_dict` refuses that name). New entries hold `trained_length`, as `to_dict` writes it.
    if NATIVE_TRAINED_KEY in fields and TRAINED_LENGTH_NAME not in fields:
        fields[TRAINED_LENGTH_NAME] = fields.pop(NATIVE_TRAINED_KEY)
    written = data.get("version")
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(RopeExtensionConfig)})
    if unknown and _newer(written):
        raise ValueError(f"entry {ENTRY!r} was written by hf_posext {written} (installed: "
                         f"{__version__}) with keys this version does not know {unknown}; upgrade "
                         f"to read it: pip install -U 'hf_posext>={written}'.")
    try:
        return RopeExtensionConfig.from_dict(fields), float(data["rope_theta"])
    except (TypeError, ValueError) as err:   # e.g. "factor": "2", a hand edit
        fix = (f"it was written by hf_posext {written} (installed: {__version__}): upgrade to read "
               f"it, pip install -U 'hf_posext>={written}'" if _newer(written) else
               "restore the value hf_posext saved, or delete the entry to use the rope config as it is")
        raise ValueError(f"entry {ENTRY!r}: {str(err).rstrip('.')}; {fix}.") from None


def _newer(version) -> bool:
    """True when an entry's `version` is above the installed hf_posext's (its keys may be new)."""
    try:
        return Version(str(version)) > Version(__version__)
    except InvalidVersion:
        return False


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if set(a) != set(b):
        return False
    for key, value in a.items():
        other = b[key]
        if isinstance(value, (int, float)) and isinstance(other, (int, float)) \
                and not isinstance(value, bool):
            if not math.isclose(value, other, rel_tol=1e-12):
                return False
        elif value != other:
            return False
    return True


def logical_rope(config, rope: dict[str, Any], dim: int) -> dict[str, Any]:
    """The rope dict hf_posext reasons with: the method's own layout (e.g. `ntk` with the original
    theta) when `config.hf_posext` describes the saved `rope`, else `rope` itself.

    An entry that no longer matches the rope config (someone edited one of them) is an error, not
    a guess: either could be the intended one."""
    data = getattr(config, ENTRY, None)
    if data is None:
        return rope
    spec, theta = spec_of_entry(data)
    base = {"rope_type": "default", "rope_theta": theta,
            **{k: v for k, v in rope.items() if k == "partial_rotary_factor"}}
    longrope_only = getattr(config, "model_type", None) in LONGROPE_ONLY
    expected = saved_rope(spec, base, dim, longrope_only) if spec.factor != 1.0 else base
    if not _same(expected, rope) and not _reads_as(config, rope, spec, theta, dim):
        raise ValueError(f"config.{ENTRY} describes {spec.method!r} (factor {spec.factor:g}) saved "
                         f"as {expected}, but the config's rope is {rope}. Delete config.{ENTRY} "
                         "to use the rope config as it is, or restore the rope config.")
    return {**spec.to_rope_dict(theta), **{k: v for k, v in rope.items()
                                           if k == "partial_rotary_factor"}}


def method_spec(config) -> RopeExtensionConfig | None:
    """The hf_posext method a (text) config is extended with, seen through its portable form
    (e.g. `ntk` for plain RoPE with a raised theta and an entry); None for plain RoPE or
    transformers' own types."""
    rope = logical_rope(config, get_rope_parameters(config), rotary_dim(config))
    if method_of_rope_type(rope.get("rope_type", "default")) is None:
        return None
    return RopeExtensionConfig.from_rope_dict(rope, config.max_position_embeddings)


def _reads_as(config, rope: dict[str, Any], spec: RopeExtensionConfig, theta: float,
              dim: int) -> bool:
    """True when transformers runs `rope` exactly as `spec`: an engine form written by
    `hf_posext.export` (other keys, same meaning) matches its entry too."""
    try:
        reading = transformers_reading(rope, dim, config.max_position_embeddings)
    except (NotApplicable, KeyError):
        return False
    if reading.refused:
        return False
    target = meaning_of(spec, theta, dim, config.max_position_embeddings)
    return max(errors(reading, target)) <= TOLERANCE


def set_entry(config, spec: RopeExtensionConfig | None, rope_theta: float | None = None) -> None:
    """Write (or, for `None`: plain RoPE or transformers' own types, remove) `config.hf_posext`."""
    if spec is None or spec.factor == 1.0:
        config.__dict__.pop(ENTRY, None)
    else:
        setattr(config, ENTRY, entry(spec, rope_theta))

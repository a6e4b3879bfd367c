"""Every method name hf_posext knows: the rope methods (hf_posext/rope) + the attention-level ones
(hf_posext/attention). Built here, above both, so neither subpackage imports the other's names
(`rope.config` used to import `attention.config` only to build this tuple)."""

from __future__ import annotations

from typing import Any

from .attention import config as _attention_config
from .attention.config import ATTENTION_METHODS
from .rope import config as _rope_config
from .rope.knobs import TRAINED_LENGTH

METHODS: tuple[str, ...] = _rope_config.ROPE_METHODS + ATTENTION_METHODS


def canonical_method(method: str) -> str:
    """Resolve aliases (`dynamic` -> `dynamic_ntk`) over every method; unknown names raise a
    ValueError listing `METHODS` (read at call time, so names added later count too)."""
    return _rope_config.canonical_method(method, METHODS)


# Every knob a method may take, in one place, from the specs the units declare (rope/knobs.py):
# the trained length L of a rope method, the rope units' knobs, then the attention units' (and
# log-n). `evaluation.shared.grid.knob_names()`, the CLI's `--knobs`, `loading` and the docs' knob tables
# read this, never a hand list.
KNOB_HELP: dict[str, str] = {
    TRAINED_LENGTH.name: TRAINED_LENGTH.help,
    **_rope_config.KNOB_HELP,
    **{k: v for k, v in _attention_config.KNOB_HELP.items() if k not in _rope_config.KNOB_HELP}}
# The knobs that count tokens, so `--knobs window=4096` stays 4096.
INTEGRAL_KNOBS: tuple[str, ...] = (TRAINED_LENGTH.name,
                                   *(n for n, k in {**_rope_config.ROPE_KNOBS, **_attention_config.ATTENTION_KNOBS}.items()
                                     if k.kind is int))


def knob_table(wing: str) -> str:
    """The markdown table of the knobs of the `rope` or `attention` units (docs/methods.md and
    docs/attention.md show it; tests/test_units.py holds the pages equal to it). A default that
    is a function of L is shown at L = 4096."""
    config: Any = _rope_config if wing == "rope" else _attention_config
    units: list[Any] = list(config.UNITS.values())
    rows = ["| knob | methods | default | what |", "|---|---|---|---|"]
    for name, knob in (config.ROPE_KNOBS if wing == "rope" else config.ATTENTION_KNOBS).items():
        users = [u for u in units if any(k.name == name for k in u.knobs)]
        defaults = []
        for u in users:
            k = next(k for k in u.knobs if k.name == name)
            shown = (f"{k.default_at(4096)!r} at L = 4096" if callable(k.default)
                     else repr(k.default_at(None)))
            defaults.append((u.name, shown))
        same = len({shown for _, shown in defaults}) == 1
        shown = defaults[0][1] if same else "; ".join(f"{n}: {d}" for n, d in defaults)
        rows.append(f"| `{name}` | {', '.join(f'`{u.name}`' for u in users)} | {shown} | {knob.help} |")
    return "\n".join(rows)

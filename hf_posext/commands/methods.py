"""`hf-posext methods [METHOD ...]`: every method hf_posext knows, how a checkpoint saves it,
and its knobs with their defaults (what `--knobs NAME=VALUE` takes).

    hf-posext methods            # all of them
    hf-posext methods yarn dpe   # two
"""

from __future__ import annotations

import argparse

from ..attention.config import UNITS as ATTENTION_UNITS
from ..catalog import canonical_method
from ..evaluation.shared.inputs import InputError
from ..rope.knobs import TRAINED_LENGTH
from ..rope.units import UNITS as ROPE_UNITS


def add_subcommand(sub) -> None:
    p = sub.add_parser("methods", help="list the methods and their knobs (what --knobs takes)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="methods to show (default: all)")
    p.set_defaults(run=run_methods)


def _default(knob) -> str:
    if knob.required:
        return "required"
    if callable(knob.default):
        return f"{knob.default_at(8192)!r} at L = 8192 (a function of L)"
    return repr(knob.default)


def describe(name: str) -> str:
    """A method's description: how it is saved or run, then one line per knob."""
    if name in ROPE_UNITS:
        unit = ROPE_UNITS[name]
        head = (f"{name}: rope method, saved as rope_type {unit.rope_type!r}"
                + (" (needs `import hf_posext` to load)" if unit.registered else " (plain transformers loads it)"))
        knobs = ((TRAINED_LENGTH,) if unit.needs_trained_length else ()) + tuple(unit.knobs)
    else:
        unit = ATTENTION_UNITS[name]
        head = f"{name}: attention-level method (transformers with `import hf_posext`; no engine runs it)"
        knobs = tuple(unit.knobs)
    lines = [head] + [f"    {k.name} (default {_default(k)}): {k.help}" for k in knobs]
    return "\n".join(lines if knobs else [head, "    no knobs"])


def run_methods(args: argparse.Namespace) -> int:
    names = list(ROPE_UNITS) + list(ATTENTION_UNITS)
    if args.names:
        try:
            names = [canonical_method(n) for n in args.names]
        except ValueError as err:
            raise InputError(str(err)) from None
    print("\n".join(describe(n) for n in names))
    return 0

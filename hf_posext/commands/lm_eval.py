"""`hf-posext lm-eval ...`: lm-evaluation-harness with the `hf-posext` model type registered
(hf_posext/evaluation/harness.py). Every argument after `lm-eval` is lm-eval's own:

    hf-posext lm-eval --model hf-posext --model_args pretrained=PATH,method=yarn,factor=2 \\
        --tasks niah_single_1 --metadata '{"max_seq_lengths":[8192]}' --limit 5

The `hf-posext` model_args (method, factor, knobs) are checked before lm-eval loads anything.
Needs the `lmeval` extra: pip install 'hf_posext[lmeval]'.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager

from ..evaluation.inputs import InputError
from .lm_eval_vllm import run_on_vllm

MISSING = ("lm-eval is not installed; install the extra: pip install 'hf_posext[lmeval]' "
           "(lm-eval==0.4.13, wonderwords, nltk).")


def add_subcommand(sub) -> None:
    # prefix_chars "+": no argument looks like an option of this parser, so REMAINDER takes
    # them all (argparse leaves a leading --flag to the parent parser otherwise)
    p = sub.add_parser("lm-eval", add_help=False, description=__doc__, prefix_chars="+",
                       help="lm-evaluation-harness with the `hf-posext` model type (patched models)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="lm-eval's arguments")
    p.set_defaults(run=run)


def _value(argv: list[str], flag: str) -> str | None:
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            return argv[i + 1]
        if item.startswith(flag + "="):
            return item.split("=", 1)[1]
    return None


def check_model_args(argv: list[str]) -> None:
    """With --model hf-posext, the method, factor and knobs of --model_args (one-line error)."""
    from lm_eval.utils import simple_parse_args_string

    from ..evaluation.harness import MODEL_TYPE, split_model_args
    if _value(argv, "--model") != MODEL_TYPE:
        return
    text = _value(argv, "--model_args") or ""
    if text.lstrip().startswith("{"):
        import json
        kwargs = json.loads(text)
    else:
        kwargs = simple_parse_args_string(text)
    if "pretrained" not in kwargs:
        raise InputError("--model_args needs pretrained=<model> (a folder, a Hub id or "
                         "embedded:smollm2-135m).")
    try:
        split_model_args(kwargs)
    except ValueError as err:
        raise InputError(f"--model_args: {err}") from None


@contextmanager
def _argv(argv: list[str]):
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        yield
    finally:
        sys.argv = saved


def run(args) -> int:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise InputError(MISSING) from None
    check_model_args(args.lm_eval_args)
    routed = run_on_vllm(args.lm_eval_args, _value(args.lm_eval_args, "--model"))   # hf-posext-vllm
    if routed is not None:
        return routed
    from lm_eval.__main__ import cli_evaluate

    from ..evaluation import harness  # noqa: F401  (registers the `hf-posext` model type)
    with _argv(args.lm_eval_args):
        cli_evaluate()
    return 0

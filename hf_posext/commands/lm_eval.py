"""`hf-posext lm-eval [lm-eval's arguments]`: lm-evaluation-harness on a patched model, through
the `hf-posext` model type (the default here). Every argument is lm-eval's own; hf_posext's part
is what `--model_args` takes:

    pretrained=MODEL    a folder, a Hub id, or embedded:smollm2-135m
    method=M            the method (default none: the model as saved); `hf-posext methods` lists them
    factor=S            the scale s >= 1, or auto (s = each task length / the trained length)
    KNOB=VALUE          any knob of the method, e.g. beta_fast=64 (`hf-posext methods M`)
    gguf_file=F, dtype=D, max_length=N, ...   lm-eval's `hf` model arguments, passed on

    hf-posext lm-eval --model_args pretrained=embedded:smollm2-135m,method=yarn,factor=2,max_length=16384 \\
        --tasks niah_single_1 --metadata '{"max_seq_lengths":[16384]}' --limit 5

`--model hf-posext-vllm` runs the same extension in vLLM with the arguments `hf-posext serve`
derives. The model_args are checked before lm-eval loads anything; a GGUF's tokenizer is saved to
a folder once and passed as `tokenizer=` (RULER's tasks load it by name). Needs the `lmeval`
extra: pip install 'hf_posext[lmeval]'. lm-eval's own options: `hf-posext lm-eval run --help`.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager

from ..evaluation.shared.inputs import InputError
from .lm_eval_vllm import flag_value, run_on_vllm

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


def complete_lm_eval_args(ns) -> None:
    """lm-eval's parsed `run` arguments, completed and checked before any model loads: `--model`
    defaults to `hf-posext`; its model_args (method, factor, knobs) are checked; a GGUF's
    tokenizer is passed as `tokenizer=<folder>` unless one is given (RULER's task builders load
    `tokenizer or pretrained` by name and ignore `gguf_file`: lm_eval/tasks/ruler/common_utils.py
    `get_tokenizer`; `--metadata` and model_args both reach them, model_args HFLM too)."""
    from ..evaluation.integrations.harness import MODEL_TYPE, split_model_args, tokenizer_folder
    if ns.model is None and not getattr(ns, "config", None):
        ns.model = MODEL_TYPE
    kwargs = dict(ns.model_args or {})
    pretrained = kwargs.get("pretrained")
    if ns.model == MODEL_TYPE:
        if pretrained is None:
            raise InputError("--model_args needs pretrained=<model> (a folder, a Hub id or "
                             "embedded:smollm2-135m).")
        try:
            split_model_args(kwargs)
        except ValueError as err:
            raise InputError(f"--model_args: {err}") from None
    elif ns.model == "hf" and str(pretrained).startswith("embedded:"):
        raise InputError(f"--model hf: lm-eval's own model type cannot load {pretrained}; use "
                         f"--model {MODEL_TYPE} (the default here; method=none runs it unpatched).")
    else:
        return
    if not isinstance(pretrained, str) or "tokenizer" in kwargs or "tokenizer" in (ns.metadata or {}):
        return
    try:
        folder = tokenizer_folder(pretrained, kwargs.get("gguf_file"))
    except (OSError, ValueError) as err:
        raise InputError(f"--model_args pretrained={pretrained}: {err}") from None
    if folder:
        print(f"note: the GGUF's tokenizer is read from {folder} (tokenizer=; RULER's tasks load "
              "it by name)", file=sys.stderr)
        ns.model_args = {**kwargs, "tokenizer": folder}


@contextmanager
def _argv(argv: list[str]):
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        yield
    finally:
        sys.argv = saved


def run(args) -> int:
    if args.lm_eval_args in (["-h"], ["--help"], []):   # hf_posext's part first; lm-eval's: `run --help`
        print(f"usage: hf-posext lm-eval [lm-eval's arguments]\n\n{__doc__}")
        return 0
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise InputError(MISSING) from None
    # --model hf-posext-vllm: serve's vLLM arguments, run in vLLM's Python (lm_eval_vllm.py)
    model = flag_value(args.lm_eval_args, "--model")
    routed = run_on_vllm(args.lm_eval_args, model and model[1])
    if routed is not None:
        return routed
    # lm-eval's own command line (lm_eval.__main__.cli_evaluate, 0.4.13), parsed here so that
    # `complete_lm_eval_args` sees its arguments as lm-eval reads them (`--model_args a=1,b=2` or `a=1 b=2`)
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    from ..evaluation.integrations import harness  # noqa: F401  (registers the `hf-posext` model type)
    setup_logging()
    with _argv(args.lm_eval_args):
        parser = HarnessCLI()
        parsed = parser.parse_args()
    if getattr(parsed, "command", None) == "run":
        complete_lm_eval_args(parsed)
    parser.execute(parsed)
    return 0

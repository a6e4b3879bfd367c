"""`hf-posext extend MODEL OUT --method M (--factor S | --target-length N)`: a base model to an
extended checkpoint in one step: the weights (unchanged) with the rope config the chosen engine
runs exactly, the tokenizer beside them, and a model card (README.md) saying what was done, where
it runs and how to serve it.

    hf-posext extend embedded:smollm2-135m smollm2-yarn-16k --method yarn --factor 2 --engine vllm
    hf-posext extend ./llama-base llama-yarn-32k --method yarn --target-length 32k --eval
    hf-posext extend ./llama-base llama-yarn-32k --method yarn --factor 4 --push-to-hub me/llama-yarn-32k

--engine (default transformers): the engine whose exact form is written (as `hf-posext export`);
one that cannot run the method exactly is refused before anything loads. --eval measures the
written checkpoint (perplexity at L and at the new length against the base model's own sliding
window, and RULER's single needle) and puts the figures in the card and in OUT/eval/.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..attention import is_attention_method
from ..attention.interface import CONFIG_KEY as ATTENTION_KEY
from ..data.embedded import DEFAULT_MODEL, EMBEDDED_HUB_ID, resolve_model
from ..errors import ConfigError
from ..evaluation.shared.inputs import InputError, check_model_arg, parse_lengths
from ..patcher import patch, trained_length
from ..portability.card import Extension, license_of, write_card
from ..portability.exporting import export
from ..portability.serving import ENGINES, command
from ..rope.compat import get_rope_parameters, write_both_layouts
from ..rope.units import REGISTERED_ROPE_TYPES
from . import session
from .extend_eval import EVAL_TEXT, add_eval_args, check_eval_args, run_eval

WRITE_ENGINES = ("transformers", *ENGINES)


def add_subcommand(sub) -> None:
    p = sub.add_parser("extend", help="make an extended checkpoint: weights, tokenizer and a model card",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help=f"the base model: a Hub id, a folder, or {DEFAULT_MODEL}")
    p.add_argument("out", help="the folder to write (new, or empty)")
    p.add_argument("--method", required=True, help="the method, e.g. yarn (hf-posext methods lists them)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--factor", help="the scale s >= 1: the new length is s x the trained one")
    g.add_argument("--target-length", help="the new length in tokens, e.g. 32k (k = 1024)")
    session.add_knobs_arg(p, "the method")
    p.add_argument("--engine", default="transformers", choices=WRITE_ENGINES,
                   help="write the form this engine runs exactly (default transformers)")
    p.add_argument("--gguf-file", default=None, help="the GGUF file inside MODEL, for a GGUF base")
    p.add_argument("--revision", default=None, help="Hub revision of MODEL")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="dtype of the saved weights (default float32)")
    add_eval_args(p)
    p.add_argument("--push-to-hub", metavar="REPO", default=None,
                   help="upload OUT to this Hub repository (owner/name) with huggingface_hub")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: a private repository")
    p.set_defaults(run=run_extend)


def check_out(out: Path) -> None:
    if out.is_file():
        raise InputError(f"OUT {out} is a file; pass a new folder.")
    if out.is_dir() and any(out.iterdir()):
        raise InputError(f"OUT {out} exists and is not empty; pass a new folder (nothing is overwritten).")


def check_repo(repo: str | None) -> None:
    if repo is None:
        return
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise InputError(f"--push-to-hub {repo!r}: {err}") from None
    if "/" not in repo:
        raise InputError(f"--push-to-hub {repo!r}: name the owner too, e.g. me/{repo}.")


def method_and_factor(args, trained: int) -> tuple[str, float, dict]:
    """--method, --factor or --target-length (as a scale of `trained`), --knobs."""
    method, factor, knobs = session.method_flags(argparse.Namespace(
        method=args.method.strip(), factor=args.factor, knobs=args.knobs))
    assert method is not None
    if args.target_length is not None:
        (target,) = parse_lengths(args.target_length) if "," not in args.target_length else (None,)
        if target is None:
            raise InputError(f"--target-length takes one length, got {args.target_length!r}.")
        if target <= trained:
            raise InputError(f"--target-length {target} is not past the trained length {trained}; "
                             "pass a longer one.")
        factor = target / trained
    assert factor is not None
    return method, factor, knobs


def check_engine(config, engine: str, method: str, factor: float, knobs: dict) -> None:
    """Refuse, from the config alone, an engine that cannot run the method exactly."""
    if is_attention_method(method):
        if engine != "transformers":
            raise InputError(f"{engine} cannot run {method}: it is an attention-level method, which "
                             "only transformers with `import hf_posext` runs. Pass --engine "
                             "transformers, or a rope method (hf-posext methods).")
        return
    if engine == "transformers":
        return
    import copy
    import tempfile
    base = copy.deepcopy(config)
    # the base as every reader will see the extension written: both rope layouts (a config that
    # transformers 5 built states θ in rope_parameters only, which the check would otherwise
    # read as the 4.x readers' default 10000: a trait of how the base was read, not of OUT)
    write_both_layouts(base, get_rope_parameters(base))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            base.to_json_file(f"{tmp}/config.json")
            command(tmp, engine, method, factor, knobs)
    except (ValueError, TypeError) as err:
        raise InputError(f"--engine {engine} cannot run {method} (s = {factor:g}) exactly: {err}") from None


def run_extend(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_out(out)
    check_repo(args.push_to_hub)
    if args.private and args.push_to_hub is None:
        raise InputError("--private needs --push-to-hub REPO.")
    config = check_model_arg(args.model, args.gguf_file, DEFAULT_MODEL, args.revision,
                                     read_default=True)
    trained = int(get_rope_parameters(config).get("original_max_position_embeddings")
                  or config.max_position_embeddings)
    method, factor, knobs = method_and_factor(args, trained)
    check_engine(config, args.engine, method, factor, knobs)
    depths = check_eval_args(args)

    from ..data.embedded import load_model, load_tokenizer
    import torch
    extra = {"revision": args.revision} if args.revision else {}
    tokenizer = load_tokenizer(args.model, args.gguf_file, **extra)   # one load: the eval text, then OUT
    eval_docs = eval_documents(args, tokenizer, round(factor * trained))
    print(f"model: loading {args.model}", file=sys.stderr, flush=True)
    model = load_model(name=args.model, gguf_file=args.gguf_file, dtype=getattr(torch, args.dtype), **extra)
    patch(model, method, factor, **knobs)
    out.parent.mkdir(parents=True, exist_ok=True)
    if is_attention_method(method):
        model.save_pretrained(out)
    else:
        export(model, out, args.engine)
    tokenizer.save_pretrained(out)
    figures = run_eval(args, out, model, tokenizer, eval_docs, depths, method, factor, knobs) if args.eval else ()
    path, gguf = resolve_model(args.model, args.gguf_file)
    ext = Extension(base=args.model, base_hub_id=hub_id_of(args.model), method=method, factor=factor,
                    knobs=knobs, trained=trained_length(model), extended=round(factor * trained),
                    engine=args.engine, command=command_line(args),
                    license=license_of(path if Path(path).is_dir() else None,
                                       str(Path(path) / gguf) if gguf else None),
                    needs_hf_posext=needs_hf_posext(out), figures=tuple(figures))
    card = write_card(out, ext)
    print(f"wrote {out} (weights, tokenizer, {card.name})")
    if args.push_to_hub:
        push(out, args.push_to_hub, args.private)
    return 0


def eval_documents(args, tokenizer, need: int):
    """With --eval: the evaluation text tokenised before the model loads, so a bad --eval-text
    fails first."""
    if not args.eval:
        return None
    from ..evaluation import TextSource, TokenCache, load_documents, select_documents
    chosen = select_documents(load_documents(TextSource(args.eval_text or EVAL_TEXT)), TokenCache(tokenizer),
                              min_tokens=need, max_docs=1)
    if not chosen.docs:
        raise InputError(f"--eval-text {args.eval_text!r} has no document of {need} tokens; pass a longer text.")
    return chosen.docs


def hub_id_of(model: str) -> str | None:
    """The base's Hub id for the card's base_model: the embedded model's, or MODEL when it is one."""
    if model == DEFAULT_MODEL:
        return EMBEDDED_HUB_ID
    return None if Path(model).exists() or model.startswith((".", "/", "~")) else model


def needs_hf_posext(out: Path) -> bool:
    """True when plain transformers cannot read the saved config (an hf_posext rope type, or an
    attention-level method's entry)."""
    import json
    cfg = json.loads((out / "config.json").read_text())
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    types = {v.get("rope_type") for v in rope.values() if isinstance(v, dict)} | {rope.get("rope_type")}
    return ATTENTION_KEY in cfg or bool(types & set(REGISTERED_ROPE_TYPES))


def command_line(args) -> str:
    """The command that made the folder, from the parsed flags (for the card's 'How it was made')."""
    argv = ["hf-posext", "extend", args.model, args.out, "--method", args.method]
    for flag in ("factor", "target_length", "knobs", "gguf_file", "revision", "push_to_hub"):
        if getattr(args, flag) is not None:
            argv += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    argv += ["--engine", args.engine, *(["--dtype", args.dtype] if args.dtype != "float32" else [])]
    if args.eval:
        argv += ["--eval", "--eval-text", args.eval_text, "--eval-depths", args.eval_depths,
                 "--eval-trials", str(args.eval_trials)]
    return shlex.join(argv)


def push(out: Path, repo: str, private: bool) -> None:
    """Upload OUT with huggingface_hub (create the repository if needed)."""
    from huggingface_hub import HfApi
    api = HfApi()
    try:
        api.create_repo(repo, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(out), repo_id=repo, commit_message="hf-posext extend")
    except Exception as err:   # noqa: BLE001 - offline, no token, no rights: one line
        raise ConfigError(f"--push-to-hub {repo}: the upload failed ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); OUT is written, "
                          f"upload it later with `hf upload {repo} {out}`.") from None
    print(f"uploaded {out} to {repo}")

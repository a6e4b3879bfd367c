"""The arms of the fine-tuning experiment (benchmarks/finetune_retrieval.py is its command line):
the training-free extended model (`free`), fine-tuned on documents only (`docs`) and on documents
with synthetic long-range examples mixed in (`mix`), each evaluated as saved on held-out text.

Here: a run's folder name per training seed, the recipe arguments of an arm, the settings a
finished arm is stored with (a rerun with other settings is refused), and the evaluation grid,
checked before anything trains. `args` is the experiment's parsed command line (its flags'
names); `check_grid` adds the parsed lists to it. Bad settings raise ValueError naming the flag.
"""

from __future__ import annotations

from pathlib import Path

from ..evaluation.shared.inputs import comma_items

ARMS = ("free", "docs", "mix")


def run_name(arm: str, seed: int) -> str:
    """The folder (and report section) of an arm's run: the arm for seed 0 (as the first runs
    were stored), `<arm>-seed<s>` for the other training seeds."""
    return arm if seed == 0 or arm == "free" else f"{arm}-seed{seed}"


def check_grid(args) -> None:
    """Every evaluation setting, checked before anything trains (ValueError naming the flag and the
    fix); sets args.task_list, haystack_list, held_out, seed_list and the sequential defaults."""
    args.task_list, args.haystack_list, args.held_out = comma_items(args.tasks), comma_items(args.haystacks), comma_items(args.eval_document)
    if not args.held_out:
        raise ValueError("--eval-document is empty: name the document(s) held out of training.")
    try:
        args.seed_list = [int(x) for x in comma_items(args.seeds)]
    except ValueError:
        raise ValueError(f"--seeds {args.seeds!r}: give integers, e.g. 0,1") from None
    if not args.seed_list or len(set(args.seed_list)) != len(args.seed_list) or min(args.seed_list) < 0:
        raise ValueError(f"--seeds {args.seeds!r}: give distinct integers >= 0, e.g. 0,1")
    if not args.sequential:
        for flag, value in (("--look", args.look), ("--bar", args.bar)):
            if value is not None:
                raise ValueError(f"{flag} is for sequential trials; add --sequential.")
    else:   # --trials is a cell's most, --look the trials a depth per look
        from ..evaluation.retrieval.sequential import look_for
        args.look = look_for(args.look, args.trials)
        args.bar = 0.9 if args.bar is None else args.bar
        if not 0 < args.bar <= 1:
            raise ValueError(f"--bar must be in (0, 1], got {args.bar}.")
    if not args.haystack_list or not args.task_list:
        raise ValueError("--tasks and --haystacks need at least one name each.")
    check_documents(args)
    eval_source(args)   # the perplexity document resolves to a file now, not after the training
    for hay in args.haystack_list:   # RetrievalGrid checks lengths, depths, tasks and trials
        try:
            arm_grid(args, "free", hay)
        except ValueError as error:
            raise ValueError(f"--retrieval-lengths / --free-lengths / --depths / --tasks: {error}") from None
    check_prompts(args)


def check_prompts(args) -> None:
    """Every task's prompt fits the shortest retrieval length in every haystack (and the document
    haystacks hold the longest): the prompts are built now, with the model's tokenizer, as
    `hf-posext retrieval` builds them before its model loads."""
    from ..data import embedded
    from ..evaluation.retrieval.haystack import load_haystack
    from ..evaluation.retrieval.prompt import build_cell
    from ..evaluation.retrieval.tasks import get_task
    tokenizer = embedded.load_tokenizer(args.model)
    for hay in args.haystack_list:
        grid = arm_grid(args, "free", hay)
        try:
            haystack = load_haystack(tokenizer, grid.haystack, max(grid.lengths))
            for task in grid.tasks:
                build_cell(tokenizer, get_task(task), haystack, min(grid.lengths), 0.5, grid.trial_seeds()[:1])
        except ValueError as error:
            raise ValueError(f"--retrieval-lengths / --haystacks {hay}: {error}") from None


def check_documents(args) -> None:
    """Held-out documents exist, and every document haystack is one of them: a haystack the
    recipe trained on would measure recall of memorised text, not retrieval."""
    from ..data.documents import TextSource, is_embedded, load_documents
    known = None
    if is_embedded(args.dataset) or Path(args.dataset).exists():   # a Hub dataset is listed by the recipe
        known = [d.name for d in load_documents(TextSource(args.dataset), streaming=True)]
        missing = [d for d in args.held_out if d not in known]
        if missing:
            raise ValueError(f"--eval-document: {missing} not among the documents of {args.dataset} "
                             f"({', '.join(known[:8])}{' ...' if len(known) > 8 else ''}).")
    for hay in args.haystack_list:
        if hay == "noise" or hay in args.held_out:
            continue
        if known is not None and hay in known:
            raise ValueError(f"--haystacks {hay}: a training document of {args.dataset}; hold it out "
                             f"with --eval-document {args.eval_document},{hay}, or use noise.")
        raise ValueError(f"--haystacks {hay}: give noise or a document held out with --eval-document "
                         f"({args.eval_document}).")


# Settings the first runs' done.json leave out, at the value they had then.
FIRST_RUNS = {"tasks": "single_needle", "haystacks": "noise"}


def settings(args, arm: str, seed: int = 0) -> dict:
    """What an arm's results depend on (stored in done.json; a mismatch is refused). Settings at
    their first runs' values are left out, so those runs' done.json still match; a sequential run
    keeps its first runs' keys too: `trials` the trials per look (--look), `max_trials` a cell's
    most (--trials)."""
    keys = ["model", "dataset", "eval_document", "factor", "lengths", "depths", "trials"]
    if arm != "free":
        keys += ["window", "steps", "lr"] + (["share", "min_span"] if arm == "mix" else [])
    extra = {k: getattr(args, k) for k, first in FIRST_RUNS.items() if getattr(args, k) != first}
    if args.sequential:
        extra.update(trials=args.look, sequential=True, max_trials=args.trials, bar=args.bar)
    if seed and arm != "free":
        extra["seed"] = seed
    if arm == "mix" and getattr(args, "example_window", None) is not None:
        extra["example_window"] = args.example_window
    return {**{k: getattr(args, k) for k in keys}, **extra,
            "retrieval_lengths": ",".join(map(str, retrieval_lengths(args, arm)))}


# The retrieval settings a finished arm can grow by (each a comma list, with the value a done.json
# leaving it out stands for): new cells run on the model as saved.
GROWABLE = {"retrieval_lengths": "", **FIRST_RUNS}


def added_cells(have: dict, wanted: dict) -> list[str]:
    """What `wanted` adds to a finished arm's settings `have`, one phrase per grown setting
    ("haystacks noise,hamlet (had noise)"); [] when anything else differs, a value was dropped,
    or nothing was added (then the arm is redone elsewhere or skipped, never mixed)."""
    def items(d: dict, key: str) -> set[str]:
        return set(comma_items(str(d.get(key, GROWABLE[key]))))
    rest = [{k: v for k, v in d.items() if k not in GROWABLE} for d in (have, wanted)]
    if rest[0] != rest[1] or any(not items(have, k) <= items(wanted, k) for k in GROWABLE):
        return []
    return [f"{k.replace('_', ' ')} {wanted.get(k, GROWABLE[k])} (had {have.get(k, GROWABLE[k])})"
            for k in GROWABLE if items(have, k) < items(wanted, k)]


def retrieval_lengths(args, arm: str) -> list[int]:
    extra = args.free_lengths if arm == "free" and args.free_lengths else ""
    return sorted({int(x) for x in f"{args.retrieval_lengths},{extra}".split(",") if x.strip()})


def arm_grid(args, arm: str, hay: str = "noise"):
    """The arm's grid on one haystack (`RetrievalGrid` validates lengths, depths, tasks, trials)."""
    from ..evaluation.retrieval.settings import RetrievalGrid
    return RetrievalGrid(["none"], retrieval_lengths(args, arm), [float(x) for x in args.depths.split(",")],
                         tasks=tuple(args.task_list), trials=args.trials,
                         haystack=hay if hay == "noise" else eval_source(args, hay))


def eval_source(args, name: str | None = None) -> str:
    """A held-out document (default the first) as `hf-posext eval --dataset` names it."""
    name = name or comma_items(args.eval_document)[0]
    if args.dataset.startswith("embedded:"):
        return f"{args.dataset}/{name}"
    folder = Path(args.dataset)
    found = sorted(p for p in folder.glob(f"{name}.*") if p.suffix in (".txt", ".md"))
    if not found:
        raise ValueError(f"--eval-document {name!r}: no {name}.txt/.md in {folder}")
    return str(found[0])


def recipe_argv(args, arm: str, config: Path, out: Path, seed: int = 0) -> list[str]:
    """The recipe's arguments for a fine-tuned arm: `config` (the demo recipe's YAML) with the
    experiment's model, data, steps and PoSE window; the mix arm's synthetic share, share 0 for
    the documents-only arm (whatever the config's default mix is)."""
    argv = ["--config", str(config), "--model.name", args.model, "--model.factor", str(args.factor),
            "--data.source", args.dataset, "--data.eval_documents", f"[{args.eval_document}]",
            "--training.seed", str(seed),
            "--training.seq_len", str(args.window), "--training.max_steps", str(args.steps),
            "--training.learning_rate", str(args.lr), "--training.save_every", str(max(args.steps // 4, 1)),
            "--training.warmup_steps", str(min(10, args.steps // 2)), "--pose.enabled", "true",
            "--eval.enabled", "false", "--output_dir", str(out)]
    if not args.model.startswith("embedded:"):   # the demo config names SmolLM2's own tokens
        argv += ["--data.bos_token", "auto", "--data.eos_token", "auto"]
    if arm == "mix":
        argv += ["--data.synthetic.share", str(args.share), "--data.synthetic.min_span", str(args.min_span)]
        if getattr(args, "example_window", None) is not None:
            argv += ["--data.synthetic.window", str(args.example_window)]
    else:
        argv += ["--data.synthetic.share", "0"]
    return argv

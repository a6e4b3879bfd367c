"""Does fine-tuning make SmolLM2-135M use its extended context?

Three arms on the embedded SmolLM2-135M (trained at 8,192 tokens), YaRN s = 2 (16,384), the same
optimizer steps for the two fine-tuned ones:

    free   the training-free extended model (saved once with its rope config)
    docs   fine-tuned with PoSE windows of the plays (documents only)
    mix    the same steps and windows, a share of them synthetic long-range examples
           (`data.synthetic`: a fact in the first PoSE chunk, asked for in the last, the
           question's position id in [min_span x 16k, 16k); recipes/README.md, "Data mix")

Each arm is evaluated on Hamlet, held out of every training run (the recipe checks it):
    perplexity  `hf-posext eval --methods none` on each arm's checkpoint at 4k/8k/16k: truncate
                protocol, the model's own sliding 8k baseline, per-position buckets (the
                table's "past 8k" column)
    retrieval   the retrieval suite (`hf_posext.evaluation.evaluate_retrieval`) at --retrieval-lengths
                x --depths x --tasks (single_needle, niah_single: RULER's wording, multi_key:
                distractors) x --haystacks (RULER's noise, or a document held out of training:
                --eval-document takes several), greedy, exact match, Wilson 95 % intervals;
                --trials seeded trials a cell, or --sequential looks of --look per depth up to
                --trials, stopped once the cell is surely above or below --bar
                (`evaluation.retrieval.schedule.evaluate_sequential`)

--seeds 0,1 trains each fine-tuned arm once per seed (`training.seed`; folders `<arm>` for seed 0,
`<arm>-seed<s>` for the others) and the report says how far the seeds differ. Every setting is
checked before anything trains (a bad depth or task, a haystack that is a training document, a
seed list with repeats, ...), and the report stands for any grid accepted (a grid without a length
past L shows "—" for the past-L column).

Resumable: each arm writes into its own folder under --out (default
benchmarks/results/finetune-retrieval/<arm>/); an arm with a `done.json` is skipped, an
interrupted one continues (training from its last checkpoint, evaluation from its stored cells),
and a finished one asked for more retrieval lengths, haystacks or tasks (the rest unchanged) runs
only the new cells on its saved checkpoint. `report.md` in --out is rewritten from the stored
results at the end (`--report-only`: that alone). The arms' settings, checks and report are
hf_posext.training's (arms.py, arms_report.py); this script runs them.

    nice -n 10 python benchmarks/finetune_retrieval.py             # the experiment (hours here)
    python benchmarks/finetune_retrieval.py --smoke --model DIR --dataset DIR --eval-document NAME
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hf_posext.training.arms import (ARMS, added_cells, check_grid, eval_source, recipe_argv, arm_grid,
                                     run_name, settings)
from hf_posext.commands.retrieval_plan import refuse_max_trials
from hf_posext.evaluation.retrieval.sequential import DEFAULT_LOOK
from hf_posext.training.arms_report import report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "finetune-retrieval"
DEMO_CONFIG = ROOT / "recipes" / "cpu-smollm2-demo.yaml"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="finetune_retrieval.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help="results folder (one sub-folder per arm)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {ARMS}")
    p.add_argument("--model", default="embedded:smollm2-135m", help="the model (default %(default)s)")
    p.add_argument("--dataset", default="embedded:shakespeare", help="training documents (default %(default)s)")
    p.add_argument("--eval-document", default="hamlet",
                   help="held out of training (comma-separated: several); perplexity on the first "
                        "(default %(default)s)")
    p.add_argument("--factor", type=float, default=2.0, help="YaRN scale s (target = s x trained length; default %(default)s)")
    p.add_argument("--window", type=int, default=1024, help="PoSE window (tokens; default %(default)s)")
    # 200 steps of 1,024 tokens: ~7-9 s a step on the 2 quiet cores (the demo's 155 tokens/s),
    # about an hour for the two fine-tuned arms; see recipes/README.md for the measured probe.
    p.add_argument("--steps", type=int, default=200, help="optimizer steps of each fine-tuned arm (default %(default)s)")
    p.add_argument("--lr", type=float, default=2e-5, help="learning rate (the recipe's, YaRN §4.1; default %(default)s)")
    # the 1k-window setting (docs/finetuning_mix.md): share 0.25 with min_span 0.9 found
    # niah_single at 16k 59/60 over six seeds at +0.035 nats past L (mean); the measurements
    # page's commands leave these defaults unsaid, so they stay. The shipped recipe is
    # --window 2048 --example-window 1024 --share 0.5 --steps 100; the first experiment's
    # arms ran with share 0.5 and min_span 0.5 (their commands say so)
    p.add_argument("--share", type=float, default=0.25, help="mix arm: share of synthetic windows (default %(default)s)")
    p.add_argument("--min-span", type=float, default=0.9, help="mix arm: data.synthetic.min_span (default %(default)s)")
    # the 4x recipe's layout (long document windows, short examples) at 2x: e.g. --window 2048 --example-window 1024
    p.add_argument("--example-window", type=int, default=None,
                   help="mix arm: data.synthetic.window, the synthetic examples' tokens, cut from the front of "
                        "their --window (default: the whole window)")
    p.add_argument("--lengths", default="4096,8192,16384", help="perplexity lengths")
    # 8k (= L, the within-L control) and 16k (2 x L). A finished run given more lengths adds only
    # their cells (run_arm): the first run had 16k on every arm and 8k on the training-free one.
    p.add_argument("--retrieval-lengths", default="8192,16384", help="retrieval lengths of every arm")
    p.add_argument("--free-lengths", default="",
                   help="extra retrieval lengths of the training-free arm only (default none)")
    # 0.5: at 16k the needle sits ~8k tokens (= L) before a question past L; the prefix up to
    # the needle is prefilled once per cell (a trial costs ~2/3 of a full prefill; at 0.25 ~9/10)
    p.add_argument("--depths", default="0.5", help="retrieval depths (0 = start of the haystack)")
    p.add_argument("--trials", type=int, default=20,
                   help="retrieval trials per cell (seeded needles); with --sequential, the most, in looks of --look")
    p.add_argument("--tasks", default="single_needle", help="retrieval tasks (single_needle, niah_single, multi_key, ...)")
    p.add_argument("--haystacks", default="noise",
                   help="noise (RULER's) and/or held-out documents named in --eval-document, comma-separated")
    p.add_argument("--seeds", default="0", help="training seeds of each fine-tuned arm (one run per seed)")
    p.add_argument("--sequential", action="store_true",
                   help="retrieval in looks (evaluation.retrieval.sequential): a cell stops once its "
                        "Clopper-Pearson interval over its depths is wholly above or below --bar")
    p.add_argument("--look", type=int, default=None, help=f"with --sequential: the trials at each depth per look (default {DEFAULT_LOOK})")
    refuse_max_trials(p)
    p.add_argument("--bar", type=float, default=None,
                   help="with --sequential: the accuracy a cell is decided against (default 0.9, the target accuracy)")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite report.md from the arms already finished under --out (their stored rows, "
                        "whatever settings they ran with) and run nothing: no training, no evaluation")
    p.add_argument("--smoke", action="store_true",
                   help="tiny run for the tests: 2 steps, window 128, factor 8, lengths 128,512, 3 trials")
    if p.parse_args(argv).smoke:   # the smoke sizes are defaults: a flag given still wins
        p.set_defaults(steps=2, window=128, factor=8.0, trials=3, lengths="128,512", retrieval_lengths="512", free_lengths="384",
                       lr=1e-3)
    args = p.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in args.arms if a not in ARMS]
    if bad:
        p.error(f"--arms: unknown arm(s) {bad}; choose from {list(ARMS)}")
    if not 0 < args.share <= 1:
        p.error(f"--share must be in (0, 1], got {args.share}")
    if args.trials < 1 or args.steps < 1:
        p.error("--trials and --steps must be >= 1")
    if args.example_window is not None and "mix" not in args.arms:
        p.error("--example-window sets the mix arm's synthetic examples; add mix to --arms or drop it")
    if args.example_window is not None and not 2 <= args.example_window <= args.window:
        p.error(f"--example-window {args.example_window}: give a token count in [2, --window {args.window}]")
    try:
        check_grid(args)
    except ValueError as error:
        p.error(str(error))
    return args


def train(args, arm: str, folder: Path, seed: int = 0) -> Path:
    """The recipe (hf_posext.training), resumed from its last checkpoint if it was stopped."""
    from hf_posext.training.recipe import run
    from hf_posext.training.recipe_config import parse_args
    out = folder / "train"
    final = out / "final"
    if (final / "config.json").exists():
        return final
    resume = "latest" if any((out / "checkpoints").glob("checkpoint_*")) else None
    cfg, _ = parse_args(recipe_argv(args, arm, DEMO_CONFIG, out, seed))
    run(cfg, resume=resume)
    return final


def extended_copy(args, folder: Path) -> Path:
    """The training-free arm as a checkpoint: the model extended with YaRN s and saved (rope
    config inside), so every arm is evaluated the same way, as saved (`--methods none`)."""
    import torch

    from hf_posext.data import embedded
    out = folder / "model"
    if not (out / "config.json").exists():
        embedded.load_model("yarn", args.factor, name=args.model, dtype=torch.float32).save_pretrained(out)
        embedded.load_tokenizer(args.model).save_pretrained(out)
    return out


def perplexity(args, arm: str, model: str, folder: Path) -> None:
    """`hf-posext eval` (truncate + the model's own sliding baseline + per-position buckets)."""
    from hf_posext import cli
    argv = ["eval", "--model", model, "--methods", "none", "--dtype", "float32", "--lengths", args.lengths,
            "--dataset", eval_source(args), "--out", str(folder / "perplexity"), "--resume", "--no-progress"]
    print("hf-posext " + " ".join(argv), flush=True)
    if cli.main(argv):
        raise SystemExit(f"{arm}: hf-posext eval failed")


def retrieval(args, name: str, model_path: str, folder: Path) -> None:
    """The retrieval suite on the run's checkpoint as saved (YaRN in its config; `none` = not
    patched again), one grid per haystack; sequential looks against --bar with --sequential."""
    import torch
    from transformers import AutoModelForCausalLM

    from hf_posext.data import embedded
    from hf_posext.evaluation import ResultsStore, RunInfo, evaluate_retrieval
    from hf_posext.evaluation.retrieval.haystack import load_haystack
    from hf_posext.evaluation.retrieval.schedule import evaluate_sequential
    from hf_posext.evaluation.retrieval.sequential import SequentialRule
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    tokenizer = embedded.load_tokenizer(args.model)
    run = RunInfo(model_name=name.partition("-seed")[0], dtype="float32")
    with ResultsStore(folder / "retrieval", "retrieval", resume=True) as store:
        for hay in args.haystack_list:
            grid = arm_grid(args, name.partition("-seed")[0], hay)
            haystack = load_haystack(tokenizer, grid.haystack, max(grid.lengths))
            if args.sequential:
                evaluate_sequential(model, tokenizer, grid, SequentialRule(args.look, args.trials),
                                    run=run, haystack=haystack, store=store, bar=args.bar)
            else:
                evaluate_retrieval(model, tokenizer, grid, store=store, progress=True, run=run, haystack=haystack)


def run_arm(args, arm: str, seed: int = 0) -> None:
    name = run_name(arm, seed)
    folder = args.out / name
    done = folder / "done.json"
    wanted = settings(args, arm, seed)

    def model() -> str:
        return str(extended_copy(args, folder) if arm == "free" else train(args, arm, folder, seed))
    if done.exists():
        have = json.loads(done.read_text())
        if have == wanted:
            print(f"{name}: done, skipped", flush=True)
            return
        added = added_cells(have, wanted)
        if not added:
            raise SystemExit(f"{folder} holds results made with other settings; pass another --out.")
        # Only retrieval cells were added (lengths, haystacks, tasks): they run on the model as
        # saved (the results store resumes, so the cells already there are kept, not recomputed).
        print(f"{name}: adding {'; '.join(added)}", flush=True)
        retrieval(args, name, model(), folder)
        done.write_text(json.dumps(wanted, indent=2))
        return
    folder.mkdir(parents=True, exist_ok=True)
    path = model()
    perplexity(args, arm, path, folder)
    retrieval(args, name, path, folder)
    done.write_text(json.dumps(wanted, indent=2))


def main(argv=None) -> int:
    args = parse(argv)
    for arm in [] if args.report_only else args.arms:
        for seed in [0] if arm == "free" else args.seed_list:
            run_arm(args, arm, seed)
    every = dict.fromkeys(run_name(a, s) for a in ARMS for s in args.seed_list)   # the done ones are reported
    try:
        path = report(args, list(every))
    except ValueError as error:   # a run without position buckets, or no arm finished
        raise SystemExit(str(error)) from None
    print(f"report: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())

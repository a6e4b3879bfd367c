"""Does fine-tuning make SmolLM2-135M use its extended context? (issue #31)

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
    retrieval   the retrieval suite's single-needle task (`hf_posext.evaluation.evaluate_retrieval`,
                RULER's niah_single: a number in RULER's noise haystack, neither of which the
                mix's synthetic formats use) at --retrieval-lengths x --depths, --trials seeded
                trials per cell, greedy, exact match, Wilson 95 % intervals

Resumable: each arm writes into its own folder under --out (default
benchmarks/results/finetune-retrieval/<arm>/); an arm with a `done.json` is skipped, an
interrupted one continues (training from its last checkpoint, evaluation from its stored cells).
`report.md` in --out is rewritten from the stored results at the end.

    nice -n 10 python benchmarks/finetune_retrieval.py             # the experiment (hours here)
    python benchmarks/finetune_retrieval.py --smoke --model DIR --dataset DIR --eval-document NAME
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "finetune-retrieval"
ARMS = ("free", "docs", "mix")
DEMO_CONFIG = ROOT / "recipes" / "cpu-smollm2-demo.yaml"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="finetune_retrieval.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help="results folder (one sub-folder per arm)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {ARMS}")
    p.add_argument("--model", default="embedded:smollm2-135m")
    p.add_argument("--dataset", default="embedded:shakespeare", help="training documents")
    p.add_argument("--eval-document", default="hamlet", help="held out of training, evaluated on")
    p.add_argument("--factor", type=float, default=2.0, help="YaRN scale s (target = s x trained length)")
    p.add_argument("--window", type=int, default=1024, help="PoSE window (tokens)")
    # 200 steps of 1,024 tokens: ~7-9 s a step on the 2 quiet cores (the demo's 155 tokens/s),
    # about an hour for the two fine-tuned arms; see recipes/README.md for the measured probe.
    p.add_argument("--steps", type=int, default=200, help="optimizer steps of each fine-tuned arm")
    p.add_argument("--lr", type=float, default=2e-5, help="learning rate (the recipe's, YaRN §4.1)")
    p.add_argument("--share", type=float, default=0.5, help="mix arm: share of synthetic windows")
    p.add_argument("--min-span", type=float, default=0.5, help="mix arm: data.synthetic.min_span")
    p.add_argument("--lengths", default="4096,8192,16384", help="perplexity lengths")
    # 8k (= L, the within-L control) and 16k (2 x L). A finished run given more lengths adds only
    # their cells (run_arm): the first run had 16k on every arm and 8k on the training-free one.
    p.add_argument("--retrieval-lengths", default="8192,16384", help="retrieval lengths of every arm")
    p.add_argument("--free-lengths", default="",
                   help="extra retrieval lengths of the training-free arm only (default none)")
    # 0.5: at 16k the needle sits ~8k tokens (= L) before a question past L; the prefix up to
    # the needle is prefilled once per cell (a trial costs ~2/3 of a full prefill; at 0.25 ~9/10)
    p.add_argument("--depths", default="0.5", help="retrieval depths (0 = start of the haystack)")
    p.add_argument("--trials", type=int, default=20, help="retrieval trials per cell (seeded needles)")
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
    try:   # the retrieval grid checked now, not after hours of training ("free" has every length)
        retrieval_grid(args, "free")
    except ValueError as error:
        p.error(f"--retrieval-lengths / --free-lengths / --depths: {error}")
    return args


def settings(args, arm: str) -> dict:
    """What an arm's results depend on (stored in done.json; a mismatch is refused)."""
    keys = ["model", "dataset", "eval_document", "factor", "lengths", "depths", "trials"]
    if arm != "free":
        keys += ["window", "steps", "lr"] + (["share", "min_span"] if arm == "mix" else [])
    return {**{k: getattr(args, k) for k in keys},
            "retrieval_lengths": ",".join(map(str, retrieval_lengths(args, arm)))}


def retrieval_grid(args, arm: str):
    """The arm's single-needle grid (`RetrievalGrid` validates lengths, depths and trials)."""
    from hf_posext.evaluation import RetrievalGrid
    return RetrievalGrid(["none"], retrieval_lengths(args, arm), [float(x) for x in args.depths.split(",")],
                         tasks=("single_needle",), trials=args.trials)


def added_lengths(have: dict, wanted: dict) -> bool:
    """True when two arms' settings differ only by retrieval lengths added to the finished ones."""
    lengths = [set(d["retrieval_lengths"].split(",")) for d in (have, wanted)]
    rest = [{k: v for k, v in d.items() if k != "retrieval_lengths"} for d in (have, wanted)]
    return rest[0] == rest[1] and lengths[0] < lengths[1]


def retrieval_lengths(args, arm: str) -> list[int]:
    extra = args.free_lengths if arm == "free" and args.free_lengths else ""
    return sorted({int(x) for x in f"{args.retrieval_lengths},{extra}".split(",") if x.strip()})


def recipe_argv(args, arm: str, out: Path) -> list[str]:
    argv = ["--config", str(DEMO_CONFIG), "--model.name", args.model, "--model.factor", str(args.factor),
            "--data.source", args.dataset, "--data.eval_documents", f"[{args.eval_document}]",
            "--training.seq_len", str(args.window), "--training.max_steps", str(args.steps),
            "--training.learning_rate", str(args.lr), "--training.save_every", str(max(args.steps // 4, 1)),
            "--training.warmup_steps", str(min(10, args.steps // 2)), "--pose.enabled", "true",
            "--eval.enabled", "false", "--output_dir", str(out)]
    if not args.model.startswith("embedded:"):   # the demo config names SmolLM2's own tokens
        argv += ["--data.bos_token", "auto", "--data.eos_token", "auto"]
    if arm == "mix":
        argv += ["--data.synthetic.share", str(args.share), "--data.synthetic.min_span", str(args.min_span)]
    return argv


def train(args, arm: str, folder: Path) -> Path:
    """The recipe (hf_posext.training), resumed from its last checkpoint if it was stopped."""
    from hf_posext.training.recipe import run
    from hf_posext.training.recipe_config import parse_args
    out = folder / "train"
    final = out / "final"
    if (final / "config.json").exists():
        return final
    resume = "latest" if any((out / "checkpoints").glob("checkpoint_*")) else None
    cfg, _ = parse_args(recipe_argv(args, arm, out))
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


def eval_source(args) -> str:
    """The held-out document as `hf-posext eval --dataset` names it."""
    if args.dataset.startswith("embedded:"):
        return f"{args.dataset}/{args.eval_document}"
    folder = Path(args.dataset)
    found = sorted(p for p in folder.glob(f"{args.eval_document}.*") if p.suffix in (".txt", ".md"))
    if not found:
        raise SystemExit(f"--eval-document {args.eval_document!r}: no {args.eval_document}.txt/.md in {folder}")
    return str(found[0])


def perplexity(args, arm: str, model: str, folder: Path) -> None:
    """`hf-posext eval` (truncate + the model's own sliding baseline + per-position buckets)."""
    from hf_posext import cli
    argv = ["eval", "--model", model, "--methods", "none", "--dtype", "float32", "--lengths", args.lengths,
            "--dataset", eval_source(args), "--out", str(folder / "perplexity"), "--resume", "--no-progress"]
    print("hf-posext " + " ".join(argv), flush=True)
    if cli.main(argv):
        raise SystemExit(f"{arm}: hf-posext eval failed")


def retrieval(args, arm: str, model_path: str, folder: Path) -> list[dict]:
    """Single-needle retrieval (the retrieval suite) of the arm's checkpoint as saved (YaRN in
    its config; `none` = not patched again)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hf_posext.data import embedded
    from hf_posext.evaluation import ResultsStore, RunInfo, evaluate_retrieval
    grid = retrieval_grid(args, arm)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = embedded.load_tokenizer(args.model)
    with ResultsStore(folder / "retrieval", "retrieval", resume=True) as store:
        return evaluate_retrieval(model.eval(), tokenizer, grid, store=store, progress=True,
                                  run=RunInfo(model_name=arm, dtype="float32"))


def run_arm(args, arm: str) -> None:
    folder = args.out / arm
    done = folder / "done.json"
    wanted = settings(args, arm)
    if done.exists():
        have = json.loads(done.read_text())
        if have == wanted:
            print(f"{arm}: done, skipped", flush=True)
            return
        if not added_lengths(have, wanted):
            raise SystemExit(f"{folder} holds results made with other settings; pass another --out.")
        # Only retrieval lengths were added: their cells run on the model as saved (the results
        # store resumes, so the cells already there are kept, not recomputed).
        print(f"{arm}: adding retrieval lengths {wanted['retrieval_lengths']} "
              f"(had {have['retrieval_lengths']})", flush=True)
        retrieval(args, arm, str(extended_copy(args, folder) if arm == "free" else train(args, arm, folder)),
                  folder)
        done.write_text(json.dumps(wanted, indent=2))
        return
    folder.mkdir(parents=True, exist_ok=True)
    model = str(extended_copy(args, folder) if arm == "free" else train(args, arm, folder))
    perplexity(args, arm, model, folder)
    retrieval(args, arm, model, folder)
    done.write_text(json.dumps(wanted, indent=2))


LABELS = {"free": "training-free", "docs": "fine-tuned, documents", "mix": "fine-tuned, documents + synthetic"}


def stored(folder: Path, name: str) -> list[dict]:
    return json.loads((folder / name / f"{name}.json").read_text())["rows"]


def relabel(rows: list[dict], arm: str) -> list[dict]:
    """Copies named after the arm for the shared plots (every arm's rows say `none`)."""
    return [{**r, "method": LABELS[arm], "factor_spec": "auto"} for r in rows if r.get("protocol") != "baseline"]


def mean_nll(row: dict, start: int) -> float:
    """Mean NLL per token over the positions >= start of a row with position buckets."""
    from hf_posext.evaluation.perplexity.buckets import nll_from
    found = nll_from(row, start)
    if found is None:
        raise SystemExit(f"a {row['length']}-token row has no position buckets at {start}; rerun its cells")
    return found[0] / found[1]


def arm_line(arm: str, ppl: list[dict], ret: list[dict], free_short: float | None, rlengths: list[int]) -> str:
    """The arm's line of the side-by-side table (markdown)."""
    from hf_posext.evaluation.retrieval.plots import by_length
    from hf_posext.evaluation.retrieval.stats import rate_text
    trained = int(ppl[0]["trained_length"])
    truncate = {int(r["length"]): r for r in ppl if r["protocol"] == "truncate"}
    longest, short = max(truncate), min(truncate)
    # the sliding baseline exists only at lengths past L: a grid within L has no "past L" column
    base = next((r for r in ppl if r["protocol"] == "baseline" and int(r["length"]) == longest), None)
    cells = [f"{truncate[n]['perplexity']:.2f}" for n in sorted(truncate)]
    change = f"{100 * (truncate[short]['perplexity'] / free_short - 1):+.1f} %" if free_short else "—"
    past = "—" if base is None else f"{mean_nll(truncate[longest], trained) - mean_nll(base, trained):+.3f}"
    found = {n: (k, t) for n, k, t in by_length(ret)}
    hits = [rate_text(*found[n]) if n in found else "not run" for n in rlengths]
    return "| " + " | ".join([LABELS[arm], *cells, change, past, *hits]) + " |"


def report(args) -> Path:
    """report.md and its two plots, from the stored results only: the arms side by side
    (perplexity; the change at the shortest length against the training-free arm; mean NLL past
    L minus the arm's own sliding baseline's; retrieval with Wilson 95 % intervals), then each
    arm's `hf-posext eval` table and retrieval cells with the answers given."""
    from hf_posext.evaluation.shared.results import format_length, format_table, plot_nll_by_position
    from hf_posext.evaluation.retrieval.plots import plot_accuracy
    from hf_posext.evaluation.retrieval.stats import wilson
    arms = [a for a in ARMS if (args.out / a / "done.json").exists()]
    if not arms:
        raise SystemExit(f"no finished arm in {args.out}: nothing to report")
    data = {a: (stored(args.out / a, "perplexity"), stored(args.out / a, "retrieval")) for a in arms}
    ppl0 = data[arms[0]][0]
    lengths = sorted({int(r["length"]) for r in ppl0 if r["protocol"] == "truncate"})
    rlengths = sorted({int(r["length"]) for a in arms for r in data[a][1]})
    trained = format_length(int(ppl0[0]["trained_length"]))
    free_short = next((r["perplexity"] for r in data["free"][0] if r["protocol"] == "truncate"
                       and int(r["length"]) == lengths[0]), None) if "free" in data else None
    head = (["arm"] + [f"ppl {format_length(n)}" for n in lengths]
            + [f"ppl {format_length(lengths[0])} vs training-free",
               f"NLL past {trained} minus own sliding ({format_length(lengths[-1])})"]
            + [f"retrieval {format_length(n)} [Wilson 95 %]" for n in rlengths])
    lines = ["# Fine-tuning for the extended context: three arms (issue #31)", "",
             f"Each arm's checkpoint as saved (YaRN s={args.factor:g} in its config), on `{args.eval_document}` "
             f"(held out of training) and the retrieval suite's single-needle task (depths {args.depths}, "
             f"{args.trials} trials a cell). Made by `python benchmarks/finetune_retrieval.py` (settings in each "
             "arm's done.json).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [arm_line(a, *data[a], free_short, rlengths) for a in arms]
    plot_accuracy([r for a in arms for r in relabel(data[a][1], a)], args.out / "retrieval_arms.png",
                  f"single needle by arm (YaRN s={args.factor:g}; {args.trials} trials a cell, depths {args.depths})")
    longest = [r for a in arms for r in relabel(data[a][0], a) if int(r["length"]) == lengths[-1]]
    base = [r for r in ppl0 if r["protocol"] == "baseline" and int(r["length"]) == lengths[-1]]
    plot_nll_by_position(longest + base, args.out / "loss_by_position_arms.png",
                         f"loss by position on {args.eval_document}; dashed: the {LABELS[arms[0]]} arm "
                         "read in sliding windows of its trained length")
    lines += ["", "![retrieval by arm](retrieval_arms.png)", "",
              "![loss by position by arm](loss_by_position_arms.png)", ""]
    for a in arms:
        lines += [f"## {a}", "", "```", format_table(data[a][0]), "```", "",
                  "| length | depth | correct / trials | Wilson 95 % | answers given (first 60 characters) |",
                  "|---|---|---|---|---|"]
        for r in data[a][1]:
            k, n = int(r["correct"]), int(r["trials"])
            lo, hi = wilson(k, n)
            lines.append(f"| {r['length']} | {r['depth']} | {k} / {n} | [{lo:.2f}, {hi:.2f}] | "
                         f"{r['outputs'][:60].replace('|', '/')} |")
        lines.append("")
    path = args.out / "report.md"
    path.write_text("\n".join(lines))
    return path


def main(argv=None) -> int:
    args = parse(argv)
    for arm in args.arms:
        run_arm(args, arm)
    print(f"report: {report(args)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())

"""Effective length at 4x: RULER's single needle (`niah_single`, RULER's wording)
at 32k on the embedded SmolLM2-135M (trained at 8,192), training-free: YaRN s = 4, DPE with its
committed 32k detection (results/dpe/dpe-32k-bf16.json) and Self-Extend as the side-by-side runs
them; fine-tuned: the 4x retrieval recipe's checkpoint (recipes/cpu-smollm2-retrieval-4x.yaml,
asked with `--methods none`: its saved config carries YaRN s = 4); in three haystacks no method or recipe was tuned on: RULER's noise, a held-out play (Hamlet: neither the searches nor the
recipe's training saw it) and source code (torch's `_refs/__init__.py`, fixed by the torch pin).
Five depths, sequential looks of 4 needles a depth up to 20, each cell decided against a fixed
bar of 0.7 (the target's lower Wilson bound) within a wall-time budget; and, in the code haystack,
the unpatched model within L (8k) as the reference a method's accuracy is read against.

    python benchmarks/effective_length_4x.py run noise       # then hamlet, code (each resumable)
    python benchmarks/effective_length_4x.py run noise --method dpe   # or self_extend
    python benchmarks/effective_length_4x.py run noise --method finetuned   # after training the 4x recipe
    python benchmarks/effective_length_4x.py reference code  # the unpatched model at 8k in code
    python benchmarks/effective_length_4x.py report          # -> results/effective_length_4x.md

Each step is one `hf-posext retrieval` command (printed); a rerun resumes the stored looks.
`--budget 3h` gives one invocation more wall time than the haystack's default (a 32k cell of four
trials takes about an hour for DPE on 2 busy cores, more than the default budget).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "effective-length-4x"
PAGE = HERE / "results" / "effective_length_4x.md"
BAR, DEPTHS, BUDGET = 0.7, "0,0.25,0.5,0.75,1", {"noise": "40m", "hamlet": "40m", "code": "30m"}
# the attention-level methods' knobs: DPE's detected scales, Self-Extend's window (side_by_side.py)
KNOBS = {"yarn": [], "dpe": ["--knobs", f"dpe:group_scales=@{HERE / 'results' / 'dpe' / 'dpe-32k-bf16.json'}"],
         "self_extend": ["--knobs", "self_extend:window=6144,self_extend:group_size=auto"], "finetuned": []}
# the 4x recipe's checkpoint (its output_dir's `final`, relative to the repository as the recipe's
# command writes it); its config carries the extension, so it is asked with no method on top
FINETUNED = "runs/cpu-smollm2-retrieval-4x/final"
LABELS = {"noise": "RULER's noise", "hamlet": "Hamlet (held out)",
          "code": "source code (torch/_refs/__init__.py, torch 2.13.0)"}


def code_path() -> str:
    import torch
    return str(Path(torch.__file__).parent / "_refs" / "__init__.py")


def dataset(haystack: str) -> str:
    return {"noise": "noise", "hamlet": "embedded:shakespeare/hamlet", "code": code_path()}[haystack]


def run_folder(haystack: str, method: str) -> Path:
    """YaRN's rows in the haystack's folder (its first runs), another method's beside it."""
    return OUT / (haystack if method == "yarn" else f"{haystack}-{method}")


def run_argv(haystack: str, method: str = "yarn", budget: str | None = None) -> list[str]:
    out = ["--dtype", "float32", "--dataset", dataset(haystack), "--no-progress", "--out", str(run_folder(haystack, method))]
    if method == "finetuned":
        # a fixed grid of 2 needles a depth, the design of the 2x recipe's noise check, so the two
        # read side by side; 10/10 would clear the target (Wilson lower bound 0.72)
        return ["retrieval", "--tasks", "niah_single", "--model", FINETUNED, "--methods", "none", "--lengths", "32k",
                "--depths", DEPTHS, "--trials", "2", *out]
    return ["retrieval", "--tasks", "niah_single", "--methods", method, *KNOBS[method], "--lengths", "32k", "--factor", "4",
            "--depths", DEPTHS, "--trials", "20", "--look", "4", "--sequential", "--bar", str(BAR),
            "--budget", budget or BUDGET[haystack], *out]


def reference_argv(haystack: str) -> list[str]:
    return ["retrieval", "--tasks", "niah_single", "--methods", "yarn", "--lengths", "8k,32k", "--factor", "4",
            "--depths", DEPTHS, "--trials", "20", "--look", "4", "--dtype", "float32", "--sequential",
            "--dataset", dataset(haystack), "--budget", "45m", "--no-progress",
            "--out", str(OUT / f"{haystack}-reference")]


def cli(argv: list[str], folder: Path) -> None:
    argv = argv + (["--resume"] if (folder / "retrieval.json").exists() else [])
    print("+ hf-posext " + " ".join(argv), flush=True)
    # from the repository: the fine-tuned checkpoint's path is relative to it, as the recipe writes it
    subprocess.run([sys.executable, "-m", "hf_posext.cli", *argv], check=True, cwd=HERE.parent)


def shown(argv: list[str]) -> str:
    """A command as the page shows it: paths relative to the repository, code's file by name."""
    text = "hf-posext " + " ".join(argv)
    return text.replace(code_path(), "$TORCH/_refs/__init__.py").replace(str(HERE.parent) + "/", "")


def question_rows(folder: Path) -> dict[tuple, list[dict]]:
    """(method, length) -> its cells, each cell's looks pooled (merge_blocks), depth order."""
    from hf_posext.evaluation import read_rows
    from hf_posext.evaluation.retrieval.blocks import merge_blocks
    out: dict[tuple, list[dict]] = {}
    if not (folder / "retrieval.json").exists():
        return out
    for r in sorted(merge_blocks(read_rows(folder / "retrieval.json")), key=lambda r: float(r["depth"])):
        out.setdefault((r["method"], int(r["length"])), []).append(r)
    return out


def latest_decision(folder: Path, method: str, length: int) -> tuple[str, str]:
    """The question's decision after its last stored look, with its bounds."""
    from hf_posext.evaluation import read_rows
    rows = [r for r in read_rows(folder / "retrieval.json") if r["method"] == method and int(r["length"]) == length]
    last = max(rows, key=lambda r: int(r.get("look") or 0))
    if last.get("look") is None:   # a fixed grid (the fine-tuned arm): nothing sequential to call
        return "fixed grid", ""
    if last.get("decision") is None:
        return "—", ""
    return str(last["decision"]), f"[{last['decision_low']:.2f}, {last['decision_high']:.2f}] vs {last['bar']}"


def line(label: str, method: str, length: int, cells: list[dict], folder: Path) -> str:
    """One table row; a row of the fine-tuned folder is named by its recipe (its method is none)."""
    from hf_posext.evaluation.retrieval.stats import wilson
    k, n = sum(int(r["correct"]) for r in cells), sum(int(r["trials"]) for r in cells)
    low, high = wilson(k, n)
    depths = " · ".join(f"{float(r['depth']):g}: {r['correct']}/{r['trials']}" for r in cells)
    decision, bounds = latest_decision(folder, method, length)
    if method == "none" and length <= 8192:   # the reference: its accuracy less the margin is the bar
        decision, bounds = "reference:", f"bar {k / n - 0.1:.2f}"
    met = "met" if n and k / n >= 0.9 and low >= 0.7 else f"missed (accuracy {k / n:.2f}, lower bound {low:.2f})"
    wanted = len(DEPTHS.split(","))
    if length > 8192 and len(cells) < wanted:   # a run stopped inside its first look: no verdict yet
        met = f"open: {len(cells)} of {wanted} depths ran"
    minutes = sum(float(r["seconds"]) for r in cells) / 60
    name = ("fine-tuned: 4x retrieval recipe, seed 0" if folder.name.endswith("-finetuned") else
            "unpatched" if method == "none" else f"{method} s = {float(cells[0]['factor']):g}" if method == "yarn"
            else method)
    return (f"| {label} | {name} | {length // 1024}k | {k}/{n} = {k / n:.2f} [{low:.2f}, {high:.2f}] | {depths} | "
            f"{decision} {bounds} | {met if length > 8192 else '(within L)'} | {minutes:.0f} min |")


def write_page() -> Path:
    """results/effective_length_4x.md from the stored rows of every step that ran."""
    from hf_posext.evaluation.shared.summary import write_page_keeping_reading
    head = ["| haystack | method | length | niah_single (Wilson 95 %) | by depth | sequential call | "
            "target (>= 0.9, lower bound >= 0.7) | wall time |", "|---|---|---|---|---|---|---|---|"]
    lines, commands, missing = [], [], []
    for haystack, label in LABELS.items():
        steps = [(m, run_folder(haystack, m), run_argv(haystack, m)) for m in KNOBS]
        steps.append(("reference", OUT / f"{haystack}-reference", reference_argv(haystack)))
        for step, folder, argv in steps:
            questions = question_rows(folder)
            if not questions and step != "reference":
                missing.append(f"{label}: {step}")
            for (method, length), cells in sorted(questions.items(), key=lambda q: (q[0][1], q[0][0])):
                lines.append(line(label, method, length, cells, folder))
            if questions:
                commands.append(shown(argv))
    text = [
        "# Effective length at 4x: RULER's single needle at 32k", "",
        "Made by `python benchmarks/effective_length_4x.py report` from the rows of the commands below "
        "(the embedded SmolLM2-135M, trained at 8,192 tokens; float32, 2 CPU cores; RULER's `niah_single` "
        "wording; none of the haystacks was used to tune a method or the recipe). A cell's looks are pooled; "
        "the sequential call is the question's decision against the bar after its last look, with its "
        "Clopper-Pearson bounds at the level that holds over all looks (docs/retrieval_sequential.md). A call of "
        "`undecided` means the budget ran out first.", "", *head, *lines, ""]
    if missing:
        text += [f"Not run in this round: {', '.join(missing)}.", ""]
    text += ["Commands (`$TORCH` is the installed torch package's folder):", "", "```bash", *commands, "```", ""]
    return write_page_keeping_reading(PAGE, text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=("run", "reference", "report"))
    p.add_argument("haystack", nargs="?", choices=tuple(LABELS))
    p.add_argument("--method", choices=tuple(KNOBS), default="yarn",
                   help=f"the method `run` measures (finetuned: the checkpoint at {FINETUNED})")
    p.add_argument("--budget", help="this invocation's wall time, e.g. 3h (default: the haystack's, "
                   + ", ".join(f"{h} {b}" for h, b in BUDGET.items()) + ")")
    args = p.parse_args()
    if args.step != "report" and args.haystack is None:
        p.error(f"{args.step} needs a haystack: {', '.join(LABELS)}")
    if args.step == "run":
        if args.method == "finetuned" and not (HERE.parent / FINETUNED).is_dir():
            p.error(f"no checkpoint at {FINETUNED}: train it first with `accelerate launch --cpu "
                    "--num_processes 1 recipes/finetune.py --config recipes/cpu-smollm2-retrieval-4x.yaml`")
        cli(run_argv(args.haystack, args.method, args.budget), run_folder(args.haystack, args.method))
    elif args.step == "reference":
        cli(reference_argv(args.haystack), OUT / f"{args.haystack}-reference")
    else:
        print(f"wrote {write_page()}")


if __name__ == "__main__":
    main()

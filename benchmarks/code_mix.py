"""Does the retrieval recipe carry to source code when its mix holds code? RULER's single needle
(`niah_single`, RULER's wording) at 16k inside torch's `_refs/__init__.py` (a file no arm trained
on), on the embedded SmolLM2-135M (trained at 8,192), YaRN s = 2, in two settings of the recipe
(recipes/cpu-smollm2-retrieval.yaml):

    code       the recipe in its 1k-window setting (PREVIOUS_2X_FLAGS) with half its synthetic
               examples built in Python's standard library code (`data.synthetic.haystacks`)
    prose      the same setting as it was (synthetic examples in the plays' text only)
    code-2k    the recipe as shipped (2k-token windows) with the same code haystacks
    prose-2k   the recipe as shipped
    free       training-free YaRN s = 2 (and the unpatched model beside it)

    python benchmarks/code_mix.py train code      # ~15 min of training on 2 cores (-2k arms ~20 min)
    python benchmarks/code_mix.py ask code        # the needle grid on the arm's checkpoint (free: none)
    python benchmarks/code_mix.py noise code      # the same checkpoint in RULER's noise
    python benchmarks/code_mix.py report          # -> results/retrieval_code_mix.md

--seed S trains (and asks) an arm with another training seed, in `<arm>-seed<S>`; --task multi_key
asks RULER's multi_key (the needle among three distractor keys) instead of niah_single, in
`<folder>-multi_key`.

Checkpoints go to --runs (default runs/code-mix, git-ignored); the retrieval rows to
results/retrieval-code-mix/<arm>/ (a rerun resumes them); `report` also writes
results/retrieval-code-mix/runs.json (each folder's commands and training setting), which the
effective-length table reads.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from effective_length_4x_runs import code_path   # the same held-out code file as the 4x runs
# the recipe's setting when code and prose trained, and the table's names of the arms' settings
from effective_length_sources import PREVIOUS_2X_FLAGS, PREVIOUS_2X_NAME
from effective_length_table import CODE_MIX_NAME, TASKS   # the tasks the table reads

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "retrieval-code-mix"
PAGE = HERE / "results" / "retrieval_code_mix.md"
RECIPE = "recipes/cpu-smollm2-retrieval.yaml"
CODE = ["--data.synthetic.haystacks", "[training, embedded:python-stdlib]"]
PROSE = ["--eval.enabled", "false"]   # the code arms keep their own evaluation: perplexity on Hamlet
# arm -> (the recipe setting it trains: flags on the shipped recipe, the arm's own flags); free is not trained
ARMS: dict[str, tuple[tuple[str, ...], list[str]] | None] = {
    "code": (PREVIOUS_2X_FLAGS, CODE), "prose": (PREVIOUS_2X_FLAGS, PROSE), "free": None,
    "code-2k": ((), CODE), "prose-2k": ((), PROSE)}
GRID = ["--tasks", "niah_single", "--lengths", "16k", "--depths", "0.1,0.5,0.9", "--trials", "4",
        "--dtype", "float32", "--no-progress"]


def run_name(arm: str, seed: int) -> str:
    """An arm's folder (checkpoint and rows): `<arm>` for training seed 0, `<arm>-seed<s>` else."""
    return arm if seed == 0 else f"{arm}-seed{seed}"


def arm_of(name: str) -> tuple[str, int]:
    arm, _, seed = name.partition("-seed")
    return arm, int(seed or 0)


def training(arm: str) -> tuple[tuple[str, ...], list[str]]:
    """The arm's (recipe setting flags, own flags); nothing for the untrained free arm."""
    return ARMS[arm] or ((), [])


def train_argv(name: str, runs: Path) -> list[str]:
    arm, seed = arm_of(name)
    setting, flags = training(arm)
    return ["accelerate", "launch", "--cpu", "--num_processes", "1", "recipes/finetune.py", "--config", RECIPE,
            *setting, *flags, *(["--training.seed", str(seed)] if seed else []), "--output_dir", str(runs / name)]


def with_task(argv: list[str], task: str) -> list[str]:
    """A grid's command asking `task`: niah_single as written, another task in `<folder>-<task>`."""
    if task == "niah_single":
        return argv
    argv = [task if a == "niah_single" else a for a in argv]
    return [*argv[:-1], f"{argv[-1]}-{task}"]


def ask_argv(name: str, runs: Path, task: str = "niah_single") -> list[str]:
    model = ["--methods", "yarn", "--factor", "2"] if name == "free" else \
        ["--model", str(runs / name / "final"), "--methods", "none"]
    return with_task(["hf-posext", "retrieval", *model, *GRID, "--dataset", code_path(), "--out", str(OUT / name)],
                     task)


# the shipped recipe's own check (docs/finetuning_mix.md): RULER's noise,
# five depths, two needles each, so an arm's figure in prose reads beside the six seeds' 59/60
NOISE_GRID = ["--tasks", "niah_single", "--lengths", "16k", "--depths", "0,0.25,0.5,0.75,1", "--trials", "2",
              "--dtype", "float32", "--no-progress", "--dataset", "noise"]


def noise_argv(name: str, runs: Path, task: str = "niah_single") -> list[str]:
    return with_task(["hf-posext", "retrieval", "--model", str(runs / name / "final"), "--methods", "none",
                      *NOISE_GRID, "--out", str(OUT / f"{name}-noise")], task)


def shown(argv: list[str]) -> str:
    return shlex.join(argv).replace(code_path(), "$TORCH/_refs/__init__.py").replace(str(HERE.parent) + "/", "")


def run(argv: list[str]) -> None:
    if argv[0] == "hf-posext":
        argv = [sys.executable, "-m", "hf_posext.cli", *argv[1:]] + (
            ["--resume"] if (Path(argv[-1]) / "retrieval.json").exists() else [])
    print("+ " + shlex.join(argv), flush=True)
    code = subprocess.run(argv, cwd=HERE.parent).returncode
    if code:   # its own error is above; no traceback of this wrapper on top of it
        sys.exit(f"the command above failed (exit status {code})")


def write_page(runs: Path) -> Path:
    from hf_posext.evaluation import read_rows
    from hf_posext.evaluation.shared.summary import write_page_keeping_reading
    from hf_posext.evaluation.retrieval.stats import score_trial, wilson
    lines = ["| arm | method as evaluated | accuracy at 16k (Wilson 95 %) | by depth | answers that missed | wall time |",
             "|---|---|---|---|---|---|"]
    commands = []
    runs_of: dict[str, dict] = {}   # the sidecar the effective-length table reads: folder -> its run
    # each arm's seed 0, then its other training seeds that ran
    names = [n for arm in ARMS for n in [arm, *sorted((p.name for p in OUT.glob(f"{arm}-seed*")
                                                        if p.name.partition("-seed")[2].isdigit()), key=arm_of)]]
    # (label, the command's argv, its task); niah_single rows show `not run`, multi_key rows only once run
    steps = [(f"{n}{'' if t == TASKS[0] else f' ({t})'}", ask_argv(n, runs, t), t) for t in TASKS for n in names]
    steps += [(f"{n} (noise{'' if t == TASKS[0] else f', {t}'})", noise_argv(n, runs, t), t) for t in TASKS
              for n in names if ARMS[arm_of(n)[0]] is not None]
    for label, argv, task in steps:
        name = label.split()[0]
        arm = arm_of(name)[0]
        path = Path(argv[-1]) / "retrieval.json"
        if not path.exists():
            lines += [f"| {label} | not run | | | | |"] if task == TASKS[0] else []
            continue
        trained = [shown(train_argv(name, runs))] if ARMS[arm] is not None else []
        if trained and "(" not in label:   # an arm's first row: the command that trained it
            commands += trained
        commands.append(shown(argv))
        setting, flags = training(arm)
        # the table's name of the arm's training setting ("": the shipped recipe's own, pooled into its row)
        note = ", ".join(n for n in (PREVIOUS_2X_NAME if setting else "", CODE_MIX_NAME if flags == CODE else "") if n)
        runs_of[path.parent.name] = {"commands": [*trained, shown(argv)], "trained": ARMS[arm] is not None,
                                     "seed": arm_of(name)[1], "note": note,
                                     "asked_depths": len(argv[argv.index("--depths") + 1].split(","))}
        rows = sorted(read_rows(path), key=lambda r: (r["method"], float(r["depth"])))
        for method in dict.fromkeys(r["method"] for r in rows):
            cells = [r for r in rows if r["method"] == method]
            k, n = sum(int(r["correct"]) for r in cells), sum(int(r["trials"]) for r in cells)
            low, high = wilson(k, n)
            depths = " · ".join(f"{float(r['depth']):g}: {r['correct']}/{r['trials']}" for r in cells)
            missed = sorted({" ".join(o.split())[:24] for r in cells for o, a in zip(r["outputs"], r["answers"])
                             if score_trial(o, a, False) < 1})   # the suite's own scoring
            name = {"none": "as saved" if ARMS[arm] is not None else "unpatched", "yarn": "YaRN s = 2"}[method]
            minutes = sum(float(r["seconds"]) for r in cells) / 60
            lines.append(f"| {label} | {name} | {k}/{n} = {k / n:.2f} [{low:.2f}, {high:.2f}] | {depths} | "
                         f"{'; '.join(f'`{m}`' for m in missed[:4]) or '—'} | {minutes:.0f} min |")
    text = ["# Retrieval in code: the recipe's mix with and without code", "",
            "Made by `python benchmarks/code_mix.py report` from the rows of the commands below (the embedded "
            "SmolLM2-135M, trained at 8,192 tokens; float32, 2 CPU cores; RULER's `niah_single` wording "
            "(`multi_key` where the row says so), four "
            "needles a depth; the haystack is torch's `_refs/__init__.py`, which no arm trained on (the `(noise)` rows: "
            "RULER's noise, two needles at each of five depths); the code arms' "
            "examples were built in Python's standard library; the -2k arms train the recipe as shipped, 2k-token "
            "windows, the others its 1k-window setting). `answers that missed`: the start of each wrong "
            "answer.", "", *lines, "", "Commands (`$TORCH` is the installed torch package's folder; "
            "`runs/` a folder of your choosing):", "", "```bash", *commands, "```", ""]
    (OUT / "runs.json").write_text(json.dumps(runs_of, indent=1) + "\n")
    return write_page_keeping_reading(PAGE, text)



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=("train", "ask", "noise", "report"))
    p.add_argument("arm", nargs="?", choices=tuple(ARMS))
    p.add_argument("--runs", type=Path, default=Path("runs/code-mix"), help="the checkpoints' folder")
    p.add_argument("--task", choices=TASKS, default=TASKS[0], help="the RULER task asked (ask, noise)")
    p.add_argument("--seed", type=int, default=0, help="the arm's training seed (`training.seed`; folder "
                                                       "`<arm>-seed<s>` for a seed other than 0)")
    args = p.parse_args()
    if args.step != "report" and args.arm is None:
        p.error(f"{args.step} needs an arm: {', '.join(ARMS)}")
    if args.seed < 0 or (args.seed and args.arm == "free") or (args.seed and args.step == "report"):
        p.error(f"--seed {args.seed}: a training seed is >= 0 and names a trained arm (code, prose, code-2k, "
                "prose-2k) to train, ask or noise; the free arm and the report take none")
    if args.task != TASKS[0] and args.step not in ("ask", "noise"):
        p.error(f"--task {args.task}: only `ask` and `noise` ask a task; `{args.step}` takes none")
    name = run_name(args.arm, args.seed) if args.arm else ""
    seeded = f" --seed {args.seed}" if args.seed else ""
    if args.step == "train":
        if ARMS[args.arm] is None:
            p.error("the free arm is not trained: `ask free` evaluates it")
        run(train_argv(name, args.runs))
    elif args.step in ("ask", "noise"):
        if ARMS[args.arm] is not None and not (args.runs / name / "final").is_dir():
            p.error(f"{args.runs / name / 'final'} does not exist: run `train {args.arm}{seeded}` first")
        if args.step == "noise" and ARMS[args.arm] is None:
            p.error("`noise` asks a fine-tuned arm (code, prose, code-2k, prose-2k); YaRN's figure in noise "
                    "is on the retrieval page")
        run((ask_argv if args.step == "ask" else noise_argv)(name, args.runs, args.task))
    else:
        print(f"wrote {write_page(args.runs)}")


if __name__ == "__main__":
    main()

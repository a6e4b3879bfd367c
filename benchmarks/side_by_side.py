"""Issue #41's side by side: YaRN, CoPE, DPE, the search under each objective and the best
attention-level method, on the embedded SmolLM2-135M at 2x (16k), on text none was tuned on.

Tuning text (DPE's detection, both searches): King Lear. Held out: Hamlet (per-position
perplexity, float32, against the unpatched model's sliding 8k window) and RULER's noise haystack
with RULER's wordings (retrieval: niah_single, multi_key, five depths, bfloat16 -- the AMX
matrix units make a 16k forward 2.5x faster than float32 here, and every method runs in the one
dtype). At 4x (32k) only the methods that need no detection or search at 32k run (YaRN, CoPE,
Self-Extend with its knobs from King Lear), in bfloat16: a 32k DPE detection is 41 forwards of
32k tokens and a search at 32k 45 minutes, more than a session here holds; the 4x rows of the
earlier searches are in results/search.md. The best attention-level method on Hamlet at 16k and
32k is Self-Extend with window 6144 and group_size auto (benchmarks/results/long_context.md).

Each step runs hf-posext's own commands, resumably (a rerun skips what is on disk):

    python benchmarks/side_by_side.py dpe        # dpe-detect at 16k, bf16  -> results/dpe/dpe-16k-bf16.json
    python benchmarks/side_by_side.py search     # needle and perplexity objectives, same budget
    python benchmarks/side_by_side.py eval       # per-position perplexity on Hamlet at 16k
    python benchmarks/side_by_side.py retrieval  # niah_single, multi_key at 16k, 5 depths
    python benchmarks/side_by_side.py eval32     # 4x: the methods needing no 32k tuning, bf16
    python benchmarks/side_by_side.py report     # results/side_by_side.md and its plot
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from hf_posext.evaluation.shared.results import format_length

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OUT = RESULTS / "side-by-side"
TUNE = "embedded:shakespeare/king-lear"
HELD_OUT = "embedded:shakespeare/hamlet"
TARGET = 16384               # 2x the embedded model's trained 8,192
TARGET4 = 32768              # 4x
SIZE, SIZE4 = format_length(TARGET), format_length(TARGET4)   # folder names, as the report derives them
METHODS4 = "yarn,cope,self_extend"   # at 4x, the methods needing no detection or search there
DPE_FILE = RESULTS / "dpe" / f"dpe-{SIZE}-bf16.json"
OBJECTIVES = ("needle", "perplexity")
SEARCH_MINUTES = 15          # each objective the same wall-time budget on this 2-core CPU
METHODS = "yarn,cope,dpe,self_extend"
# Self-Extend as benchmarks/long_context.py runs it; DPE with the scales its detection found
SELF_EXTEND = "self_extend:window=6144,self_extend:group_size=auto"
KNOBS = f"{SELF_EXTEND},dpe:group_scales=@{DPE_FILE}"
TASKS, DEPTHS, TRIALS = "niah_single,multi_key", "0,0.25,0.5,0.75,1", 1


def search_dir(objective: str) -> Path:
    return OUT / f"search-{objective}-{SIZE}"


def cli(*argv: str) -> None:
    cmd = [sys.executable, "-m", "hf_posext.cli", *argv]
    print("+ hf-posext " + " ".join(argv), flush=True)
    subprocess.run(cmd, check=True)


def resume(out: Path) -> list[str]:
    return ["--resume"] if out.exists() else []


def step_dpe() -> None:
    cli("dpe-detect", "--dataset", TUNE, "--target-length", str(TARGET), "--dtype", "bfloat16",
        "--out", str(DPE_FILE))


def step_search() -> None:
    for objective in OBJECTIVES:
        out = search_dir(objective)
        if (out / "config.json").exists():
            print(f"{out} holds a finished search; skipped", flush=True)
            continue
        cli("search", "--objective", objective, "--dataset", TUNE, "--target-length", str(TARGET),
            "--proxy-length", "4k", "--algorithm", "evolution", "--budget-minutes", str(SEARCH_MINUTES),
            "--no-final-check", "--no-progress", "--out", str(out))


def need(path: Path, step: str) -> None:
    if not path.exists():
        sys.exit(f"{path} is missing: run `python benchmarks/side_by_side.py {step}` first.")


def step_eval() -> None:
    need(DPE_FILE, "dpe")
    out = OUT / f"eval-{SIZE}"
    cli("eval", "--dtype", "float32", "--dataset", HELD_OUT, "--lengths", str(TARGET), "--methods", METHODS,
        "--knobs", KNOBS, "--out", str(out), "--no-progress", *resume(out))
    for objective in OBJECTIVES:   # the searched checkpoint read as it is (its own longrope config)
        need(search_dir(objective) / "config.json", "search")
        out = OUT / f"eval-{SIZE}-search-{objective}"
        cli("eval", "--model", str(search_dir(objective)), "--dtype", "float32", "--dataset", HELD_OUT,
            "--lengths", str(TARGET), "--methods", "none", "--no-baseline", "--out", str(out),
            "--no-progress", *resume(out))


def step_eval32() -> None:
    out = OUT / f"eval-{SIZE4}"
    cli("eval", "--dtype", "bfloat16", "--dataset", HELD_OUT, "--lengths", str(TARGET4),
        "--methods", METHODS4, "--knobs", SELF_EXTEND, "--out", str(out),
        "--no-progress", *resume(out))


def step_retrieval() -> None:
    need(DPE_FILE, "dpe")
    grid = ["--dtype", "bfloat16", "--tasks", TASKS, "--lengths", str(TARGET), "--depths", DEPTHS,
            "--trials", str(TRIALS), "--no-progress"]
    out = OUT / f"retrieval-{SIZE}"
    cli("retrieval", "--methods", METHODS, "--knobs", KNOBS, *grid, "--out", str(out), *resume(out))
    for objective in OBJECTIVES:
        need(search_dir(objective) / "config.json", "search")
        out = OUT / f"retrieval-{SIZE}-search-{objective}"
        cli("retrieval", "--model", str(search_dir(objective)), "--methods", "none", *grid,
            "--out", str(out), *resume(out))


def step_report() -> None:
    from side_by_side_report import Setup, write_report   # it reads the rows; what was run, from here
    setup = Setup(tune=TUNE, held_out=HELD_OUT, target=TARGET, objectives=OBJECTIVES,
                  search_minutes=SEARCH_MINUTES, knobs=KNOBS, tasks=TASKS, depths=DEPTHS,
                  dpe_file=DPE_FILE.name, commands=__doc__ or "", target4=TARGET4, methods4=METHODS4)
    print(f"wrote {write_report(OUT, RESULTS / 'side_by_side.md', setup)}", flush=True)


STEPS = {"dpe": step_dpe, "search": step_search, "eval": step_eval, "retrieval": step_retrieval,
         "eval32": step_eval32, "report": step_report}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=[*STEPS, "all"])
    args = p.parse_args(argv)
    for name in (list(STEPS) if args.step == "all" else [args.step]):
        STEPS[name]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

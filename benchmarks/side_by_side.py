"""The side by side: YaRN, CoPE, DPE, the search under each objective and the best
attention-level method, on the embedded SmolLM2-135M at 2x (16k) and 4x (32k), on text none
was tuned on.

Tuning text (DPE's detection, the searches): King Lear. Held out: Hamlet (per-position
perplexity against the unpatched model's sliding 8k window; float32 at 2x, bfloat16 at 4x) and,
at 2x, RULER's noise haystack with RULER's wordings (retrieval: niah_single, multi_key, five
depths, bfloat16 -- the AMX matrix units make a 16k forward 2.5x faster than float32 here, and
every method runs in the one dtype). The best attention-level method on Hamlet at 16k and 32k is
Self-Extend with window 6144 and group_size auto (benchmarks/results/long_context.md).

At 4x every method runs, perplexity only: DPE with the scales of its own 32k detection, and the
two searches, which did not get the same budget. The needle objective is searched here (20
minutes, 8k proxy, evolution); the perplexity objective is not searched again: its 45-minute
search at 32k (8k proxy, evolution; benchmarks/search.py tune4, results/search.md) is reused,
and it predates the proxy's attention-mask fix (docs/search.md: its spans were each scored in
isolation). Its folder kept only config.json and the log (the weights were the embedded model's,
unchanged), so `search32` rebuilds the checkpoint under side-by-side/ with hf_posext.search's
save_best, the path the search itself saved it by, and checks the rope config written equals
the searched one.

Each step runs hf-posext's own commands, resumably (a rerun skips what is on disk):

    python benchmarks/side_by_side.py dpe        # dpe-detect at 16k, bf16  -> results/dpe/dpe-16k-bf16.json
    python benchmarks/side_by_side.py search     # needle and perplexity objectives, same budget
    python benchmarks/side_by_side.py eval       # per-position perplexity on Hamlet at 16k
    python benchmarks/side_by_side.py retrieval  # niah_single, multi_key at 16k, 5 depths
    python benchmarks/side_by_side.py dpe32      # dpe-detect at 32k, bf16  -> results/dpe/dpe-32k-bf16.json
    python benchmarks/side_by_side.py search32   # 4x: needle search; the reused perplexity search's checkpoint
    python benchmarks/side_by_side.py eval32     # 4x: every method on Hamlet at 32k, bf16
    python benchmarks/side_by_side.py report     # results/side_by_side.md and its plots

`--results DIR` puts all of it (the page, its plots, dpe/, side-by-side/, and the reused 4x search
read from there) under DIR instead of benchmarks/results.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hf_posext.evaluation.shared.results import format_length

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TUNE = "embedded:shakespeare/king-lear"
HELD_OUT = "embedded:shakespeare/hamlet"
TARGET = 16384               # 2x the embedded model's trained 8,192
TARGET4 = 32768              # 4x
SIZE, SIZE4 = format_length(TARGET), format_length(TARGET4)   # folder names, as the report derives them
OBJECTIVES = ("needle", "perplexity")
SEARCH_MINUTES = 15          # each objective at 2x the same wall-time budget on this 2-core CPU
SEARCH_MINUTES4 = 20         # the needle objective at 4x
PROXY, PROXY4 = "4k", "8k"   # the searches' proxy lengths at 2x and 4x
REUSED4_MINUTES = 45         # the reused 4x perplexity search's budget (its command: results/search.md)
METHODS = "yarn,cope,dpe,self_extend"
# Self-Extend as benchmarks/long_context.py runs it; DPE with the scales its detection found
SELF_EXTEND = "self_extend:window=6144,self_extend:group_size=auto"
TASKS, DEPTHS, TRIALS = "niah_single,multi_key", "0,0.25,0.5,0.75,1", 1


@dataclass(frozen=True)
class Results:
    """Where the steps write and read: the page and its plots in `root`, the rows under
    root/side-by-side/ and root/dpe/."""
    root: Path

    @property
    def out(self) -> Path:
        return self.root / "side-by-side"

    @property
    def reused4(self) -> Path:
        """The perplexity objective's search at 4x, reused: benchmarks/search.py tune4 made it."""
        return self.root / "search-lear-32k"

    def dpe_file(self, target: int) -> Path:
        return self.root / "dpe" / f"dpe-{format_length(target)}-bf16.json"

    def knobs(self, target: int) -> str:
        return f"{SELF_EXTEND},dpe:group_scales=@{self.dpe_file(target)}"

    def search_dir(self, objective: str, target: int = TARGET) -> Path:
        """The searched checkpoint of `objective` (at 4x, perplexity: reused4's, rebuilt by search32)."""
        return self.out / f"search-{objective}-{format_length(target)}"


def cli(*argv: str) -> None:
    cmd = [sys.executable, "-m", "hf_posext.cli", *argv]
    print("+ hf-posext " + " ".join(argv), flush=True)
    subprocess.run(cmd, check=True)


def resume(out: Path) -> list[str]:
    return ["--resume"] if out.exists() else []


def need(path: Path, step: str) -> None:
    if not path.exists():
        sys.exit(f"{path} is missing: run `python benchmarks/side_by_side.py {step}` first.")


def detect(res: Results, target: int) -> None:
    cli("dpe-detect", "--dataset", TUNE, "--target-length", str(target), "--dtype", "bfloat16",
        "--out", str(res.dpe_file(target)))


def search(res: Results, objective: str, target: int, proxy: str, minutes: float) -> None:
    out = res.search_dir(objective, target)
    if (out / "config.json").exists():
        print(f"{out} holds a finished search; skipped", flush=True)
        return
    cli("search", "--objective", objective, "--dataset", TUNE, "--target-length", str(target),
        "--proxy-length", proxy, "--algorithm", "evolution", "--budget", f"{minutes}m",
        "--no-final-check", "--no-progress", "--out", str(out))


def rebuild(searched: Path, out: Path) -> None:
    """The embedded model saved with `searched`'s rope config by hf_posext.search.save_best (how
    `hf-posext search` saved it), then the rope config written checked equal to the searched one."""
    from transformers import AutoConfig

    from hf_posext.data.embedded import load_model, load_tokenizer
    from hf_posext.rope.compat import get_rope_parameters
    from hf_posext.search import SearchResult, save_best

    if not (searched / "config.json").is_file():   # committed with its log (results/search.md)
        sys.exit(f"{searched}/config.json is missing: restore it from git (benchmarks/search.py tune4 made it).")
    rope = lambda folder: get_rope_parameters(AutoConfig.from_pretrained(folder))   # noqa: E731
    wanted = rope(searched)
    if (out / "config.json").exists() and rope(out) == wanted:
        print(f"{out} holds {searched.name}'s checkpoint; skipped", flush=True)
        return
    long, short = wanted.get("long_factor"), wanted.get("short_factor")
    if wanted.get("rope_type") != "longrope" or short not in (long, [1.0] * len(long or [])):
        sys.exit(f"{searched}/config.json is not a longrope config with short_factor = long_factor "
                 "or identity (what save_best writes); rebuild it by hand.")
    model, tokenizer = load_model(), load_tokenizer()
    target = round(float(wanted["factor"]) * int(wanted["original_max_position_embeddings"]))
    best = SearchResult(long, float(wanted["attention_factor"]), math.nan, math.nan, math.nan,
                        source=f"{searched.name} (reused)", steps=0, checked=False)
    save_best(model, tokenizer, best, out, target, "same" if short == long else "identity")
    if rope(out) != wanted:
        sys.exit(f"{out}: the rope config written differs from {searched}/config.json's.")
    print(f"{out}: the embedded model with {searched.name}'s rope config", flush=True)


def eval_searched(res: Results, objective: str, target: int, dtype: str, step: str) -> None:
    """Perplexity of a searched checkpoint read as it is (its own rope config), no baseline."""
    need(res.search_dir(objective, target) / "config.json", step)
    out = res.out / f"eval-{format_length(target)}-search-{objective}"
    cli("eval", "--model", str(res.search_dir(objective, target)), "--dtype", dtype, "--dataset", HELD_OUT,
        "--lengths", str(target), "--methods", "none", "--no-baseline", "--out", str(out),
        "--no-progress", *resume(out))


def eval_all(res: Results, target: int, dtype: str, dpe_step: str, search_step: str) -> None:
    need(res.dpe_file(target), dpe_step)
    for objective in OBJECTIVES:   # before the long shared run: a missing search fails first
        need(res.search_dir(objective, target) / "config.json", search_step)
    out = res.out / f"eval-{format_length(target)}"
    cli("eval", "--dtype", dtype, "--dataset", HELD_OUT, "--lengths", str(target), "--methods", METHODS,
        "--knobs", res.knobs(target), "--out", str(out), "--no-progress", *resume(out))
    for objective in OBJECTIVES:
        eval_searched(res, objective, target, dtype, search_step)


def step_dpe(res: Results) -> None:
    detect(res, TARGET)


def step_search(res: Results) -> None:
    for objective in OBJECTIVES:
        search(res, objective, TARGET, PROXY, SEARCH_MINUTES)


def step_eval(res: Results) -> None:
    eval_all(res, TARGET, "float32", "dpe", "search")


def step_retrieval(res: Results) -> None:
    need(res.dpe_file(TARGET), "dpe")
    grid = ["--dtype", "bfloat16", "--tasks", TASKS, "--lengths", str(TARGET), "--depths", DEPTHS,
            "--trials", str(TRIALS), "--no-progress"]
    out = res.out / f"retrieval-{SIZE}"
    cli("retrieval", "--methods", METHODS, "--knobs", res.knobs(TARGET), *grid, "--out", str(out), *resume(out))
    for objective in OBJECTIVES:
        need(res.search_dir(objective) / "config.json", "search")
        out = res.out / f"retrieval-{SIZE}-search-{objective}"
        cli("retrieval", "--model", str(res.search_dir(objective)), "--methods", "none", *grid,
            "--out", str(out), *resume(out))


def step_dpe32(res: Results) -> None:
    detect(res, TARGET4)


def step_search32(res: Results) -> None:
    search(res, "needle", TARGET4, PROXY4, SEARCH_MINUTES4)
    rebuild(res.reused4, res.search_dir("perplexity", TARGET4))


def step_eval32(res: Results) -> None:
    eval_all(res, TARGET4, "bfloat16", "dpe32", "search32")


def step_report(res: Results) -> None:
    # they read the rows; what was run, from here
    from side_by_side_4x import section_4x
    from side_by_side_report import Search, Setup, write_report
    page = res.root / "side_by_side.md"
    setup = Setup(tune=TUNE, held_out=HELD_OUT, target=TARGET, knobs=res.knobs(TARGET), tasks=TASKS,
                  depths=DEPTHS, dpe_file=res.dpe_file(TARGET).name, commands=__doc__ or "",
                  searches=tuple(Search(o, res.search_dir(o), SEARCH_MINUTES) for o in OBJECTIVES))
    setup4 = Setup(tune=TUNE, held_out=HELD_OUT, target=TARGET4, knobs=res.knobs(TARGET4), tasks="",
                   depths="", dpe_file=res.dpe_file(TARGET4).name, commands=__doc__ or "", searches=(
                       Search("needle", res.search_dir("needle", TARGET4), SEARCH_MINUTES4),
                       Search("perplexity", res.reused4, REUSED4_MINUTES,
                              "reused: searched by benchmarks/search.py tune4 (results/search.md) before "
                              "the proxy's attention-mask fix (docs/search.md: its spans were each scored "
                              f"in isolation); evaluated from {res.search_dir('perplexity', TARGET4).name}/, "
                              "the embedded model saved with its config (side_by_side.py search32)")))
    print(f"wrote {write_report(res.out, page, setup, section_4x(res.out, page, setup4))}", flush=True)


STEPS = {"dpe": step_dpe, "search": step_search, "eval": step_eval, "retrieval": step_retrieval,
         "dpe32": step_dpe32, "search32": step_search32, "eval32": step_eval32, "report": step_report}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=[*STEPS, "all"])
    p.add_argument("--results", type=Path, default=RESULTS,
                   help="the folder every step writes and reads (default: this script's results/)")
    args = p.parse_args(argv)
    for name in (list(STEPS) if args.step == "all" else [args.step]):
        STEPS[name](Results(args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where the 4x runs of benchmarks/effective_length_4x.py live and the `hf-posext` commands that
make them: each (haystack, method, task, seed, length)'s folder under results/effective-length-4x and
its argv, the within-L references, the fine-tuned checkpoints' perplexity, and `steps`, every run the
page reads in order. The script's command line and page read these; a run is one command here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from effective_length_4x_arms import FINETUNED, arm_of, finetuned
from effective_length_grid import GRID_DEPTHS, TARGETS
from effective_length_table import CODE_LABEL

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "effective-length-4x"
PAGE = HERE / "results" / "effective_length_4x.md"
BAR, BUDGET = 0.7, {"noise": "40m", "hamlet": "40m", "code": "30m"}   # a 32k invocation's wall time
BUDGET_16K = "30m"   # a 16k prompt costs about half a 32k one (the 16k runs: 44 min for 20)
DEPTHS = ",".join(f"{d:g}" for d in sorted(GRID_DEPTHS))   # 0,0.25,0.5,0.75,1
# the grid's lengths: 4L the target's; L and 2L what an effective length of 4L needs cleared too
LENGTHS, FAR = ("8k", "16k", "32k"), "32k"
# Self-Extend twice: with the knobs fitted to keep every position within L (side_by_side.py's, in KNOBS
# below), and with the knobs LongLM's README advises (its section 4: a neighbour window of 512-1536,
# and a group larger than the smallest that fits, since the largest positions are the least trained):
# window 1,024, G = 8 (also hf_posext's own defaults for self_extend, docs/attention.md), so the
# farthest grouped position at 32k is 1024 + 31744 / 8 = 4,992, about 0.6 L.
# The fitted knobs (G = 13 beside a 6k window) lost two needles 24k back in noise that these find
# (results/self-extend-knobs-32k). A variant is its method asked with other knobs, in a folder of its own.
VARIANTS = {"self_extend-longlm": "self_extend"}
# every method `run` measures, with its knobs: the attention-level methods' (DPE's detected scales,
# Self-Extend's window, as side_by_side.py gives them), none for YaRN and the fine-tuned arms
KNOBS = {"yarn": [], "dpe": ["--knobs", f"dpe:group_scales=@{HERE / 'results' / 'dpe' / 'dpe-32k-bf16.json'}"],
         "self_extend": ["--knobs", "self_extend:window=6144,self_extend:group_size=auto"],
         "self_extend-longlm": ["--knobs", "self_extend:window=1024,self_extend:group_size=8"],
         **{arm: [] for arm in FINETUNED}}
# the searched `longrope` configs at 4x as side_by_side.py evaluates them (King Lear, 8k proxy): each
# asked as a checkpoint with `--methods none`, the embedded model saved with the committed config
# (`searched_config`) under runs/ by `run` itself (side_by_side.rebuild: seconds; weights are not committed)
SEARCHED = ("searched-needle", "searched-perplexity")
KNOBS.update({m: [] for m in SEARCHED})
# the references past L (`run --method baseline`): the unpatched model at the full length and the
# sliding-window baseline (`hf-posext retrieval --baseline`: each prompt cut to the trained 8k window)
BASELINE = "baseline"   # the name its rows carry (hf_posext.evaluation.shared.record.BASELINE)
KNOBS[BASELINE] = []
# asked on the fixed grid of 2 needles a depth at every length (10 prompts reach all five depths): the
# fine-tuned arms, the searched configs and the references; the others in sequential looks
FIXED_GRID = (*FINETUNED, *SEARCHED, BASELINE)
# trials a depth per sequential look: 4, but 2 for Self-Extend, whose 32k prompt costs about twice
# YaRN's here (its two attentions a layer): a first look of 4 at depth 0 had not finished in 70 min
# on the shared cores, and looks of 2 reach all five depths in 10 prompts
LOOK = {"self_extend": 2, "self_extend-longlm": 2}
PERPLEXITY_TEXT = "embedded:shakespeare/hamlet"   # held out from the recipe's training


LABELS = {"noise": "RULER's noise", "hamlet": "Hamlet (held out)", "code": CODE_LABEL}


def searched_config(method: str) -> Path:
    """The committed folder of a searched config at 4x, as side_by_side.py reads it: the needle
    objective's search, and the perplexity objective's reused one (benchmarks/search.py tune4)."""
    import side_by_side as sbs
    res = sbs.Results(HERE / "results")
    return res.reused4 if method == "searched-perplexity" else res.search_dir("needle", sbs.TARGET4)


def searched(method: str) -> str:
    """The checkpoint `run` asks: the embedded model saved with the searched config (`searched_config`)."""
    return f"runs/{method}-32k"


def searched_of(folder: Path) -> str | None:
    """The searched config a run folder holds (`noise-searched-needle`), None for any other's."""
    return next((m for m in SEARCHED if f"-{m}" in folder.name), None)


def variant_of(folder: Path) -> str | None:
    """The method variant a run folder holds (`noise-self_extend-longlm`), None for any other's."""
    return next((v for v in VARIANTS if folder.name.endswith(f"-{v}") or f"-{v}-" in folder.name), None)


def row_of_folder(folder: Path) -> str | None:
    """The table row a training-free run folder's rows belong to when their `method` does not name
    it: a searched config (rows say `none`) or a knob variant (rows say its method); else None."""
    return searched_of(folder) or variant_of(folder)


def asks_checkpoint(folder: Path) -> bool:
    """Whether a run folder asks a saved checkpoint with `--methods none` (a fine-tuned arm or a
    searched config), so its rows of method none are that checkpoint's, not the unpatched model's."""
    return bool(arm_of(folder) or searched_of(folder))


def code_path() -> str:
    import torch
    path = Path(torch.__file__).parent / "_refs" / "__init__.py"   # inside the repository: relative, so
    return str(path.relative_to(HERE.parent)) if path.is_relative_to(HERE.parent) else str(path)   # rows name no machine folder


def dataset(haystack: str) -> str:
    return {"noise": "noise", "hamlet": "embedded:shakespeare/hamlet", "code": code_path()}[haystack]


def run_folder(haystack: str, method: str, task: str = "niah_single", seed: int = 0, length: str = FAR) -> Path:
    """YaRN's niah_single rows at 32k in the haystack's folder (its first runs), every other run beside
    it, named by method, seed (fine-tuned, past 0), task (past niah_single) and length (past 32k)."""
    name = haystack if method == "yarn" else f"{haystack}-{method}"
    name += (f"-seed{seed}" if seed else "") + ("" if task == "niah_single" else f"-{task}")
    return OUT / (name + ("" if length == FAR else f"-{length}"))


def sequential(method: str, length: str) -> bool:
    """Whether `run` asks the method at that length in sequential looks with a budget; otherwise a
    fixed grid of 2 needles a depth (FIXED_GRID's methods, and every method within L)."""
    return method not in FIXED_GRID and length != LENGTHS[0]


def run_argv(haystack: str, method: str = "yarn", budget: str | None = None, task: str = "niah_single",
             seed: int = 0, length: str = FAR) -> list[str]:
    out = ["--dtype", "float32", "--dataset", dataset(haystack), "--no-progress",
           "--out", str(run_folder(haystack, method, task, seed, length))]
    if method in FINETUNED or method in SEARCHED:
        # a fixed grid (FIXED_GRID), the design of the 2x recipe's noise check, so the two read side
        # by side; 10/10 would clear the target (Wilson lower bound 0.72)
        model = finetuned(seed, method) if method in FINETUNED else searched(method)
        return ["retrieval", "--tasks", task, "--model", model, "--methods", "none", "--lengths", length,
                "--depths", DEPTHS, "--trials", "2", *out]
    if method == BASELINE:   # the unpatched model at the length and cut to its window, side by side
        return ["retrieval", "--tasks", task, "--methods", "none", "--baseline", "--lengths", length,
                "--depths", DEPTHS, "--trials", "2", *out]
    if not sequential(method, length):
        # within L `hf-posext retrieval` always asks the unpatched model too, first: a sequential
        # budget would be spent on it, so the same fixed grid as the fine-tuned arms (its unpatched
        # rows repeat the reference's first needles and are not counted: question_rows)
        return ["retrieval", "--tasks", task, "--methods", VARIANTS.get(method, method), *KNOBS[method], "--lengths", length,
                "--factor", "4", "--depths", DEPTHS, "--trials", "2", *out]
    return ["retrieval", "--tasks", task, "--methods", VARIANTS.get(method, method), *KNOBS[method], "--lengths", length,
            "--factor", "4", "--depths", DEPTHS, "--trials", "20", "--look", str(LOOK.get(method, 4)), "--sequential", "--bar", str(BAR),
            "--budget", budget or (BUDGET_16K if length == "16k" else BUDGET[haystack]), *out]


def reference_folder(haystack: str, task: str = "niah_single") -> Path:
    return OUT / (f"{haystack}-reference" + ("" if task == "niah_single" else f"-{task}"))


def reference_argv(haystack: str, task: str = "niah_single") -> list[str]:
    """The unpatched model within L (8k) in the haystack: what a method's 32k accuracy is read against
    (a needle the base loses 8k back is not one an extension lost). Code: sequential, with YaRN s = 4
    at 8k and 32k after it (its first run, kept as it ran); the others: a fixed grid of 8 needles a
    depth, the first 4 the ones every 32k cell of the haystack asks (the trial seeds fix them);
    multi_key likewise in every haystack."""
    out = ["--no-progress", "--out", str(reference_folder(haystack, task))]
    if haystack == "code" and task == "niah_single":
        return ["retrieval", "--tasks", "niah_single", "--methods", "yarn", "--lengths", "8k,32k", "--factor", "4",
                "--depths", DEPTHS, "--trials", "20", "--look", "4", "--dtype", "float32", "--sequential",
                "--dataset", dataset(haystack), "--budget", "45m", *out]
    return ["retrieval", "--tasks", task, "--methods", "none", "--lengths", "8k", "--depths", DEPTHS,
            "--trials", "8", "--dtype", "float32", "--dataset", dataset(haystack), *out]


def folder_seed(folder: Path) -> int:
    """The training seed a run folder's name carries (`...-seed1...`; 0 when it names none)."""
    return int(folder.name.partition("-seed")[2].partition("-")[0] or 0)


def perplexity_folder(seed: int = 0, arm: str = "finetuned") -> Path:
    return OUT / (f"perplexity-{arm}" + (f"-seed{seed}" if seed else ""))


def perplexity_argv(seed: int = 0, arm: str = "finetuned") -> list[str]:
    """The checkpoint at 32k on held-out Hamlet: `hf-posext eval` scores the whole 32k prompt and the
    same model's own sliding 8k window over the same tokens, per position bucket (so past L reads
    as the excess over the sliding window on positions 8k-32k). A variant (VARIANTS) is the embedded
    model patched with its knobs, read against the unpatched model's sliding 8k window, as the
    side-by-side reads the training-free methods."""
    model = ["--methods", VARIANTS[arm], *KNOBS[arm]] if arm in VARIANTS else \
        ["--model", finetuned(seed, arm), "--methods", "none"]
    return ["eval", *model, "--dtype", "float32", "--lengths", "32768",
            "--dataset", PERPLEXITY_TEXT, "--no-progress", "--out", str(perplexity_folder(seed, arm))]


def cli(argv: list[str], folder: Path) -> None:
    argv = argv + (["--resume"] if (folder / f"{'perplexity' if argv[0] == 'eval' else 'retrieval'}.json").exists() else [])
    print("+ hf-posext " + " ".join(argv), flush=True)
    # from the repository: the fine-tuned checkpoint's path is relative to it, as the recipe writes it
    subprocess.run([sys.executable, "-m", "hf_posext.cli", *argv], check=True, cwd=HERE.parent)


def shown(argv: list[str]) -> str:
    """A command as the page shows it: paths relative to the repository, code's file by name."""
    text = "hf-posext " + " ".join(argv)
    return text.replace(code_path(), "$TORCH/_refs/__init__.py").replace(str(HERE.parent) + "/", "")


def seeds_trained(arm: str = "finetuned", out: Path = OUT) -> list[int]:
    """The arm's fine-tuned seeds with stored rows (any haystack, task or perplexity), in order;
    seed 0 of the shipped recipe always (its absence is news), of another arm when it ran."""
    found = {folder_seed(f) for f in out.glob(f"*-{arm}*") if arm_of(f) == arm}
    return sorted(found | ({0} if arm == "finetuned" else set()))


def steps(haystack: str, out: Path = OUT):
    """(what a missing run is called or None if its absence is not news, folder, argv) of every run,
    the fine-tuned arms' seeds as found under `out`."""
    for method in KNOBS:
        for task in TARGETS:
            for seed in (seeds_trained(method, out) if method in FINETUNED else [0]):
                for length in (FAR, *LENGTHS[:-1]):
                    # missing and worth saying: niah_single of every training-free method, both tasks of
                    # the shipped recipe at 32k, and its first seed's niah_single at 8k and 16k (its
                    # effective length); the other arms are experiments, their untried cells not news
                    news = (method == "finetuned" or (task == "niah_single" and method not in FINETUNED)) \
                        if length == FAR else (method == "finetuned" and seed == 0 and task == "niah_single")
                    name = (f"{method}" + (f" seed {seed}" if seed else "") + ("" if task == "niah_single" else f" {task}")
                            + ("" if length == FAR else f" at {length}"))
                    yield (name if news else None), run_folder(haystack, method, task, seed, length), \
                        run_argv(haystack, method, None, task, seed, length)
    for task in TARGETS:
        yield None, reference_folder(haystack, task), reference_argv(haystack, task)

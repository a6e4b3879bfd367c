"""lm-evaluation-harness's RULER runs beside the retrieval suite (docs/retrieval.md): the records
lm-eval writes (`--output_path` with `--log_samples`) kept compactly (each sample's length,
needle depth, expected and generated answer, score; the run's model_args, version and time; not
the prompts, up to 16k tokens each), and the markdown tables that put them beside the suite's
rows (benchmarks/retrieval_report.py writes its page from these)."""

from __future__ import annotations

import json
from pathlib import Path

from ..shared.results import format_length
from .stats import pooled, rate_text

LM_EVAL = "lm_eval_niah_single_1.json"
RULER = "lm_eval_ruler.json"
# RULER's tasks whose text lm-eval makes offline (docs/retrieval.md lists those that need the network)
RULER_TASKS = ("niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
# what each asks, and the built-in task closest to it (None: the suite has none)
RULER_ABOUT = {"niah_multikey_2": ("one key's number; the haystack is other keys' needles", "multi_key"),
               "niah_multikey_3": ("one UUID's UUID; the haystack is other UUID pairs", None),
               "ruler_vt": ("every variable a value reaches through 4 hops", "variable_tracking"),
               "ruler_cwe": ("the 10 most common words of a long word list", None),
               "ruler_fwe": ("the 3 most frequent coded words of a noise text", None)}


def _only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.rglob(pattern))
    if len(found) != 1:
        raise ValueError(f"{folder}: expected one lm-eval {pattern} file (--output_path with --log_samples), "
                         f"found {len(found)}")
    return found[0]


def _sample(line: str, task: str) -> dict:
    """One lm-eval sample without its prompt; RULER scores it under its length's key."""
    s = json.loads(line)
    doc, n = s["doc"], str(s["doc"]["max_length"])
    kept = {"max_length": int(n), "tokens": doc["length"]}
    if task == "niah_single_1":
        # the needle's depth: where its sentence starts, as a share of the haystack's characters
        kept["depth"] = round(doc["input"].find("One of the special magic numbers") / len(doc["input"]), 3)
    return {**kept, "target": doc["outputs"], "response": " ".join(s["resps"][0][0].split())[:60],
            "score": s[n]}


def _run(meta: dict) -> dict:
    return {"model_args": meta["config"]["model_args"], "lm_eval_version": meta["lm_eval_version"],
            "limit": meta["config"].get("limit"),
            "seconds": round(float(meta["total_evaluation_time_seconds"]), 1)}


def _task(folder: Path, meta: dict, task: str) -> dict:
    lines = _only(folder, f"samples_{task}_*.jsonl").read_text().splitlines()
    return {"gen_kwargs": meta["configs"][task]["generation_kwargs"],
            "results": {k: v for k, v in meta["results"][task].items() if k.endswith(",none")},
            "samples": [_sample(line, task) for line in lines]}


def import_lm_eval(folders: list[Path], out: Path, command: str) -> Path:
    """One compact record of lm-eval niah_single_1 runs (one per length), in `out`/LM_EVAL:
    samples without their prompts, under the `command` that ran them."""
    runs = []
    for folder in folders:
        meta = json.loads(_only(folder, "results_*.json").read_text())
        runs.append({**_run(meta), **_task(folder, meta, "niah_single_1")})
    path = out / LM_EVAL
    path.write_text(json.dumps({"command": command, "runs": runs}, indent=1) + "\n")
    return path


def import_lm_eval_ruler(folders: list[Path], out: Path, command: str) -> Path:
    """The same for runs of `RULER_TASKS` (one per length), every task of each run, in `out`/RULER."""
    runs = []
    for folder in folders:
        meta = json.loads(_only(folder, "results_*.json").read_text())
        missing = [t for t in RULER_TASKS if t not in meta["results"]]
        if missing:
            raise ValueError(f"{folder}: lm-eval ran no {', '.join(missing)}; run every one of "
                             f"{', '.join(RULER_TASKS)} (--tasks)")
        runs.append({**_run(meta), "tasks": {t: _task(folder, meta, t) for t in RULER_TASKS}})
    path = out / RULER
    path.write_text(json.dumps({"command": command, "runs": runs}, indent=1) + "\n")
    return path


def cost_lines(rows: list[dict]) -> list[str]:
    """Per method and length: the cells' time, and one prefill per trial estimated from the
    depth-0 cell (nothing precedes its needle, so each of its trials is a full prefill)."""
    lines = ["| method | length | trials | measured (prefix reused) | one prefill per trial (depth-0 cell's per-trial time × trials) | ratio |",
             "|---|---|---|---|---|---|"]
    total = full_total = 0.0
    for key in dict.fromkeys((r["method"], int(r["length"])) for r in rows):
        part = [r for r in rows if (r["method"], int(r["length"])) == key]
        zero = [r for r in part if float(r["depth"]) == 0.0]
        trials = sum(int(r["trials"]) for r in part)
        spent = sum(float(r["seconds"]) for r in part)
        full = float(zero[0]["seconds"]) / int(zero[0]["trials"]) * trials if zero else float("nan")
        total, full_total = total + spent, full_total + full
        lines.append(f"| {key[0]} | {format_length(key[1])} | {trials} | {spent / 60:.1f} min | "
                     f"{full / 60:.1f} min | {spent / full:.2f} |")
    lines.append(f"| all | | {sum(int(r['trials']) for r in rows)} | **{total / 60:.1f} min** | "
                 f"{full_total / 60:.1f} min | {total / full_total:.2f} |")
    return lines


def side_by_side(rows: list[dict], lm: dict) -> list[str]:
    """yarn's accuracy per length: each built-in task (pooled over its depths) and lm-eval's
    niah_single_1."""
    yarn = [r for r in rows if r["method"] == "yarn"]
    tasks = list(dict.fromkeys(r["task"] for r in yarn))
    depths = {t: ", ".join(f"{d:g}" for d in sorted({float(r["depth"]) for r in yarn if r["task"] == t}))
              for t in tasks}
    lines = ["| yarn s=2, embedded SmolLM2-135M | "
             + " | ".join(f"hf-posext retrieval `{t}` (depths {depths[t]})" for t in tasks)
             + " | lm-eval `niah_single_1` (RULER) | lm-eval run time |", "|---" * (len(tasks) + 3) + "|"]
    for run in lm["runs"]:
        n = run["samples"][0]["max_length"]
        ours = []
        for t in tasks:
            k, total = pooled([r for r in yarn if r["task"] == t and int(r["length"]) == n])
            ours.append(rate_text(k, total) if total else "not run")
        k_lm = sum(s["score"] == 1.0 for s in run["samples"])
        lines.append(f"| {format_length(n)} | " + " | ".join(ours) +
                     f" | {rate_text(k_lm, len(run['samples']))} | {run['seconds'] / 60:.1f} min |")
    return lines


def _score_text(total: float, whole: int, n: int) -> str:
    """RULER's score (the share of the expected answers found, averaged) and how many whole."""
    return f"{total / n:.2f} ({whole}/{n} whole)"


def ruler_lines(rows: list[dict], ruler: dict) -> list[str]:
    """Per RULER task: lm-eval's score at each length, and yarn's on the built-in counterpart."""
    lengths = [run["tasks"][RULER_TASKS[0]]["samples"][0]["max_length"] for run in ruler["runs"]]
    lines = ["| lm-eval task (RULER) | asks for | " + " | ".join(f"lm-eval {format_length(n)}" for n in lengths)
             + " | hf-posext retrieval | " + " | ".join(f"retrieval {format_length(n)}" for n in lengths) + " |",
             "|---" * (3 + 2 * len(lengths)) + "|"]
    for task in RULER_TASKS:
        asks, ours = RULER_ABOUT[task]
        theirs = []
        for run in ruler["runs"]:
            scores = [x["score"] for x in run["tasks"][task]["samples"]]
            theirs.append(_score_text(sum(scores), sum(x == 1.0 for x in scores), len(scores)))
        mine = []
        for n in lengths:
            cells = [r for r in rows if r["method"] == "yarn" and r["task"] == ours and int(r["length"]) == n]
            trials = sum(int(r["trials"]) for r in cells)
            mine.append("—" if ours is None else _score_text(
                sum(float(r["score"]) * int(r["trials"]) for r in cells),
                sum(int(r["correct"]) for r in cells), trials) if trials else "not run")
        lines.append(f"| `{task}` | {asks} | " + " | ".join(theirs) + f" | {f'`{ours}`' if ours else 'none'} | "
                     + " | ".join(mine) + " |")
    return lines

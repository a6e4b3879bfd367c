"""The README's retrieval figures, from committed results only: the 2x grid of `hf-posext
retrieval` (its summary, cost, plots) and lm-evaluation-harness's RULER `niah_single_1` for the
same model, method and lengths, side by side (issue 29).

    python benchmarks/retrieval_report.py --import-lm-eval /tmp/lm-eval-8192 /tmp/lm-eval-16384
    python benchmarks/retrieval_report.py          # report.md from the committed rows

    python benchmarks/retrieval_report.py --import-lm-eval-ruler /tmp/lm-eval-ruler-8192 /tmp/lm-eval-ruler-16384

`--import-lm-eval` reads the folders lm-eval wrote (`--output_path`, with `--log_samples`) and
keeps what a reader needs (each sample's length, needle depth, expected and generated answer,
score; the run's model_args, version and time) in `lm_eval_niah_single_1.json`: the samples'
prompts (up to 16k tokens each) are not committed. `--import-lm-eval-ruler` does the same for
the other RULER tasks that need no network (`lm_eval_ruler.json`). The grid's rows and plots
come from the commands in report.md (`--out` this folder).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "retrieval-2x"
LM_EVAL = "lm_eval_niah_single_1.json"
RULER = "lm_eval_ruler.json"
GRID_TASKS = ("single_needle", "niah_single")   # the grid's tasks: the summary, plots and niah table
GRID_COMMAND = ("hf-posext retrieval --methods yarn,dual_chunk --lengths 8k,16k --factor 2 --trials 4 "
                "--depths 0,0.25,0.5,0.75,1 --dtype auto --out benchmarks/results/retrieval-2x")
NIAH_COMMAND = ("hf-posext retrieval --tasks niah_single --methods yarn --lengths 8k,16k --factor 2 --trials 4 "
                "--depths 0.5,1 --dtype auto --out benchmarks/results/retrieval-2x --resume")
# a second block of trials for the same cells: 16 more, seeds 4..19 (20 a cell in the tables)
NIAH_MORE_COMMAND = NIAH_COMMAND.replace("--trials 4", "--seed 4 --trials 16")
LM_EVAL_COMMAND = ("hf-posext lm-eval --model hf-posext --model_args pretrained=embedded:smollm2-135m,"
                   "tokenizer=smollm2-tok,method=yarn,factor=2,max_length=16384,dtype=float32 "
                   "--tasks niah_single_1 --metadata '{\"max_seq_lengths\":[16384]}' --limit 6 "
                   "--device cpu --output_path lm-eval-16384 --log_samples")
OTHERS_COMMAND = ("hf-posext retrieval --tasks multi_key,variable_tracking --methods yarn --lengths 8k,16k "
                  "--factor 2 --trials 4 --depths 0.5 --dtype auto --out benchmarks/results/retrieval-2x --resume")
# RULER's tasks whose text lm-eval makes offline (docs/retrieval.md lists those that need the network)
RULER_TASKS = ("niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
RULER_COMMAND = LM_EVAL_COMMAND.replace("--tasks niah_single_1", "--tasks " + ",".join(RULER_TASKS)).replace(
    "lm-eval-16384", "lm-eval-ruler-16384")
# what each asks, and the built-in task closest to it (None: the suite has none)
RULER_ABOUT = {"niah_multikey_2": ("one key's number; the haystack is other keys' needles", "multi_key"),
               "niah_multikey_3": ("one UUID's UUID; the haystack is other UUID pairs", None),
               "ruler_vt": ("every variable a value reaches through 4 hops", "variable_tracking"),
               "ruler_cwe": ("the 10 most common words of a long word list", None),
               "ruler_fwe": ("the 3 most frequent coded words of a noise text", None)}


def _only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.rglob(pattern))
    if len(found) != 1:
        raise SystemExit(f"{folder}: expected one lm-eval {pattern} file (--output_path with --log_samples), "
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


def import_lm_eval(folders: list[Path], out: Path) -> Path:
    """One compact record of lm-eval niah_single_1 runs (one per length): samples without their prompts."""
    runs = []
    for folder in folders:
        meta = json.loads(_only(folder, "results_*.json").read_text())
        runs.append({**_run(meta), **_task(folder, meta, "niah_single_1")})
    path = out / LM_EVAL
    path.write_text(json.dumps({"command": LM_EVAL_COMMAND, "runs": runs}, indent=1) + "\n")
    return path


def import_lm_eval_ruler(folders: list[Path], out: Path) -> Path:
    """The same for runs of `RULER_TASKS` (one per length), every task of each run."""
    runs = []
    for folder in folders:
        meta = json.loads(_only(folder, "results_*.json").read_text())
        missing = [t for t in RULER_TASKS if t not in meta["results"]]
        if missing:
            raise SystemExit(f"{folder}: lm-eval ran no {', '.join(missing)}; run RULER_COMMAND")
        runs.append({**_run(meta), "tasks": {t: _task(folder, meta, t) for t in RULER_TASKS}})
    path = out / RULER
    path.write_text(json.dumps({"command": RULER_COMMAND, "runs": runs}, indent=1) + "\n")
    return path


def cost_lines(rows: list[dict]) -> list[str]:
    """Per method and length: the cells' time, and one prefill per trial estimated from the
    depth-0 cell (nothing precedes its needle, so each of its trials is a full prefill)."""
    from hf_posext.evaluation.results import format_length
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
    from hf_posext.evaluation.results import format_length
    from hf_posext.evaluation.retrieval.stats import pooled, rate_text

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
    from hf_posext.evaluation.results import format_length
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


def _has_block(rows: list[dict], task: str) -> bool:
    return any(int(r.get("blocks", 1)) > 1 for r in rows if r["task"] == task)


def _past_length(rows: list[dict]) -> str:
    """How far a cell's longest prompt plus its answer budget ran past its length."""
    over, task, n = max((int(r["prompt_tokens"]) + int(r["max_new_tokens"]) - int(r["length"]), r["task"],
                         int(r["length"])) for r in rows)
    return f"{over} tokens, {task} at {n:,}"


def report(out: Path) -> Path:
    from hf_posext.evaluation.retrieval.blocks import merge_blocks, trials_text
    from hf_posext.evaluation.retrieval.plots import format_summary, plot_all, summary
    data = json.loads((out / "retrieval.json").read_text())
    every, margin = merge_blocks(data["rows"]), 0.10   # a cell's blocks of trials as one row
    rows = [r for r in every if r["task"] in GRID_TASKS]   # the counterparts of RULER's others: below
    # the plots `hf-posext retrieval` draws, drawn again from every row of the folder (both runs)
    plot_all(every, out, f"{rows[0]['model']} ({rows[0]['dtype']}), {rows[0]['dataset']} haystack, "
                        f"{trials_text(every)}")
    lines = ["# Retrieval at 2x: the built-in suite and lm-evaluation-harness (issue 29)", "",
             "Made by `python benchmarks/retrieval_report.py` from the rows of", "", "```bash",
             GRID_COMMAND, NIAH_COMMAND, *([NIAH_MORE_COMMAND] if _has_block(rows, "niah_single") else []),
             "```", "",
             f"(single_needle, then niah_single, on RULER's noise haystack, {rows[0]['dtype']}, trained length "
             f"{rows[0]['trained_length']:,}) and lm-eval's records in `{LM_EVAL}`.", "",
             "These rows were made with the retrieval suite's first prompt layout, which let the answer's "
             f"generated tokens run past the cell's length (here by at most {_past_length(every)}). The layout "
             "now reserves them within the length, as RULER does, and the layout is part of each cell's data "
             "hash, so the commands above, run again, compute every cell anew.", "",
             "## Accuracy by method and length", "", "<!-- retrieval-summary -->", "```",
             format_summary(summary(rows, margin), margin), "```", "",
             *[f"![{t}: heat maps](retrieval_{t}_heatmaps.png)\n\n![{t}: accuracy by length](retrieval_{t}.png)\n"
               for t in dict.fromkeys(r["task"] for r in rows)],
             "## Cost", "",
             "The single_needle grid (the target's). Wall time of each cell as the run recorded it "
             "(`seconds`), on the 2 cores of the machine "
             "that ran it; other work ran beside some cells, so read the ratios, not the minutes.", "",
             *cost_lines([r for r in rows if r["task"] == "single_needle"]), ""]
    if (out / LM_EVAL).exists():
        lm = json.loads((out / LM_EVAL).read_text())
        lines += ["## Beside lm-evaluation-harness", "", "```bash", lm["command"], "```", "",
                  "(once per length; `smollm2-tok` = the embedded tokenizer saved with "
                  "`save_pretrained`, RULER's loader ignores `gguf_file`).", "",
                  *side_by_side(rows, lm), "",
                  "| lm-eval length | tokens | needle depth | expected | generated | score |", "|---|---|---|---|---|---|"]
        lines += [f"| {s['max_length']} | {s['tokens']} | {s['depth']:.2f} | {'/'.join(s['target'])} | "
                  f"{s['response'].replace('|', '/')} | {s['score']:g} |" for run in lm["runs"] for s in run["samples"]]
    if (out / RULER).exists():
        ruler = json.loads((out / RULER).read_text())
        lines += ["", "## lm-eval's other RULER tasks that need no network", "", "```bash", ruler["command"],
                  OTHERS_COMMAND, "```", "",
                  "(lm-eval once per length, as above; the built-in counterparts with yarn at depth 0.5, "
                  "on RULER's noise haystack.) Score: RULER's, the share of the expected answers a "
                  "sample's output holds, averaged; whole: the samples holding every answer.", "",
                  *ruler_lines(every, ruler), ""]
        others = [r for r in every if r["task"] not in GRID_TASKS]
        if others:
            lines += ["The built-in counterparts, the unpatched model beside yarn:", "", "```",
                      format_summary(summary(others, margin), margin), "```", ""]
        lines += ["| lm-eval task | length | expected | generated | score |", "|---|---|---|---|---|"]
        lines += [f"| {t} | {x['max_length']} | {'/'.join(x['target'])[:40]} | {x['response'].replace('|', '/')} | "
                  f"{x['score']:.2f} |" for run in ruler["runs"] for t in RULER_TASKS
                  for x in run["tasks"][t]["samples"]]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help="the grid's results folder")
    p.add_argument("--import-lm-eval", nargs="+", type=Path, default=None, metavar="FOLDER",
                   help="lm-eval --output_path folders to keep (compactly) before the report")
    p.add_argument("--import-lm-eval-ruler", nargs="+", type=Path, default=None, metavar="FOLDER",
                   help=f"the same for runs of {', '.join(RULER_TASKS)}")
    args = p.parse_args(argv)
    if not (args.out / "retrieval.json").exists():
        p.error(f"{args.out}: no retrieval.json; run the grid's command first")
    if args.import_lm_eval:
        print(f"kept: {import_lm_eval(args.import_lm_eval, args.out)}")
    if args.import_lm_eval_ruler:
        print(f"kept: {import_lm_eval_ruler(args.import_lm_eval_ruler, args.out)}")
    print(f"report: {report(args.out)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())

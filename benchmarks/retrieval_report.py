"""The README's retrieval figures, from committed results only: the 2x grid of `hf-posext
retrieval` (its summary, cost, plots) and lm-evaluation-harness's RULER `niah_single_1` for the
same model, method and lengths, side by side.

    python benchmarks/retrieval_report.py --import-lm-eval /tmp/lm-eval-8192 /tmp/lm-eval-16384
    python benchmarks/retrieval_report.py          # report.md from the committed rows

    python benchmarks/retrieval_report.py --import-lm-eval-ruler /tmp/lm-eval-ruler-8192 /tmp/lm-eval-ruler-16384

`--import-lm-eval` reads the folders lm-eval wrote (`--output_path`, with `--log_samples`) and
keeps what a reader needs in `lm_eval_niah_single_1.json`, without the samples' prompts;
`--import-lm-eval-ruler` does the same for the other RULER tasks that need no network
(`lm_eval_ruler.json`): hf_posext.evaluation.retrieval.report, which also makes the tables. The
grid's rows and plots come from the commands in report.md (`--out` this folder).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_posext.evaluation.retrieval.report import (LM_EVAL, RULER, RULER_TASKS, cost_lines, import_lm_eval,
                                                   import_lm_eval_ruler, ruler_lines, side_by_side)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "retrieval-2x"
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
RULER_COMMAND = LM_EVAL_COMMAND.replace("--tasks niah_single_1", "--tasks " + ",".join(RULER_TASKS)).replace(
    "lm-eval-16384", "lm-eval-ruler-16384")


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
    from hf_posext.evaluation.shared.record import read_rows
    every, margin = merge_blocks(read_rows(out / "retrieval.json")), 0.10   # a cell's blocks of trials as one row
    rows = [r for r in every if r["task"] in GRID_TASKS]   # the counterparts of RULER's others: below
    # the plots `hf-posext retrieval` draws, drawn again from every row of the folder (both runs)
    plot_all(every, out, f"{rows[0]['model']} ({rows[0]['dtype']}), {rows[0]['dataset']} haystack, "
                        f"{trials_text(every)}")
    lines = ["# Retrieval at 2x: the built-in suite and lm-evaluation-harness", "",
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
    try:
        if args.import_lm_eval:
            print(f"kept: {import_lm_eval(args.import_lm_eval, args.out, LM_EVAL_COMMAND)}")
        if args.import_lm_eval_ruler:
            print(f"kept: {import_lm_eval_ruler(args.import_lm_eval_ruler, args.out, RULER_COMMAND)}")
    except ValueError as error:
        p.error(str(error))
    print(f"report: {report(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

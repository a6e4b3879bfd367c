"""The demo's perplexity figure with the unpatched baseline, drawn by the recipe's own plotting
(hf_posext.training.recipe_eval.draw_results) from the committed demo results
(benchmarks/results/recipes/cpu-smollm2-demo/results.json: training-free and fine-tuned YaRN s=2, measured by
the recipe run described in recipes/README.md) plus the unpatched base model measured here on the
same held-out Hamlet with the same protocol (first L tokens, no special tokens, truncate):

    flock /tmp/hf_posext_heavy.lock .venv/bin/python recipes/demo_figure.py   # ~3 min on 2 quiet cores
Writes baseline.{csv,json}, perplexity.png and table.txt into benchmarks/results/recipes/cpu-smollm2-demo/.
`--redraw` draws the figure again from the stored baseline.json without measuring.
"""

import argparse
import json
from pathlib import Path

from hf_posext.evaluation.shared.record import read_rows

OUT = (Path(__file__).resolve().parents[1] / "benchmarks" / "results"
       / "recipes" / "cpu-smollm2-demo")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redraw", action="store_true",
                   help="draw the figure from the stored baseline.json, measuring nothing")
    return p.parse_args(argv)


def main(redraw: bool = False) -> None:
    import torch

    from hf_posext.data import embedded
    from hf_posext.evaluation import PerplexityGrid, ResultsStore, RunInfo, evaluate_perplexity
    from hf_posext.training.recipe_eval import SERIES, draw_results

    cfg = json.loads((OUT / "config.json").read_text())
    rows = read_rows(OUT / "results.json")
    steps = cfg["training"]["max_steps"]
    method, s = cfg["model"]["method"], float(cfg["model"]["factor"])
    if redraw:
        baseline = read_rows(OUT / "baseline.json")
    else:
        tok = embedded.load_tokenizer()
        hamlet = next(p for p in embedded.play_paths() if p.stem == "hamlet")
        ids = tok(hamlet.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
        base = embedded.load_model(dtype=torch.float32, attn_implementation="sdpa").eval()
        with ResultsStore(OUT, "baseline", resume=True) as store:
            grid = PerplexityGrid(methods=["none"], lengths=sorted(cfg["eval"]["lengths"]),
                                  chunk_size=cfg["eval"]["chunk_size"], baseline=False)
            baseline = evaluate_perplexity(base, [ids], grid, store=store,
                                           run=RunInfo(model_name=cfg["model"]["name"], dataset="hamlet"))
    labelled = [(SERIES["base"], r) for r in baseline]
    labelled += [(SERIES["free"].format(m=method, s=s) if "training-free" in r["method"]
                  else SERIES["tuned"].format(m=method, s=s, steps=steps), r) for r in rows]
    plot, table = draw_results(labelled, OUT, cfg["model"]["name"], method, s, ["hamlet"])
    print(table)
    print(plot)


if __name__ == "__main__":
    main(redraw=parse().redraw)

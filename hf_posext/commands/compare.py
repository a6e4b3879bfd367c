"""`hf-posext compare DIR DIR ...`: several runs' summaries side by side, one table per kind
(perplexity, retrieval) and one plot, from each folder's summary.json (written by `eval`,
`retrieval` and `extend --eval`).

    hf-posext compare runs/yarn-2x runs/dpe-2x
    hf-posext compare runs/yarn-2x runs/dpe-2x --out yarn-vs-dpe.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..evaluation.shared.inputs import InputError
from ..evaluation.shared.results import format_length
from ..evaluation.shared.summary import read_summary


def add_subcommand(sub) -> None:
    p = sub.add_parser("compare", help="several runs' summaries side by side: a table and one plot",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", help="run folders holding a summary.json")
    p.add_argument("--out", default="hf_posext_results/compare.png",
                   help="the plot to write (default hf_posext_results/compare.png)")
    p.add_argument("--no-plot", action="store_true", help="the table only")
    p.set_defaults(run=run_compare)


def _cell(kind: str, v: dict | None) -> str:
    if v is None:
        return "—"
    if kind == "retrieval":
        return f"{v['value']:.2f} [{v['low']:.2f}, {v['high']:.2f}]"
    ratio = v.get("ratio_to_sliding")
    return f"{v['value']:.2f}" + (f" ({ratio:.3f}x)" if ratio is not None else "")


def _lines(runs: list[tuple[str, dict]]) -> dict[str, list[tuple[str, dict]]]:
    """kind -> [(run name, series)]."""
    out: dict[str, list[tuple[str, dict]]] = {}
    for name, data in runs:
        for section in data["sections"]:
            out.setdefault(section["kind"], []).extend((name, s) for s in section["series"])
    return out


def table(runs: list[tuple[str, dict]]) -> str:
    """One plain-text table per kind: a line per (run, series), a column per length."""
    text = []
    for kind, lines in _lines(runs).items():
        lengths = sorted({int(n) for _, s in lines for n in s["values"]})
        head = ["run", "series"] + [format_length(n) for n in lengths] + \
            (["effective length"] if kind == "retrieval" else [])
        body = [[name, (f"{s['task']} " if s.get("task") else "") + s["label"]]
                + [_cell(kind, s["values"].get(str(n))) for n in lengths]
                + ([format_length(s["effective_length"]) if s["effective_length"] else "—"]
                   if kind == "retrieval" else []) for name, s in lines]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        text.append(kind + (" (perplexity; ratio to the sliding-window baseline)" if kind == "perplexity"
                            else " (accuracy [Wilson 95 % interval])"))
        text += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [head, *body]]
        text.append("")
    return "\n".join(text).rstrip()


def plot(runs: list[tuple[str, dict]], path: Path) -> Path:
    """One figure, a panel per kind: each (run, series) as a line over the lengths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kinds = _lines(runs)
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.4 * len(kinds), 4.4), squeeze=False)
    for ax, (kind, lines) in zip(axes[0], kinds.items()):
        for name, s in lines:
            xs = sorted(int(n) for n in s["values"])
            ax.plot(xs, [s["values"][str(n)]["value"] for n in xs], marker="o",
                    label=f"{name}: {(s['task'] + ' ') if s.get('task') else ''}{s['label']}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({int(n) for _, s in lines for n in s["values"]}))
        ax.set_xticklabels([format_length(int(t)) for t in ax.get_xticks()])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("perplexity" if kind == "perplexity" else "accuracy")
        if kind == "retrieval":
            ax.set_ylim(-0.05, 1.05)
        ax.set_title(kind)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_compare(args: argparse.Namespace) -> int:
    runs = []
    names = [Path(f).name or str(f) for f in args.folders]
    for folder, name in zip(args.folders, names):
        name = str(folder) if names.count(name) > 1 else name   # two `eval/` folders: their paths
        try:
            runs.append((name, read_summary(folder)))
        except ValueError as err:
            raise InputError(str(err)) from None
    out = Path(args.out)
    if not args.no_plot and out.suffix.lower() != ".png":
        raise InputError(f"--out {out}: the plot is a PNG; pass a name ending in .png.")
    print(table(runs))
    if not args.no_plot:
        print(f"plot: {plot(runs, out)}")
    return 0

"""Retrieval plots and the summary: the depth × length heat map per method (the passkey heat
map of results.py) and accuracy against length with Wilson 95 % bars, pooled over depths, the
trained length marked; the summary table with intervals and each method's effective length."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..shared.results import (_mark_trained, _save_figure, _series_label, draw_heatmap, format_length,
                       plot_passkey_heatmap)
from ..shared.identity import digest
from .stats import effective_length, pooled, wilson


def series(rows: Sequence[dict]) -> dict[tuple, list[dict]]:
    """Rows by (task, method, factor spec, knobs), in first-seen order."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["task"], r["method"], str(r.get("factor_spec", "")), r.get("knobs", "")),
                       []).append(r)
    return out


def by_length(rows: Sequence[dict]) -> list[tuple[int, int, int]]:
    """(length, correct, trials) pooled over depths."""
    lengths = sorted({int(r["length"]) for r in rows})
    return [(n, *pooled([r for r in rows if int(r["length"]) == n])) for n in lengths]


def summary(rows: Sequence[dict], margin: float) -> list[dict]:
    """One line per series: accuracy [Wilson interval] at each length and the effective length."""
    groups, out = series(rows), []
    for (task, _method, _spec, knobs), part in groups.items():
        trained = int(part[0]["trained_length"])
        reference = [r for (t, m, *_), rs in groups.items() if t == task and m == "none" for r in rs]
        eff, ref = effective_length(part, reference, trained, margin)
        line: dict = {"task": task, "series": _series_label(part[0]) + (f" [{knobs}]" if knobs else ""),
                "effective_length": eff, "reference": ref, "trained_length": trained}
        for n, k, total in by_length(part):
            low, high = wilson(k, total)
            line[n] = f"{k / total:.2f} [{low:.2f}, {high:.2f}]"
        out.append(line)
    return out


def format_summary(lines: list[dict], margin: float) -> str:
    lengths = sorted({k for line in lines for k in line if isinstance(k, int)})
    head = ["task", "method"] + [format_length(n) for n in lengths] + ["effective length"]
    body = [[line["task"], line["series"]] + [line.get(n, "—") for n in lengths]
            + [format_length(line["effective_length"]) if line["effective_length"] else "—"]
            for line in lines]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    text = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in [head, *body]]
    refs = {line["task"]: line["reference"] for line in lines if line["reference"] is not None}
    note = "; ".join(f"{t}: {v:.2f}" for t, v in refs.items())
    text.append(f"accuracy over depths [Wilson 95 % interval]; effective length: the longest "
                f"length up to which accuracy stays >= the unpatched model's within "
                f"{format_length(lines[0]['trained_length'])} ({note or 'no length within L'}) "
                f"minus {margin:.2f}; — where it fails at the shortest length, or where that reference is "
                f"at most {margin:.2f} (the model cannot do the task within L, so the bar says nothing)")
    return "\n".join(text)


def plot_accuracy(rows: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Accuracy against length per series, pooled over depths, with Wilson 95 % bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    groups = series(rows)
    shift = 0.02 * (len(groups) - 1)
    for i, ((task, *_), part) in enumerate(groups.items()):
        pts = by_length(part)
        xs = [n * (1 + shift * (i / max(1, len(groups) - 1) - 0.5)) for n, _, _ in pts]  # no overlap
        ys = [k / t for _, k, t in pts]
        bounds = [wilson(k, t) for _, k, t in pts]
        # max(0, ·): at 0 or 1 hits rounding may put a bound a hair past the point
        err = [[max(0.0, y - lo) for y, (lo, _) in zip(ys, bounds)],
               [max(0.0, hi - y) for y, (_, hi) in zip(ys, bounds)]]
        label = _series_label(part[0]) + (f" ({task})" if len({g[0] for g in groups}) > 1 else "")
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, linewidth=1.5, label=label)
    _mark_trained(ax, rows)
    lengths = sorted({int(r["length"]) for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [format_length(n) for n in lengths])
    ax.minorticks_off()
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("accuracy (bars: Wilson 95 %)")
    ax.grid(True, alpha=0.3)
    return _save_figure(fig, ax, title, path)


def plot_heatmaps(rows: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """The depth × length heat maps of every series side by side, one colour scale: the
    methods compared at a glance."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = series(rows)
    lengths, depths = {int(r["length"]) for r in rows}, {float(r["depth"]) for r in rows}
    fig, axes = plt.subplots(1, len(groups), squeeze=False, sharey=True,
                             figsize=(len(groups) * (1.1 * len(lengths) + 1.2) + 1.6, 0.55 * len(depths) + 2.0))
    for ax, part in zip(axes[0], groups.values()):
        im = draw_heatmap(ax, part)
        ax.set_title(_series_label(part[0]), fontsize=10)
        if ax is not axes[0][0]:
            ax.set_ylabel("")
    fig.colorbar(im, ax=list(axes[0]), label="accuracy", fraction=0.04)
    # above the figure (bbox_inches="tight" keeps it): inside, a short figure's panel titles collide
    fig.suptitle(title, fontsize=10, y=1.0, va="bottom")
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_all(rows: Sequence[dict], out: Path, caption: str) -> list[Path]:
    """Per task: the accuracy plot (retrieval_<task>.png), the heat maps side by side
    (retrieval_<task>_heatmaps.png) and one per series (retrieval_<task>_<method>[_s<factor>].png)."""
    paths = []
    for task in dict.fromkeys(r["task"] for r in rows):
        part = [r for r in rows if r["task"] == task]
        paths.append(plot_accuracy(part, out / f"retrieval_{task}.png", f"{task}: accuracy\n{caption}"))
        paths.append(plot_heatmaps(part, out / f"retrieval_{task}_heatmaps.png", f"{task}: accuracy by depth and length — {caption}"))
        for (_, method, spec, knobs), sr in series(part).items():
            suffix = method if spec in ("auto", "1") else f"{method}_s{spec}"
            suffix += f"_{digest(knobs)[:6]}" if knobs else ""
            paths.append(plot_passkey_heatmap(sr, out / f"retrieval_{task}_{suffix}.png",
                                              f"{task}: {_series_label(sr[0])} — {caption}"))
    return paths

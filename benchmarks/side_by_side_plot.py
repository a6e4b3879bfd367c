"""The plot of benchmarks/side_by_side_report.py: per-position perplexity of each method divided by
the unpatched model's sliding-window baseline over the same tokens, bucket by bucket (the rows'
`bucket_nll` / `bucket_tokens`), with the trained length L marked."""

from __future__ import annotations

import math
from pathlib import Path

from hf_posext.evaluation.shared.results import format_length

ZOOM = 2.0   # the lower panel: methods within this factor of the baseline at every bucket (at 32k
#             YaRN peaks at 1.51 in one bucket: a lower bound would leave only attention-level methods)


def bucket_ratios(row: dict, base: dict) -> list[float]:
    """exp(mean NLL of the row - mean NLL of the baseline) in each bucket (NaN: an empty bucket)."""
    return [math.exp(n / t - bn / bt) if t and bt else math.nan for n, t, bn, bt in
            zip(row["bucket_nll"], row["bucket_tokens"], base["bucket_nll"], base["bucket_tokens"])]


def plot_bucket_ratios(curves: list[tuple[str, str, int, dict]], base: dict, path: Path, title: str) -> Path:
    """curves: (label, line style, colour index, row). Every curve on a log scale, then (linear)
    the ones within ZOOM of the baseline at every bucket, so the methods near 1 stay readable
    beside the ones that blow up past L."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges, L = base["bucket_edges"], int(base["trained_length"])
    every = [(label, style, color, bucket_ratios(row, base)) for label, style, color, row in curves]
    near = [c for c in every if max(c[3]) <= ZOOM]
    fig, axes = plt.subplots(2 if near else 1, 1, figsize=(10, 8 if near else 4.8), squeeze=False)
    for ax, shown in zip(axes[:, 0], (every, near)):
        for label, style, color, ratios in shown:
            ax.step(edges, [*ratios, ratios[-1]], where="post", linewidth=1.6, color=f"C{color}",
                    linestyle=style, label=label)
        ax.axvline(L, color="black", linestyle=":", linewidth=1.2, label=f"trained length L = {L}")
        ax.axhline(1.0, color="black", linewidth=1.6,
                   label=f"unpatched, sliding {format_length(int(base['window']))} window (the baseline)")
        ax.set_xlim(edges[0], edges[-1])
        ax.set_ylabel("perplexity / sliding baseline's")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[0, 0].set_yscale("log")
    axes[0, 0].set_title(f"{title}:\nperplexity per bucket / the sliding baseline's over the same tokens "
                         "(log scale)", fontsize=10)
    if near:
        axes[1, 0].set_title(f"the methods within {ZOOM:g}x of the baseline at every bucket (linear scale)",
                             fontsize=10)
    axes[-1, 0].set_xlabel(f"prediction position (buckets of {edges[1] - edges[0]} tokens)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

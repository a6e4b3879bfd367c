"""The end-of-run tables and the plots (the results files are `store.ResultsStore`)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Callable, Sequence

from ..perplexity.buckets import curve, doc_perplexities
from .record import BASELINE


def format_length(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def _series_label(row: dict) -> str:
    if row.get("protocol") == "baseline":
        return f"none, sliding {format_length(int(row['window']))} window (stride {format_length(int(row['stride']))})"
    if row["method"] == BASELINE:   # retrieval's: each prompt cut to the window (RetrievalGrid.baseline)
        return f"none, sliding {format_length(int(row['window']))} window"
    if row["method"] == "none":
        return "none"
    spec = row.get("factor_spec", "")
    return f"{row['method']} (s={spec})" if spec and spec != "auto" else row["method"]


def pivot(rows: Sequence[dict], value: str = "perplexity", label_of: Callable[[dict], str] | None = None
          ) -> tuple[list[str], list[int], dict]:
    """(series labels, lengths, {(label, length): row}) for a table or plot; `label_of` names
    a row's series (default: method and factor)."""
    labels, lengths, cells = [], [], {}
    for r in rows:
        label = (label_of or _series_label)(r)
        if label not in labels:
            labels.append(label)
        if int(r["length"]) not in lengths:
            lengths.append(int(r["length"]))
        cells[(label, int(r["length"]))] = r
    return labels, sorted(lengths), cells


def _grid(rows: Sequence[dict], value: str) -> tuple[list[str], list[list[str]]]:
    """(header, body) of the method × length table, values formatted for reading. The
    perplexity table gains, where the rows hold them (docs/evaluation.md, "Reading the table"):
    the ratio to the sliding baseline at the longest length that has one, the same ratio over
    the tokens past the trained length L, the worst short-context ratio to the unpatched model
    at lengths <= L, and the range of per-document perplexities at the longest length."""
    labels, lengths, cells = pivot(rows, value)
    body = [[label] + [_number(cells[(label, n)].get(value)) if (label, n) in cells else "—"
                       for n in lengths] for label in labels]
    head = ["method"] + [format_length(n) for n in lengths]
    if value != "perplexity":
        return head, body
    ratio_at = max((n for (_, n), r in cells.items() if r.get("ratio_to_sliding")), default=None)
    L = max((int(r.get("trained_length") or 0) for r in rows), default=0)
    columns = []
    if ratio_at is not None:
        columns.append((f"ratio to sliding @{format_length(ratio_at)}",
                        lambda label: _ratio(cells.get((label, ratio_at), {}).get("ratio_to_sliding"))))
    if any(r.get("ratio_to_sliding_beyond_L") for r in rows):
        columns.append((f"past {format_length(L)} @{format_length(ratio_at)}",
                        lambda label: _ratio(cells.get((label, ratio_at), {}).get("ratio_to_sliding_beyond_L"))))
    if any(r.get("ratio_to_unpatched") for r in rows):
        columns.append((f"≤{format_length(L)} vs none", lambda label: _ratio(max(
            (r["ratio_to_unpatched"] for (lb, _), r in cells.items()
             if lb == label and r.get("ratio_to_unpatched")), default=None))))
    if any(len(doc_perplexities(r)) > 1 for r in rows):
        longest = lengths[-1]
        columns.append((f"docs @{format_length(longest)}",
                        lambda label: _spread(cells.get((label, longest), {}))))
    for name, cell_text in columns:
        head.append(name)
        for line, label in zip(body, labels):
            line.append(cell_text(label))
    return head, body


def _number(v) -> str:
    return "—" if v is None else f"{v:.3g}" if v >= 1000 else f"{v:.2f}"


def _ratio(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def _spread(row: dict) -> str:
    """min–max of the per-document perplexities of a row (— for one document)."""
    ppl = doc_perplexities(row)
    return f"{_number(min(ppl))}–{_number(max(ppl))}" if len(ppl) > 1 else "—"


def format_table(rows: Sequence[dict], value: str = "perplexity", title: str = "") -> str:
    """A plain-text table: one line per method, one column per length."""
    head, body = _grid(rows, value)
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    fmt = lambda cols: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cols, widths)))
    lines = ([title] if title else []) + [fmt(head), fmt(["-" * w for w in widths])] + [fmt(b) for b in body]
    return "\n".join(lines)


def knobs_label(row: dict) -> str:
    """A perplexity row's line in `ratio_table`: its method with its knobs, or the sliding baseline."""
    if row.get("protocol") == "baseline":
        return _series_label(row)
    # rows written before booleans were spelled out read logn=0 / logn=1
    text = row.get("knobs", "").replace("logn=0", "logn=false").replace("logn=1", "logn=true")
    knobs = f" ({text.replace(',', ', ')})" if text else ""
    return ("none (unpatched)" if row["method"] == "none" else row["method"]) + knobs


def sliding_ratios(rows: Sequence[dict]) -> list[dict]:
    """Copies of perplexity rows with `ratio` = perplexity / the sliding baseline's over the same
    tokens, derived by the grid's own `annotate` (rows of a run still going have none stored)."""
    from ..perplexity.run import annotate
    rows = [dict(r) for r in rows]
    annotate(rows)
    return [{**r, "ratio": r["ratio_to_sliding"]} if r.get("ratio_to_sliding") is not None else r
            for r in rows]


def ratio_table(rows: Sequence[dict], lengths: Sequence[int]) -> str:
    """Markdown: method (with knobs) × length perplexity, then the ratio to the sliding baseline
    at each length (bold: the best ratio at each length); the baseline's line last."""
    labels, _, cells = pivot(sliding_ratios(rows), label_of=knobs_label)
    labels.sort(key=lambda label: label.startswith("none, sliding"))
    best = {n: min((round(c["ratio"], 3) for (_, m), c in cells.items() if m == n and "ratio" in c),
                   default=None) for n in lengths}
    trained = int(rows[0]["trained_length"])
    names = [format_length(n) for n in lengths]
    out = ["| method | " + " | ".join(f"{name} (s = {n / trained:g})" for name, n in zip(names, lengths))
           + f" | ratio to sliding @{names[0]} | " + " | ".join(f"@{name}" for name in names[1:]) + " |",
           "|---|" + "---|" * (2 * len(lengths))]
    for label in labels:
        line = [label]
        for n in lengths:
            c = cells.get((label, n))
            line.append("" if c is None else f"{c['perplexity']:.3g}" if c["perplexity"] >= 1000
                        else f"{c['perplexity']:.2f}")
        for n in lengths:
            ratio = cells.get((label, n), {}).get("ratio")
            line.append("" if ratio is None else f"**{ratio:.3f}**" if round(ratio, 3) == best[n]
                        else f"{ratio:.3f}")
        out.append("| " + " | ".join(line) + " |")
    return "\n".join(out)


def _rich_console():
    """rich's console where it can draw (a terminal, a notebook), else None: without a terminal
    rich draws 80 columns and wraps the cells a word a line (`make demo > log`)."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    console = Console()
    return console if console.is_terminal or console.is_jupyter else None


def print_table(rows: Sequence[dict], value: str = "perplexity", title: str = "",
                caption: str = "") -> None:
    """Print with `rich` on a terminal or in a notebook, else as plain text at its natural width."""
    console = _rich_console()
    if console is None:
        print(format_table(rows, value, title) + (f"\n{caption}" if caption else ""))
        return
    from rich.table import Table
    head, body = _grid(rows, value)
    table = Table(title=title or None)
    for i, name in enumerate(head):
        table.add_column(name, justify="right" if i else "left")
    for line in body:
        table.add_row(*line)
    console.print(table)
    if caption:
        console.print(caption, style="dim", soft_wrap=True)


def log_ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    """Round tick values spanning [lo, hi] (one at or below lo, one at or above hi), at most
    about `most`: evenly stepped (matplotlib's MaxNLocator) when the data span less than a factor
    of 3, else 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k, so the ticks sit where the data are."""
    from matplotlib.ticker import MaxNLocator

    if hi <= lo * (1 + 1e-6):   # equal up to rounding (a flat curve): a 1 % band around it
        lo, hi = lo * 0.99, hi * 1.01
    if hi / lo < 3:
        nice = [float(t) for t in MaxNLocator(nbins=most - 2, steps=[1, 2, 2.5, 5, 10])
                .tick_values(lo, hi) if t > 0]
    else:
        mantissas = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
        k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        nice = sorted(m * 10.0 ** k for k in range(k0, k1 + 1) for m in mantissas)
    below = max([v for v in nice if v <= lo * (1 + 1e-9)] or [min(nice)])
    above = min([v for v in nice if v >= hi * (1 - 1e-9)] or [max(nice)])
    inside = [v for v in nice if below <= v <= above]
    step = max(1, math.ceil((len(inside) - 1) / (most - 1)))
    ticks = inside[::step]
    if ticks[-1] != above:
        ticks.append(above)
    return ticks


def plot_perplexity(rows: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Perplexity vs length: log2 x-axis, log y-axis with round ticks spanning the data, one
    line per method, the sliding-window baseline dashed in black, a dashed vertical line at
    the trained length."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    labels, lengths, cells = pivot(rows, "perplexity")
    fig, ax = plt.subplots(figsize=(8, 5))
    markers = "osD^vP*Xh<>"
    for i, label in enumerate(labels):
        pts = [(n, cells[(label, n)]["perplexity"]) for n in lengths if (label, n) in cells]
        if cells[next((label, n) for n in lengths if (label, n) in cells)].get("protocol") == "baseline":
            # A wide black bar per length (often a single point: the lengths past L).
            ax.plot(*zip(*pts), color="black", linestyle="--", marker="_", markersize=26,
                    markeredgewidth=3, linewidth=1.8, label=label, zorder=5)
            continue
        # Distinct markers and a small size step, so lines that coincide (every method is the
        # unpatched model at s = 1) stay visible on top of each other.
        ax.plot(*zip(*pts), marker=markers[i % len(markers)], markersize=9 - 1.2 * (i % 5),
                linewidth=1.6, label=label, alpha=0.9)
    _mark_trained(ax, rows)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [format_length(n) for n in lengths])
    ax.xaxis.set_minor_locator(NullLocator())
    # an overflowed perplexity (inf) is in the table, not on a log axis
    values = [r["perplexity"] for r in rows if r.get("perplexity") and math.isfinite(r["perplexity"])]
    ax.set_yscale("log")
    if values:
        ticks = log_ticks(min(values), max(values))
        ax.set_yticks(ticks, [f"{v:.4g}" for v in ticks])
        ax.yaxis.set_minor_locator(NullLocator())
        pad = (ticks[-1] / ticks[0]) ** 0.04       # 4 % of the ticked span (log axis) each side
        ax.set_ylim(ticks[0] / pad, ticks[-1] * pad)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity (log scale)")
    ax.grid(True, alpha=0.3)
    return _save_figure(fig, ax, title, path)


def _mark_trained(ax, rows: Sequence[dict], label: bool = True) -> None:
    """A dotted grey vertical line at each trained length of the rows, named at the top."""
    for t in {int(r["trained_length"]) for r in rows if r.get("trained_length")}:
        ax.axvline(t, color="grey", linestyle=":", linewidth=1)
        if label:
            # just above the axes (the titles leave room): inside, a curve at the top would
            # strike the name out, or the name hide a point
            ax.text(t, 1.005, f"trained {format_length(t)}", transform=ax.get_xaxis_transform(),
                    va="bottom", ha="center", color="grey", fontsize=8)


def _save_figure(fig, ax, title: str, path: str | Path) -> Path:
    """The common end of the line plots: the title wrapped (a long caption with the model and
    dataset would otherwise run off the figure), the legend outside on the right, saved."""
    import matplotlib.pyplot as plt

    ax.set_title(wrap_lines(title, 70), fontsize=10, pad=14)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_nll_by_position(rows: Sequence[dict], path: str | Path, title: str = "",
                         baselines: dict[str, dict] | None = None) -> Path:
    """Loss by position at the longest length with position buckets. Top: mean NLL per token
    against position, one line per method (each point a token-weighted mean over three
    neighbouring buckets), the sliding-window baseline dashed black. Bottom: each method minus
    the baseline, bucket by bucket (the text's own ups and downs cancel; below 0 past L: the
    method uses context the window cannot see); methods off that scale (the unpatched model
    past L) are named instead. A dotted vertical line at the trained length in both.
    baselines: {series label: that series' own baseline row}, for series that are different
    models (fine-tuned arms): the bottom panel then shows each minus its own sliding window."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.get("bucket_nll") and r.get("protocol") in ("truncate", "baseline")]
    if not shown:
        raise ValueError("no rows with position buckets to plot (rows written before hf_posext "
                         "recorded them?); rerun the cells.")
    longest = max(int(r["length"]) for r in shown)
    at = [r for r in shown if int(r["length"]) == longest]
    base = next((r for r in at if r["protocol"] == "baseline"), None)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.5, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    styles, off = ["-", "-", "-", "-.", "--", ":"], []
    base_xy = dict(zip(*curve(base))) if base else {}
    deltas = []
    for i, r in enumerate(at):
        xs, ys = curve(r)
        if r is base:
            top.plot(xs, ys, color="black", linestyle="--", linewidth=2.2, label=_series_label(r), zorder=5)
            continue
        line, = top.plot(xs, ys, linestyle=styles[i % len(styles)], linewidth=1.6,
                         label=_series_label(r), alpha=0.9)
        if base_xy:
            own = (baselines or {}).get(_series_label(r))
            ref = dict(zip(*curve(own))) if own is not None else base_xy
            pts = [(x, y - ref[x]) for x, y in zip(xs, ys) if x in ref]
            deltas.append((r, line.get_color(), styles[i % len(styles)], pts))
    if deltas:
        spans = sorted(max(abs(d) for _, d in pts) for *_, pts in deltas if pts)
        limit = max(0.05, 1.25 * min(spans[0] * 10, max(s for s in spans if s <= 10 * spans[0])))
        for r, color, style, pts in deltas:
            worst = max(abs(d) for _, d in pts)
            if worst > limit:
                off.append(f"{_series_label(r)} (up to {max(d for _, d in pts):+.2f})")
                continue
            bottom.plot(*zip(*pts), color=color, linestyle=style, linewidth=1.6)
        bottom.axhline(0.0, color="black", linestyle="--", linewidth=1.5)
        bottom.set_ylim(-limit, limit)
        bottom.set_ylabel("Δ NLL vs its own sliding window" if baselines else "Δ NLL vs sliding baseline")
        if off:   # wrapped: one long line ran off the figure's edge
            bottom.set_title(textwrap.fill("off this scale: " + "; ".join(off), 95), fontsize=9)
    _mark_trained(top, shown)
    _mark_trained(bottom, shown, label=False)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    ticks = [x for x in range(0, longest + 1, max(1, longest // 8))]
    bottom.set_xticks(ticks, [format_length(x) if x else "0" for x in ticks])
    bottom.set_xlim(0, longest)
    bottom.set_xlabel(f"token position (forwards of {format_length(longest)} tokens)")
    top.set_ylabel("mean NLL per token (nats)")
    return _save_figure(fig, top, title, path)


def wrap_lines(text: str, width: int) -> str:
    """Each line of a plot title wrapped to `width` characters (its own line breaks kept)."""
    return "\n".join(textwrap.fill(line, width) for line in text.splitlines())


def plot_passkey_heatmap(rows: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Depth × length heat map of passkey accuracy for one method (draw_heatmap)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths, depths = {int(r["length"]) for r in rows}, {float(r["depth"]) for r in rows}
    width = 1.3 * len(lengths) + 2.6
    fig, ax = plt.subplots(figsize=(width, 0.6 * len(depths) + 1.8))
    im = draw_heatmap(ax, rows)
    # wrapped to the figure (~9 characters an inch at 10 pt): a one-method map of two lengths is
    # narrow, and a caption on one line ran off both sides
    ax.set_title(wrap_lines(title, max(30, int(9 * width))), fontsize=10)
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def draw_heatmap(ax, rows: Sequence[dict]):
    """Depth × length accuracy on `ax`, in `cividis` (designed to read the same for colour-blind
    readers and in greyscale), each cell labelled in the colour that contrasts with its
    background: `k/n` where the rows count trials (a share of 4 trials is not a rate), else %."""
    import matplotlib.pyplot as plt

    lengths = sorted({int(r["length"]) for r in rows})
    depths = sorted({float(r["depth"]) for r in rows})
    grid = [[math.nan] * len(lengths) for _ in depths]
    labels = [[""] * len(lengths) for _ in depths]
    for r in rows:
        i, j = depths.index(float(r["depth"])), lengths.index(int(r["length"]))
        grid[i][j] = r["accuracy"]
        labels[i][j] = (f"{r['correct']}/{r['trials']}" if "correct" in r and "trials" in r
                        else f"{r['accuracy']:.0%}")
    cmap = plt.get_cmap("cividis")
    im = ax.imshow(grid, vmin=0, vmax=1, cmap=cmap, aspect="auto")
    for i in range(len(depths)):
        for j in range(len(lengths)):
            if not math.isnan(grid[i][j]):
                r, g, b, _ = cmap(float(grid[i][j]))   # an int would index the colour table
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=11,
                        color="white" if dark else "black", fontweight="bold")
    trained = int(rows[0].get("trained_length") or 0)
    ax.set_xticks(range(len(lengths)), [format_length(n) + (" = L" if n == trained else "") for n in lengths],
                  fontsize=10)
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths], fontsize=10)
    ax.set_xlabel("context length (tokens)", fontsize=10)
    ax.set_ylabel("key depth (0% = start)", fontsize=10)
    return im

"""Results files (CSV + JSON, written after every cell), the end-of-run table, and the plots.

Each finished cell rewrites `<name>.json` and `<name>.csv` atomically (temporary file, then
`os.replace`), so a run killed at any moment leaves complete files holding every finished row,
and `resume=True` skips the cells they hold.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Sequence


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ResultsStore:
    """Tidy rows keyed by `row["key"]`, persisted to `<out>/<name>.json` and `.csv`."""

    def __init__(self, out_dir: str | Path, name: str, resume: bool = False):
        self.out = Path(out_dir)
        self.json_path = self.out / f"{name}.json"
        self.csv_path = self.out / f"{name}.csv"
        self.rows: list[dict] = []
        if self.json_path.exists():
            if not resume:
                raise FileExistsError(f"{self.json_path} already holds results. Pass --resume to "
                                      "skip its finished cells, or choose another --out.")
            try:
                self.rows = json.loads(self.json_path.read_text(encoding="utf-8"))["rows"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{self.json_path} is not a hf_posext results file ({err}); move it "
                                 "away or choose another --out.") from None
        self._index = {r["key"]: r for r in self.rows}

    def has(self, key: str) -> bool:
        return key in self._index

    def get(self, key: str) -> dict:
        return self._index[key]

    def add(self, row: dict) -> None:
        if row["key"] in self._index:
            raise KeyError(f"duplicate result for {row['key']}")
        self.rows.append(row)
        self._index[row["key"]] = row
        self.flush()

    def flush(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.json_path, json.dumps({"rows": self.rows}, indent=1, default=str) + "\n")
        fields: list[str] = []
        for r in self.rows:
            fields += [k for k in r if k not in fields]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for r in self.rows:
            writer.writerow({k: ("" if v is None else v) for k, v in r.items()})
        _atomic_write(self.csv_path, buf.getvalue())


def _fmt_len(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def _series_label(row: dict) -> str:
    if row["method"] == "none":
        return "none"
    spec = row.get("factor_spec", "")
    return f"{row['method']} (s={spec})" if spec and spec != "auto" else row["method"]


def pivot(rows: Sequence[dict], value: str) -> tuple[list[str], list[int], dict]:
    """(series labels, lengths, {(label, length): row}) for a table or plot."""
    labels, lengths, cells = [], [], {}
    for r in rows:
        label = _series_label(r)
        if label not in labels:
            labels.append(label)
        if int(r["length"]) not in lengths:
            lengths.append(int(r["length"]))
        cells[(label, int(r["length"]))] = r
    return labels, sorted(lengths), cells


def format_table(rows: Sequence[dict], value: str = "perplexity", title: str = "") -> str:
    """A plain-text table: one line per method, one column per length."""
    labels, lengths, cells = pivot(rows, value)
    head = ["method"] + [_fmt_len(n) for n in lengths]
    body = []
    for label in labels:
        line = [label]
        for n in lengths:
            r = cells.get((label, n))
            v = None if r is None else r[value]
            line.append("—" if v is None else (f"{v:.3g}" if v >= 1000 else f"{v:.2f}"))
        body.append(line)
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    fmt = lambda cols: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cols, widths)))
    lines = ([title] if title else []) + [fmt(head), fmt(["-" * w for w in widths])] + [fmt(b) for b in body]
    return "\n".join(lines)


def print_table(rows: Sequence[dict], value: str = "perplexity", title: str = "",
                caption: str = "") -> None:
    """Print with `rich` when installed, else as plain text."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(format_table(rows, value, title) + (f"\n{caption}" if caption else ""))
        return
    labels, lengths, cells = pivot(rows, value)
    table = Table(title=title or None)
    table.add_column("method")
    for n in lengths:
        table.add_column(_fmt_len(n), justify="right")
    for label in labels:
        vals = []
        for n in lengths:
            r = cells.get((label, n))
            v = None if r is None else r[value]
            vals.append("—" if v is None else (f"{v:.3g}" if v >= 1000 else f"{v:.2f}"))
        table.add_row(label, *vals)
    console = Console()
    console.print(table)
    if caption:
        console.print(caption, style="dim", soft_wrap=True)


def plot_perplexity(rows: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Perplexity vs length: log2 x-axis, log y-axis, one line per method, a dashed vertical
    line at the trained length."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, lengths, cells = pivot(rows, "perplexity")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = "osD^vP*Xh<>"
    for i, label in enumerate(labels):
        pts = [(n, cells[(label, n)]["perplexity"]) for n in lengths if (label, n) in cells]
        # Distinct markers and a small size step, so lines that coincide (every method is the
        # unpatched model at s = 1) stay visible on top of each other.
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                markersize=9 - 1.2 * (i % 5), linewidth=1.6, label=label, alpha=0.9)
    trained = {int(r["trained_length"]) for r in rows if r.get("trained_length")}
    for t in trained:
        ax.axvline(t, color="grey", linestyle="--", linewidth=1)
        ax.text(t, 0.98, f" trained {_fmt_len(t)}", transform=ax.get_xaxis_transform(),
                va="top", color="grey", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [_fmt_len(n) for n in lengths])
    ax.set_yscale("log")
    # Plain numbers on the log axis; label the minor ticks too when the data span under two
    # decades (otherwise there may be no labelled tick at all).
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    values = [r["perplexity"] for r in rows if r.get("perplexity")]
    ax.yaxis.set_minor_formatter(plain if values and max(values) / min(values) < 100 else NullFormatter())
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_passkey_heatmap(rows: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Depth × length heat map of passkey accuracy for one method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({int(r["length"]) for r in rows})
    depths = sorted({float(r["depth"]) for r in rows})
    grid = [[math.nan] * len(lengths) for _ in depths]
    for r in rows:
        grid[depths.index(float(r["depth"]))][lengths.index(int(r["length"]))] = r["accuracy"]
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2, 0.6 * len(depths) + 1.5))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    for i in range(len(depths)):
        for j in range(len(lengths)):
            if not math.isnan(grid[i][j]):
                ax.text(j, i, f"{grid[i][j]:.0%}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(lengths)), [_fmt_len(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("key depth")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

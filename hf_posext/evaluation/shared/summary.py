"""What a person reads first in a run folder: `summary.md` (the table, the effective length, the
plots' names) and `summary.json` (the same, for scripts), written by `hf-posext eval`,
`hf-posext retrieval` and `hf-posext extend --eval` from the stored rows; and `compare`, which
puts several folders' summaries side by side (`hf-posext compare DIR DIR ...`). And a results
page regenerated from rows under a reading written by hand (`write_page_keeping_reading`).

summary.json:
    {"schema": 1, "caption": str, "plots": [file names],
     "sections": [{"kind": "perplexity" | "retrieval", "table": str,
                   "series": [{"label": str, "task": str | None, "effective_length": int | None,
                               "values": {length: {"value": float, "low": float | None,
                                                   "high": float | None, "ratio_to_sliding": float | None}}}]}]}
`value` is perplexity for a perplexity section (truncate protocol; the sliding baseline is its own
series), accuracy for a retrieval one (`low` / `high`: its Wilson 95 % interval).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from .results import format_length, format_table, knobs_label
from ...portability.atomic import atomic_write

SCHEMA = 1
NAMES = ("summary.md", "summary.json")


def perplexity_section(rows: Sequence[dict]) -> dict:
    """The truncate protocol's rows (and the baseline) by series and length."""
    part = [r for r in rows if r["protocol"] in ("truncate", "baseline")] or list(rows)
    series: dict[str, dict] = {}
    for r in part:
        line = series.setdefault(knobs_label(r), {"label": knobs_label(r), "task": None,
                                                  "effective_length": None, "values": {}})
        line["values"][str(r["length"])] = {"value": float(r["perplexity"]), "low": None, "high": None,
                                            "ratio_to_sliding": r.get("ratio_to_sliding")}
    return {"kind": "perplexity", "table": format_table(part, "perplexity"), "series": list(series.values())}


def retrieval_section(rows: Sequence[dict], margin: float) -> dict:
    """Accuracy with its Wilson interval per series and length, and each series' effective length."""
    from ..retrieval.plots import by_length, format_summary, series as by_series, summary
    from ..retrieval.stats import wilson
    lines = summary(rows, margin)
    out = []
    for line, part in zip(lines, by_series(rows).values()):
        values = {}
        for n, k, total in by_length(part):
            low, high = wilson(k, total)
            values[str(n)] = {"value": k / total, "low": round(low, 4), "high": round(high, 4),
                              "ratio_to_sliding": None, "correct": k, "trials": total}
        out.append({"label": line["series"], "task": line["task"],
                    "effective_length": line["effective_length"], "values": values})
    return {"kind": "retrieval", "table": format_summary(lines, margin), "series": out}


def write_summary(out: Path, caption: str, sections: list[dict], plots: Sequence[Path] = ()) -> tuple[Path, Path]:
    """summary.md and summary.json in `out` (both replaced whole)."""
    names = [Path(p).name for p in plots if p]   # a plot with nothing to draw is None
    data = {"schema": SCHEMA, "caption": caption, "plots": names, "sections": sections}
    md = [f"# Summary: {caption}", ""]
    for s in sections:
        md += [f"## {s['kind']}", "", "```", s["table"], "```", ""]
        effective = [(x["label"], x["task"], x["effective_length"]) for x in s["series"] if s["kind"] == "retrieval"]
        if effective:
            md += ["Effective length (the longest length whose accuracy stays above the unpatched "
                   "model's within the trained length, less the margin):", ""]
            md += [f"- {task} {label}: {format_length(n) if n else '—'}" for label, task, n in effective]
            md.append("")
    if names:
        md += ["Plots: " + ", ".join(f"[{p}]({p})" for p in names), ""]
    md += ["Every row, with what identifies it: the results files beside this one.", ""]
    paths = (out / NAMES[0], out / NAMES[1])
    atomic_write(paths[0], "\n".join(md))
    atomic_write(paths[1], json.dumps(data, indent=1) + "\n")
    return paths


def read_summary(folder: str | Path) -> dict:
    """A run folder's summary.json (ValueError naming the fix when there is none)."""
    path = Path(folder) / NAMES[1]
    if not path.is_file():
        raise ValueError(f"{folder}: no {NAMES[1]} there; point at a folder `hf-posext eval`, "
                         "`retrieval` or `extend --eval` wrote (or rerun it with --resume to write one).")
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: summary schema {data.get('schema')!r}, this hf_posext reads {SCHEMA}.")
    return data


READING = "## Reading it"


def write_page_keeping_reading(path: Path, generated: Sequence[str]) -> Path:
    """`path` rewritten as the `generated` lines (the table and commands, made from rows) followed by
    the page's own `## Reading it` section, written by hand and kept across regenerations (a
    placeholder when the page has none yet)."""
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(READING):] if READING in old else f"{READING}\n\n(to be written from the rows above)\n"
    path.write_text("\n".join(generated) + kept)
    return path

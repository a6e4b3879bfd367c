"""The 4x section of the side-by-side page (results/side_by_side.md): per-position
perplexity of every method at the 4x length (no retrieval there), its plot
(side_by_side_<size>.png), DPE's detection and the searches at that length, each read by
side_by_side_report.py's readers from the rows side_by_side.py's `dpe32`, `search32` and `eval32`
wrote; a step not run yet reads "not run". benchmarks/side_by_side.py passes the lines to
`write_report`."""

from __future__ import annotations

from pathlib import Path

from side_by_side_report import NOT_RUN, Setup, dpe_lines, eval_cells, measured, plot, read_eval, search_lines, shown


def section_4x(out: Path, page: Path, setup: Setup) -> list[str]:
    """The section's lines; `setup`: what side_by_side.py ran at the 4x length."""
    ev, size = read_eval(out, setup), setup.size
    text = [f"## At {size}: perplexity on {setup.held}, every method", ""]
    if ev.base is None and not ev.rows:
        text += [f"Perplexity at {size}: {NOT_RUN}.", ""]
    else:
        text += [f"| method | tuned on | portable | ppl / sliding, within L | past L | whole {size} | wall s |",
                 "|---|---|---|---|---|---|---|"]
        for line in setup.lines():
            row = ev.rows.get(line.label)
            wall = "" if row is None else f"{float(row['seconds']):.0f}"
            text.append(f"| {shown(line, list(ev.rows.values()))} | {line.tuned_on} | {line.portable} | "
                        + " | ".join(eval_cells(ev, line.label)) + f" | {wall} |")
        png = plot(ev, page.with_name(f"{page.stem}_{size}.png"), setup)
        text += ["", *(f"- {note}" for note in ev.notes.values()), *measured(ev, {}),
                 f"- The sliding baseline's run: {float(ev.base['seconds']):.0f} s." if ev.base else "", "",
                 *([f"![per-position perplexity ratio at {size}]({png.name})", ""] if png else [])]
    return text + [*dpe_lines(out, page, setup), "", *search_lines(page, setup), ""]

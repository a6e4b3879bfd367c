"""The side-by-side page (results/side_by_side.md and its .png) from what
benchmarks/side_by_side.py wrote under results/side-by-side/ and results/dpe/. Every figure is
read from those files, never typed in; a step not run yet (or still running) reads "not run" in
its cells, so the page can be written at any point of the run. The "Reading it" section (after the
table and plot) is written by hand: a page that has one keeps it when the report is rewritten. What was run (texts, length,
knobs, searches, the commands) comes from side_by_side.py as one `Setup` per length: this module
does not import the script that imports it (tests/test_layout.py: no import circle between scripts).
The 4x section is side_by_side_4x.py's, built from these readers and passed in by the script."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import hf_posext
from hf_posext.evaluation.perplexity.buckets import nll_from
from hf_posext.evaluation.retrieval.stats import pooled, rate_text
from hf_posext.evaluation.shared.record import read_rows
from hf_posext.evaluation.shared.results import format_length

NOT_RUN = "not run"
REFUSED = "not compared (below)"
READING = "## Reading it"


def _name(dataset: str) -> str:
    """embedded:shakespeare/king-lear -> King Lear."""
    return dataset.rsplit("/", 1)[-1].replace("-", " ").title()


@dataclass(frozen=True)
class Line:
    """One row of the table: a method as side_by_side.py runs it, and where its rows are."""
    label: str
    method: str          # the `method` of its eval / retrieval rows
    searched: bool       # the searched checkpoint (its own folders) or the shared runs
    eval_dir: str
    retrieval_dir: str
    tuned_on: str

    @property
    def unpatched(self) -> bool:
        return self.method == "none" and not self.searched

    @property
    def portable(self) -> str:
        """Rope-only configs are what engines read; attention-level methods run in hf_posext only."""
        if self.searched:
            return "yes (searched `longrope` factors)"
        if self.unpatched:
            return "yes (unchanged)"
        if self.method in hf_posext.ATTENTION_METHODS:
            return "no (attention-level)"
        saved = ", saved as `longrope`: docs/methods.md" if self.method == "cope" else ""
        return f"yes (rope-only{saved})"


@dataclass(frozen=True)
class Search:
    """A search whose checkpoint side_by_side.py evaluates."""
    objective: str
    folder: Path              # its search_log.jsonl (and config.json once finished)
    minutes: float            # its wall-time budget
    note: str = ""            # said under the search table (e.g. where a reused search came from)


@dataclass(frozen=True)
class Setup:
    """What benchmarks/side_by_side.py ran at one length (its own constants, passed by its
    `report` step)."""
    tune: str                 # the tuning text (DPE's detection, the searches)
    held_out: str             # the perplexity text
    target: int               # the target length
    knobs: str                # the --knobs of the shared runs
    tasks: str                # retrieval tasks, comma-separated
    depths: str               # retrieval depths, comma-separated
    dpe_file: str             # DPE's detection result, a file name in results/dpe/
    commands: str             # the script's docstring: its steps as commands
    searches: tuple[Search, ...]

    @property
    def size(self) -> str:
        return format_length(self.target)

    @property
    def tuned(self) -> str:
        return _name(self.tune)

    @property
    def held(self) -> str:
        return _name(self.held_out)

    def knobs_of(self, method: str) -> str:
        return ", ".join(k.split(":", 1)[1] for k in self.knobs.split(",") if k.startswith(f"{method}:"))

    def lines(self) -> list[Line]:
        n = self.size
        shared = lambda label, method, tuned: Line(label, method, False, f"eval-{n}", f"retrieval-{n}", tuned)  # noqa: E731
        searches = sorted((s.objective for s in self.searches), key="perplexity".__ne__)   # plain first
        return [shared("yarn", "yarn", "nothing"), shared("cope", "cope", "nothing"),
                shared("dpe (detected scales)", "dpe", f"{self.tuned} (its detection)"),
                *(Line(f"search, objective={o}", "none", True, f"eval-{n}-search-{o}", f"retrieval-{n}-search-{o}",
                       f"{self.tuned} (the search)") for o in searches),
                shared(f"self_extend ({self.knobs_of('self_extend')})", "self_extend",
                       f"{self.tuned} (knobs picked by long_context.py tune)"),
                shared("none (unpatched)", "none", "nothing")]


def _rows(path: Path) -> list[dict]:
    """The rows of a results file; [] when the step has not written it yet."""
    return read_rows(path) if path.exists() else []


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _split(row: dict, L: int) -> dict[str, tuple[float, int]] | None:
    """(NLL sum, tokens) within L (positions < L), past L and over the whole length; None when
    the row's buckets have no edge at L."""
    past = nll_from(row, L)
    if past is None:
        return None
    whole = (float(row["nll"]), int(row["tokens"]))
    return {"within L": (whole[0] - past[0], whole[1] - past[1]), "past L": past, "whole": whole}


def _comparable(row: dict, base: dict) -> str:
    """Why a row cannot be divided by the baseline ("" when it can): other text or other tokens."""
    keys = ("data_hash", "tokens", "dtype", "bucket_edges", "bucket_tokens")
    shown = lambda v: v if not isinstance(v, list) else f"({len(v)} values)"   # noqa: E731
    return "; ".join(f"{k} {shown(row.get(k))} vs {shown(base.get(k))}" for k in keys if row.get(k) != base.get(k))


@dataclass
class Eval:
    rows: dict[str, dict]        # label -> its truncate row at TARGET
    base: dict | None            # the unpatched model's sliding-window row
    notes: dict[str, str]        # label -> why its row was refused


def read_eval(out: Path, setup: Setup) -> Eval:
    at = lambda rows: [r for r in rows if int(r["length"]) == setup.target]   # noqa: E731
    shared = at(_rows(out / f"eval-{setup.size}" / "perplexity.json"))
    base = next((r for r in shared if r["protocol"] == "baseline"), None)
    found: dict[str, dict] = {}
    notes: dict[str, str] = {}
    for line in setup.lines():
        rows = at(_rows(out / line.eval_dir / "perplexity.json")) if line.searched else shared
        row = next((r for r in rows if r["protocol"] == "truncate" and r["method"] == line.method), None)
        if row is None:
            continue
        why = _comparable(row, base) if base else ""
        if why:
            notes[line.label] = (f"{line.label} ({line.eval_dir}): not compared with the sliding "
                                 f"baseline of eval-{setup.size}, the rows differ: {why}.")
            continue
        found[line.label] = row
    return Eval(found, base, notes)


def eval_cells(ev: Eval, label: str) -> list[str]:
    row = ev.rows.get(label)
    if row is None:
        return [REFUSED if label in ev.notes else NOT_RUN] * 3
    if ev.base is None:
        return ["no baseline yet"] * 3
    L = int(row["trained_length"])
    a, b = _split(row, L), _split(ev.base, L)
    if a is None or b is None:
        return ["no bucket edge at L"] * 3
    # perplexity over the method's tokens / the baseline's over the same: exp(mean NLL difference)
    return [f"{math.exp(a[k][0] / a[k][1] - b[k][0] / b[k][1]):.4f}" for k in ("within L", "past L", "whole")]


def read_retrieval(out: Path, setup: Setup) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """label -> its retrieval rows at TARGET; rows of a searched checkpoint whose prompts differ
    from the shared run's (data hash per task and depth) are refused, with a note."""
    at = lambda rows: [r for r in rows if int(r["length"]) == setup.target]   # noqa: E731
    shared = at(_rows(out / f"retrieval-{setup.size}" / "retrieval.json"))
    prompts = {(r["task"], r.get("haystack"), r["depth"]): r.get("data_hash") for r in shared}
    found: dict[str, list[dict]] = {}
    notes: dict[str, str] = {}
    for line in setup.lines():
        rows = at(_rows(out / line.retrieval_dir / "retrieval.json")) if line.searched else shared
        rows = [r for r in rows if r["method"] == line.method]
        other = sorted({f"{k[0]} ({k[1]}) depth {k[2]}" for r in rows for k in [(r["task"], r.get("haystack"), r["depth"])]
                        if prompts.get(k, r.get("data_hash")) != r.get("data_hash")})
        if other:
            notes[line.label] = (f"{line.label} ({line.retrieval_dir}): not compared, its prompts "
                                 f"differ from retrieval-{setup.size}'s at {', '.join(other)}.")
            continue
        found[line.label] = rows
    return found, notes


def retrieval_cell(rows: list[dict], task: str, depths: str) -> str:
    rows = [r for r in rows if r["task"] == task]
    if not rows:
        return NOT_RUN
    k, n = pooled(rows)
    done, wanted = len({r["depth"] for r in rows}), len(depths.split(","))
    return rate_text(k, n) + (f" ({done}/{wanted} depths)" if done < wanted else "")


def dpe_lines(out: Path, page: Path, setup: Setup) -> list[str]:
    """DPE's detected scales and its probe rows: groups x scales, share of needles found / answer NLL."""
    path, log = out.parent / "dpe" / setup.dpe_file, out.parent / "dpe" / Path(setup.dpe_file).with_suffix(".log.jsonl")
    probes = {(int(p["group"]), int(p["scale"])): p for p in _jsonl(log)   # a resumed probe: its last row
              if str(p.get("key", "")).startswith(f"T{setup.target}-")}
    if not probes:
        return ["DPE's detection: not run."]
    shared = sum(1 for p in probes.values() if "same_as" in p)   # the base-scale probe, run once, copied
    logged = (f"{len(probes)} rows logged in [{log.name}]({_rel(log, page)}), "
              f"{len(probes) - shared} of them forwards ({shared} copy the shared base-scale probe), "
              f"{sum(float(p['seconds']) for p in probes.values()) / 60:.1f} min of probe wall time")
    head = [f"DPE's detection: not finished ({logged})."]
    if path.exists():
        d = json.loads(path.read_text())
        head = [f"DPE's detection on {setup.tuned} ([{path.name}]({_rel(path, page)})): target {d['target_length']}, "
                f"window {d['window']}, candidate scales {d['candidates']}, base scale {d['base_scale']}; detected "
                f"`group_scales` {d['group_scales']} (group 0 = the fastest frequencies); {logged}."]
    scales = sorted({s for _, s in probes})
    return [*head, "", "| group | " + " | ".join(f"scale {s}: found / NLL" for s in scales) + " |",
            "|---|" + "---|" * len(scales),
            *(f"| {g} | " + " | ".join(f"{probes[g, s]['found']:.2f} / {probes[g, s]['nll']:.3f}" if (g, s) in probes
                                       else "" for s in scales) + " |" for g in sorted({g for g, _ in probes}))]


def search_lines(page: Path, setup: Setup) -> list[str]:
    """The searches' lead-in, their table (read from their logs) and their notes."""
    budgets = {s.minutes for s in setup.searches}
    lines = [f"The searches (`hf-posext search` on {setup.tuned}, "
             + ("each objective the same wall-time budget" if len(budgets) == 1 else
                "the objectives with different wall-time budgets: the column budget")
             + "; the best objective value is the mean NLL of the objective each one optimizes, so the two "
             "are not comparable with each other):", "",
             "| objective | algorithm | proxy length | budget (min) | evaluated (seeds + candidates) "
             "| minutes (log's elapsed) | best objective value (mean NLL) | from | finished |", "|---|---|---|---|---|---|---|---|---|"]
    for search in sorted(setup.searches, key=lambda s: s.objective != "perplexity"):
        folder, objective = search.folder, search.objective
        log = _jsonl(folder / "search_log.jsonl")
        if not log:
            lines.append(f"| {objective} | {NOT_RUN} |  | {search.minutes:g} |  |  |  |  |  |")
            continue
        settings = next((r["settings"] for r in log if r["kind"] == "settings"), {})
        scored = [r for r in log if r["kind"] in ("seed", "candidate", "step")]
        seeds = sum(r["kind"] == "seed" for r in scored)
        best = min(scored, key=lambda r: r.get("nll", r.get("proxy_nll", math.inf)), default=None)
        value = "" if best is None else f"{best.get('nll', best.get('proxy_nll')):.4f}"
        source = "" if best is None else best.get("method") or (
            f"generation {best['generation']}" if "generation" in best else f"step {best.get('step')}")
        minutes = max((float(r.get("elapsed", 0)) for r in log), default=0.0) / 60
        lines.append(f"| [{settings.get('objective', 'perplexity')}]({_rel(folder / 'search_log.jsonl', page)}) "
                     f"| {settings.get('algorithm', 'gradient')} | {settings.get('proxy_length', '')} "
                     f"| {search.minutes:g} | {seeds} + {len(scored) - seeds} | {minutes:.1f} | {value} | {source} "
                     f"| {'yes' if (folder / 'config.json').exists() else 'no'} |")
    notes = [f"- {s.objective}: {s.note}." for s in setup.searches if s.note]
    return lines + ([""] + notes if notes else [])


def plot(ev: Eval, path: Path, setup: Setup) -> Path | None:
    """side_by_side_plot.plot_bucket_ratios of every row read (rope-only dashed, the unpatched dotted)."""
    if ev.base is None or "bucket_nll" not in ev.base:
        return None
    from side_by_side_plot import plot_bucket_ratios
    curves = []
    for i, line in enumerate(setup.lines()):
        if "bucket_nll" in ev.rows.get(line.label, {}):
            rope_only = line.portable.startswith("yes") and not line.unpatched
            curves.append((line.label + ("" if rope_only or line.unpatched else " (attention-level)"),
                           ":" if line.unpatched else "--" if rope_only else "-", i, ev.rows[line.label]))
    return None if not curves else plot_bucket_ratios(curves, ev.base, path, f"{_name(setup.held_out)}, first {setup.target} tokens, "
                                              f"{ev.base.get('dtype', '')}")


def _rel(path: Path, page: Path) -> str:
    return Path(os.path.relpath(path, page.parent)).as_posix()


def _commands(setup: Setup) -> list[str]:
    return [line.strip() for line in setup.commands.splitlines()
            if line.strip().startswith("python benchmarks/side_by_side.py")]


def _kept_reading(page: Path) -> list[str]:
    """The hand-written "Reading it" section of the page as it is (to its end or the next `## `)."""
    if not page.exists():
        return []
    text = page.read_text()
    m = re.search(rf"^{READING}\n.*?(?=^## |\Z)", text, re.S | re.M)
    return [m.group(0).rstrip(), ""] if m else []


def measured(ev: Eval, retrieval: dict[str, list[dict]]) -> list[str]:
    """What the rows are, read from them: texts, dtypes, windows, trials."""
    out = []
    if ev.base is not None:
        b = ev.base
        dtypes = sorted({r["dtype"] for r in [b, *ev.rows.values()]})
        out.append(f"- Perplexity: model {b['model']}; {b['dataset']}, {b['docs']} document, the first {b['length']} tokens "
                   f"read in one forward ({b['tokens']} predictions), dtype {', '.join(dtypes)}; "
                   f"L = {b['trained_length']}. Baseline: the unpatched model with a sliding "
                   f"{b['window']}-token window, stride {b['stride']}. Ratios divide perplexity by the "
                   "baseline's over the same tokens, split at L from the rows' `bucket_nll` / "
                   f"`bucket_tokens` (edges every {(b.get('bucket_edges') or [0, '?'])[1]} positions).")
    rows = [r for rs in retrieval.values() for r in rs]
    if rows:
        trials = sorted({int(r["trials"]) for r in rows})
        out.append(f"- Retrieval: haystack {', '.join(sorted({r['haystack'] for r in rows}))}, tasks "
                   f"{', '.join(sorted({r['task'] for r in rows}))}, depths "
                   f"{', '.join(str(d) for d in sorted({r['depth'] for r in rows}))}, "
                   f"{'/'.join(map(str, trials))} trial(s) per depth, prompts of up to "
                   f"{max(int(r['prompt_tokens']) for r in rows)} tokens, dtype "
                   f"{', '.join(sorted({r['dtype'] for r in rows}))}; each cell pools the depths: "
                   f"k/n correct = rate [Wilson 95 % interval].")
    return out


def _cost(ev: Eval, retrieval: dict[str, list[dict]], setup: Setup) -> list[str]:
    lines = ["| method | perplexity run, wall s | retrieval, wall s (cells) |", "|---|---|---|"]
    for line in setup.lines():
        row, rows = ev.rows.get(line.label), retrieval.get(line.label, [])
        ppl = "" if row is None else f"{float(row['seconds']):.0f}"
        ret = f"{sum(float(r['seconds']) for r in rows):.0f} ({len(rows)})" if rows else ""
        lines.append(f"| {line.label} | {ppl} | {ret} |")
    if ev.base is not None:
        lines.append(f"| baseline (sliding window) | {float(ev.base['seconds']):.0f} |  |")
    return lines


def shown(line: Line, rows: list[dict]) -> str:
    """The label, with the scale factor its rows ran at for the rope methods that take one."""
    if line.searched or line.method not in hf_posext.ROPE_METHODS:
        return line.label
    factors = sorted({float(r["factor"]) for r in rows if r["method"] == line.method})
    return f"{line.label} (s = {', '.join(f'{f:g}' for f in factors)})" if factors else line.label


def write_report(out_dir: Path, page_path: Path, setup: Setup, sections: Sequence[str] = ()) -> Path:
    """Write the page (and its plot beside it, same stem, .png) from the folders under out_dir;
    `sections`: lines of further sections (the 4x one), before the commands."""
    out_dir, page_path = Path(out_dir), Path(page_path)
    ev = read_eval(out_dir, setup)
    retrieval, retrieval_notes = read_retrieval(out_dir, setup)
    tasks, n, tuned, held_out = setup.tasks.split(","), setup.size, setup.tuned, _name(setup.held_out)
    png = plot(ev, page_path.with_suffix(".png"), setup)
    every = [*ev.rows.values(), *(r for rs in retrieval.values() for r in rs)]
    L = next((int(r["trained_length"]) for r in every), None)
    folder = _rel(out_dir, page_path)
    text = [f"# Side by side at {n}{f' (s = {setup.target / L:g})' if L else ''}: per-dimension methods, "
            "the search's two objectives, YaRN and the best attention-level method", "",
            f"Extended to {setup.target} tokens; tuned on {tuned} where a method tunes, measured on "
            f"{held_out} ({setup.held_out}) and on the retrieval suite's prompts, neither of which any "
            "method was tuned on. Written by `python benchmarks/side_by_side.py report` from "
            f"`{folder}/`; a cell reads \"{NOT_RUN}\" until its step has written its rows.", "",
            f"| method | tuned on | portable | {held_out} ppl / sliding, within L | past L | whole {n} | "
            + " | ".join(f"{t} k/n [Wilson 95 %]" for t in tasks) + " |",
            "|---|---|---|---|---|---|" + "---|" * len(tasks)]
    for line in setup.lines():
        found = retrieval.get(line.label, [])
        cells = [shown(line, every), line.tuned_on, line.portable, *eval_cells(ev, line.label),
                 *(REFUSED if line.label in retrieval_notes else retrieval_cell(found, t, setup.depths)
                   for t in tasks)]
        text.append("| " + " | ".join(cells) + " |")
    notes = [*ev.notes.values(), *retrieval_notes.values()]
    text += [""] + [f"- {note}" for note in notes] + ([""] if notes else [])
    if png is not None:
        text += [f"![per-position perplexity ratio to the sliding baseline]({png.name})", "",
                 "Per bucket of positions: each method's perplexity over the bucket / the sliding "
                 "baseline's over the same tokens; dashed: rope-only configs. Lower panel: the methods that "
                 "stay near the baseline at every bucket, on a linear scale.", ""]
    text += [*_kept_reading(page_path), "## What was measured", "", *measured(ev, retrieval),
             "- Portable: a rope-only config, written in `config.json` where transformers and the "
             "engines read it; attention-level methods run in transformers with hf_posext only.", "",
             *dpe_lines(out_dir, page_path, setup), "", *search_lines(page_path, setup), "",
             "Wall time on the shared 2-core CPU:", "", *_cost(ev, retrieval, setup), "", *sections,
             "## Commands", "", "Each step runs hf-posext's own commands (benchmarks/side_by_side.py "
             "prints each as it starts); a rerun resumes:", "", "```bash", *_commands(setup), "```", ""]
    page_path.write_text("\n".join(text).rstrip() + "\n")
    return page_path

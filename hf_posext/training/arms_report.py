"""report.md of the fine-tuning arms (arms.py; benchmarks/finetune_retrieval.py writes it), from
the stored results only.

The arms side by side: perplexity of the held-out document; the change at the shortest length
against the training-free arm; mean NLL past L minus the arm's own sliding baseline's (only
where the grid has a length past L: the baseline exists only there, so a grid within L shows
"—"); retrieval pooled over the depths with Wilson 95 % intervals, one column per (task,
haystack, length). A fine-tuned arm run with several training seeds has one line per seed and a
line saying how far the seeds differ. Then each arm's `hf-posext eval` table and every retrieval
row (per depth, per look when the trials were sequential) with the answers given.
"""

from __future__ import annotations

from pathlib import Path

from ..evaluation.shared.record import outputs_text, read_rows

LABELS = {"free": "training-free", "docs": "fine-tuned, documents", "mix": "fine-tuned, documents + synthetic"}
DEFAULT_PAIRS = [("single_needle", "noise")]


def label(name: str) -> str:
    arm, _, seed = name.partition("-seed")
    return LABELS[arm] + (f" (seed {seed})" if seed else "")


def stored(folder: Path, name: str) -> list[dict]:
    return read_rows(folder / name / f"{name}.json")


def haystack_name(row: dict) -> str:
    """`noise`, or the held-out document's name (`embedded:shakespeare/hamlet` -> `hamlet`)."""
    return Path(str(row.get("haystack", "noise")).rsplit("/", 1)[-1]).stem


def relabel(rows: list[dict], name: str) -> list[dict]:
    """Copies named after the run for the shared plots (every arm's rows say `none`)."""
    return [{**r, "method": label(name), "factor_spec": "auto"} for r in rows if r.get("protocol") != "baseline"]


def mean_nll(row: dict, start: int) -> float:
    """Mean NLL per token over the positions >= start of a row with position buckets."""
    from ..evaluation.perplexity.buckets import nll_from
    found = nll_from(row, start)
    if found is None:
        raise ValueError(f"a {row['length']}-token row has no position buckets at {start}; rerun its cells")
    return found[0] / found[1]


def arm_values(ppl: list[dict], ret: list[dict], free_short: float | None, rlengths: list[int],
               pairs=DEFAULT_PAIRS) -> list[tuple[str, float | None]]:
    """The cells of a run's line as (text, number): perplexity per length, the change at the
    shortest length, NLL past L minus own sliding, then accuracy per (task, haystack, length)."""
    from ..evaluation.retrieval.plots import by_length
    from ..evaluation.retrieval.stats import rate_text
    trained = int(ppl[0]["trained_length"])
    truncate = {int(r["length"]): r for r in ppl if r["protocol"] == "truncate"}
    longest, short = max(truncate), min(truncate)
    # the sliding baseline exists only at lengths past L: a grid within L has no "past L" column
    base = next((r for r in ppl if r["protocol"] == "baseline" and int(r["length"]) == longest), None)
    out: list[tuple[str, float | None]] = [(f"{truncate[n]['perplexity']:.2f}", truncate[n]["perplexity"])
                                           for n in sorted(truncate)]
    change = 100 * (truncate[short]["perplexity"] / free_short - 1) if free_short else None
    out.append((f"{change:+.1f} %" if change is not None else "—", change))
    past = None if base is None else mean_nll(truncate[longest], trained) - mean_nll(base, trained)
    out.append(("—" if past is None else f"{past:+.3f}", past))
    for task, hay in pairs:
        found = {n: (k, t) for n, k, t in by_length(
            [r for r in ret if r.get("task", "single_needle") == task and haystack_name(r) == hay])}
        out += [(rate_text(*found[n]), found[n][0] / found[n][1]) if n in found else ("not run", None)
                for n in rlengths]
    return out


def arm_line(name: str, ppl: list[dict], ret: list[dict], free_short: float | None, rlengths: list[int],
             pairs=DEFAULT_PAIRS) -> str:
    """The run's line of the side-by-side table (markdown)."""
    cells = [text for text, _ in arm_values(ppl, ret, free_short, rlengths, pairs)]
    return "| " + " | ".join([label(name), *cells]) + " |"


def seed_spread(names: list[str], values: dict[str, list], head: list[str]) -> list[str]:
    """Per fine-tuned arm with several seeds: the largest minus the smallest value of each column."""
    lines = []
    for arm in ("docs", "mix"):
        runs = [n for n in names if n.partition("-seed")[0] == arm]
        if len(runs) < 2:
            continue
        parts = []
        for i, column in enumerate(head[1:]):
            nums = [values[n][i][1] for n in runs]
            if all(v is not None for v in nums):
                parts.append(f"{column} {max(nums) - min(nums):.3g}")
        lines.append(f"Seeds of {LABELS[arm]} ({', '.join(runs)}) differ by (largest - smallest): "
                     + "; ".join(parts) + " (retrieval: accuracy).")
    return lines


def report(args, names: list[str], plots: bool = True) -> Path:
    """report.md and (plots) its two plots in args.out, from the runs `names` that are done;
    `args`: the experiment's settings as `arms.check_grid` leaves them (task_list, haystack_list,
    depths, trials, sequential, look, bar, factor, eval_document)."""
    from ..evaluation.shared.results import format_length
    names = [n for n in names if (args.out / n / "done.json").exists()]
    if not names:
        raise ValueError(f"no finished arm in {args.out}: nothing to report")
    data = {n: (stored(args.out / n, "perplexity"), stored(args.out / n, "retrieval")) for n in names}
    pairs = [(t, h) for t in args.task_list for h in args.haystack_list]
    ppl0 = data[names[0]][0]
    lengths = sorted({int(r["length"]) for r in ppl0 if r["protocol"] == "truncate"})
    rlengths = sorted({int(r["length"]) for n in names for r in data[n][1]})
    trained = format_length(int(ppl0[0]["trained_length"]))
    free_short = next((r["perplexity"] for r in data["free"][0] if r["protocol"] == "truncate"
                       and int(r["length"]) == lengths[0]), None) if "free" in data else None
    columns = ([f"retrieval {format_length(n)} [Wilson 95 %]" for n in rlengths] if pairs == DEFAULT_PAIRS
               else [f"{t}, {h} {format_length(n)} [Wilson 95 %]" for t, h in pairs for n in rlengths])
    head = (["arm"] + [f"ppl {format_length(n)}" for n in lengths]
            + [f"ppl {format_length(lengths[0])} vs training-free",
               f"NLL past {trained} minus own sliding ({format_length(lengths[-1])})"] + columns)
    default = pairs == DEFAULT_PAIRS and not args.sequential
    what = (f"the retrieval suite's single-needle task (depths {args.depths}, {args.trials} trials a cell)"
            if default else
            f"the retrieval suite's tasks {', '.join(args.task_list)} in the haystacks "
            f"{', '.join(args.haystack_list)} (depths {args.depths}, "
            + (f"sequential trials: looks of {args.look} a depth, at most {args.trials}, bar {args.bar:g}"
               if args.sequential else f"{args.trials} trials a cell") + "; accuracy pooled over the depths)")
    lines = ["# Fine-tuning for the extended context: three arms", "",
             f"Each arm's checkpoint as saved (YaRN s={args.factor:g} in its config), on `{args.eval_document}` "
             f"(held out of training) and {what}. Made by `python benchmarks/finetune_retrieval.py` (settings in each "
             "arm's done.json).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    values = {n: arm_values(*data[n], free_short, rlengths, pairs) for n in names}
    lines += ["| " + " | ".join([label(n), *(text for text, _ in values[n])]) + " |" for n in names]
    spread = seed_spread(names, values, head)
    lines += [""] + spread if spread else []
    if plots:
        draw(args, names, data, pairs, default, lengths)
    lines += ["", "![retrieval by arm](retrieval_arms.png)", "",
              "![loss by position by arm](loss_by_position_arms.png)", ""]
    many = pairs != DEFAULT_PAIRS
    for n in names:
        lines += section(n, data[n], many)
    path = args.out / "report.md"
    path.write_text("\n".join(lines))
    return path


def draw(args, names, data, pairs, default: bool, lengths: list[int]) -> None:
    """retrieval_arms.png (the first task and haystack) and loss_by_position_arms.png."""
    from ..evaluation.retrieval.plots import plot_accuracy
    from ..evaluation.shared.results import plot_nll_by_position
    ppl0 = data[names[0]][0]
    first = [r for n in names for r in relabel(data[n][1], n) if (r.get("task", "single_needle"), haystack_name(r)) == pairs[0]]
    plot_accuracy(first, args.out / "retrieval_arms.png",
                  f"single needle by arm (YaRN s={args.factor:g}; {args.trials} trials a cell, depths {args.depths})"
                  if default else f"{pairs[0][0]} in {pairs[0][1]} by arm (YaRN s={args.factor:g}; depths {args.depths})")
    longest = [r for n in names for r in relabel(data[n][0], n) if int(r["length"]) == lengths[-1]]
    base = [r for r in ppl0 if r["protocol"] == "baseline" and int(r["length"]) == lengths[-1]]
    own = {label(n): r for n in names for r in data[n][0]   # each arm's own sliding window, below
           if r["protocol"] == "baseline" and int(r["length"]) == lengths[-1]}
    plot_nll_by_position(longest + base, args.out / "loss_by_position_arms.png",
                         f"loss by position on {args.eval_document}; dashed: the {label(names[0])} arm "
                         "read in sliding windows of its trained length; below: each arm minus its own",
                         baselines=own)


def section(name: str, data, many: bool) -> list[str]:
    """A run's `hf-posext eval` table and its retrieval rows with the answers given."""
    from ..evaluation.retrieval.stats import wilson
    from ..evaluation.shared.results import format_table
    lines = [f"## {name}", "", "```", format_table(data[0]), "```", "",
             "| " + ("task | haystack | " if many else "") + "length | depth | correct / trials | "
             "Wilson 95 % | answers given (first 60 characters) |", "|---|---|---|---|---|" + ("---|---|" if many else "")]
    for r in data[1]:
        k, t = int(r["correct"]), int(r["trials"])
        lo, hi = wilson(k, t)
        lines.append("| " + (f"{r.get('task')} | {haystack_name(r)} | " if many else "")
                     + f"{r['length']} | {r['depth']} | {k} / {t} | [{lo:.2f}, {hi:.2f}] | "
                     f"{outputs_text(r)[:60].replace('|', '/')} |")
    return lines + [""]

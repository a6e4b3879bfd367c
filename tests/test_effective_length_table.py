"""The effective-length table (benchmarks/effective_length_table.py, printed by `python
benchmarks/effective_length_4x.py table`) against references computed here from the stored JSON
directly: the shipped 2x recipe's seeds summed folder by folder, the 4x YaRN run's looks summed,
Wilson bounds by the formula; and, on rows planted in a temporary results folder, that only the
shipped recipe's setting is pooled. The script runs as a command (tests/test_layout.py)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _rates import rate
from _recipekit import ROOT, SUBPROCESS_ENV

pytestmark = pytest.mark.slow   # a subprocess that imports torch and reads every source
RESULTS = ROOT / "benchmarks" / "results"
SPAN09 = RESULTS / "finetune-retrieval-span09"
# the 2x recipe's setting before (1k-token windows): its six seeds, as docs/finetuning_mix.md names them
SEEDS = ["mix", *(f"mix-seed{s}" for s in range(1, 6))]
# the shipped 2x recipe's setting (2k-token windows, 1k examples): its seeds
SHIPPED = RESULTS / "finetune-retrieval-2k-windows"
CODE_MIX = RESULTS / "retrieval-code-mix"   # benchmarks/code_mix.py's rows: the 2x arms in held-out code


def table(*argv: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "effective_length_4x.py"), "table", *argv],
                          capture_output=True, text=True, cwd=ROOT, env=SUBPROCESS_ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def pooled_rate(rows: list[dict]) -> str:
    """The rate of rows pooled: their correct answers and trials summed."""
    return rate(sum(r["correct"] for r in rows), sum(r["trials"] for r in rows))


def row_of(text: str, method: str, setting: str) -> list[str]:
    found = [line for line in text.splitlines() if line.startswith(f"| {method} | {setting} |")]
    assert len(found) == 1, f"{method}, {setting}: {len(found)} rows in\n{text}"
    return [c.strip() for c in found[0].strip("|").split(" | ")]


def stored(path: Path) -> list[dict]:
    return json.loads(path.read_text())["rows"]


@pytest.fixture(scope="module")
def page_table() -> str:
    return table()


def past_l(row: dict) -> float:
    """Mean NLL on positions >= 8,192, from the row's own buckets."""
    edges, nll, tokens = (row[k] for k in ("bucket_edges", "bucket_nll", "bucket_tokens"))
    keep = [i for i, e in enumerate(edges[:len(nll)]) if e >= 8192]
    return sum(nll[i] for i in keep) / sum(tokens[i] for i in keep)


def past_l_by_seed(ppl: list[dict]) -> list[float]:
    """NLL past 8k of each seed's truncate minus its baseline row (file order)."""
    past = [past_l(r) for r in ppl]
    return [past[i] - past[i + 1] if ppl[i]["protocol"] == "truncate" else past[i + 1] - past[i]
            for i in range(0, len(ppl), 2)]


def test_the_2x_fine_tuned_cell_is_the_shipped_settings_seeds_summed(page_table):
    seeds = sorted(p.name for p in SHIPPED.glob("mix*") if (p / "done.json").exists())
    assert seeds[:2] == ["mix", "mix-seed1"]
    rows = [r for name in seeds for r in stored(SHIPPED / name / "retrieval" / "retrieval.json")
            if r["task"] == "niah_single" and r["length"] == 16384]
    noise = [r for r in rows if r["haystack"] == "noise"]
    cells = row_of(page_table, "YaRN", "2x (16k), fine-tuned")
    assert cells[2].startswith(f"{pooled_rate(noise)} (RULER's noise; five depths; float32; seeds 0")
    ppl = [r for name in seeds for r in stored(SHIPPED / name / "perplexity" / "perplexity.json") if r["length"] == 16384]
    # and the recipe's seeds asked in held-out code (code_mix.py's prose-2k folders)
    code = [r for f in CODE_MIX.glob("prose-2k*") for r in stored(f / "retrieval.json")]
    minutes = sum(float(r["seconds"]) for r in [*rows, *ppl, *code]) / 60
    assert cells[-1] == f"{minutes:.0f} min"
    by_seed = past_l_by_seed(ppl)
    assert f"= {sum(by_seed) / len(by_seed):+.3f} nats; mean over seeds 0" in cells[4]
    assert "--window 2048" in page_table and "--example-window 1024" in page_table


def test_the_2x_setting_before_is_listed_apart_its_six_seeds_summed(page_table):
    rows = [r for name in SEEDS for r in stored(SPAN09 / name / "retrieval" / "retrieval.json")
            if r["task"] == "niah_single" and r["haystack"] == "noise" and r["length"] == 16384]
    k, n = sum(r["correct"] for r in rows), sum(r["trials"] for r in rows)
    assert (k, n) == (59, 60)   # the figure docs/finetuning_mix.md gives
    line = next(x for x in page_table.splitlines()
                if x.startswith("- 2x, 1k-token windows, a quarter synthetic, 200 steps (the default before): "))
    assert f"niah_single {rate(k, n)} (RULER's noise; five depths; float32; seeds 0-5)" in line
    # wall time: the seconds of every row it reads (the seeds' retrieval, their grids, the 16k
    # perplexity pairs), summed here from the files
    grids = [r for name in ("mix-grid", "mix-seed1-grid") for r in stored(SPAN09 / name / "retrieval" / "retrieval.json")]
    ppl = [r for name in SEEDS for r in stored(SPAN09 / name / "perplexity" / "perplexity.json") if r["length"] == 16384]
    code = stored(CODE_MIX / "prose" / "retrieval.json")   # the setting asked in held-out code (code_mix.py)
    minutes = sum(float(r["seconds"]) for r in [*rows, *grids, *ppl, *code]) / 60
    assert f"; {minutes:.0f} min; commands (" in line
    by_seed = past_l_by_seed(ppl)
    assert f"= {sum(by_seed) / len(by_seed):+.3f} nats; mean over seeds 0-5" in line


def test_the_4x_cells_are_their_folders_summed(page_table):
    rows = stored(RESULTS / "effective-length-4x" / "noise" / "retrieval.json")   # one row per look and depth
    cell = row_of(page_table, "YaRN", "4x (32k), training-free")[2]
    assert cell.startswith(f"{pooled_rate(rows)} (RULER's noise; five depths; float32)")
    hamlet = stored(RESULTS / "effective-length-4x" / "hamlet" / "retrieval.json")
    # another haystack: its own part of the cell, its own depths counted
    ran = len({r["depth"] for r in hamlet})
    assert (f"; {pooled_rate(hamlet)} (Hamlet (held out); "
            f"{'five depths' if ran == 5 else f'{ran} of 5 depths ran'}; float32)") in cell
    dpe = stored(RESULTS / "effective-length-4x" / "noise-dpe" / "retrieval.json")
    assert row_of(page_table, "DPE", "4x (32k), training-free")[2].startswith(
        f"{pooled_rate(dpe)} (RULER's noise; "
        f"{len({r['depth'] for r in dpe})} of 5 depths ran")


def test_the_2x_training_free_cells_read_their_sources(page_table):
    rows = [r for r in stored(RESULTS / "retrieval-2x" / "retrieval.json") if r["task"] == "niah_single"
            and r["length"] == 16384]
    for method, name in (("yarn", "YaRN"), ("none", "unpatched")):
        mine = [r for r in rows if r["method"] == method]
        cell = row_of(page_table, name, "2x (16k), training-free")[2]
        assert cell.startswith(f"{pooled_rate(mine)} "
                               "(RULER's noise; depths 0.5, 1; float32)")
    side = [r for f in ("retrieval-16k", "retrieval-16k-more")
            for r in stored(RESULTS / "side-by-side" / f / "retrieval.json") if r["method"] == "dpe"
            and r["task"] == "niah_single"]
    assert row_of(page_table, "DPE", "2x (16k), training-free")[2] == \
        f"{pooled_rate(side)} (RULER's noise; five depths; bfloat16)"


def test_every_command_is_one_the_repository_gives_and_no_machine_path_shows(page_table):
    commands = re.findall(r"^\d+\. `(.+)`$", page_table, re.M)
    more = next(c for c in commands if "retrieval-16k-more" in c)
    assert more in (RESULTS / "side_by_side.md").read_text()   # typed there by hand: the two must not drift
    # no absolute path (a path starts after a space, a quote, `=`, `@` or a bracket)
    assert not re.search(r"(^|[\s`'\"=@(])/[\w.]", page_table, re.M) and str(ROOT) not in page_table


def test_only_the_shipped_setting_is_pooled(tmp_path):
    """Two seeds of the shipped setting in one folder are pooled; an arm of another setting beside
    them (min_span 0.5) is not, nor one whose examples were cut to another window (the recipe's
    settings otherwise); the setting before the shipped one is listed apart under its name; a cell
    with nothing stored reads "not run"."""
    template = stored(SPAN09 / "mix" / "retrieval" / "retrieval.json")[0]
    planted = {"ours/mix": (SHIPPED / "mix", [(3, 4), (1, 2)]), "ours/mix-seed1": (SHIPPED / "mix-seed1", [(2, 2)]),
               "other/mix": (RESULTS / "finetune-retrieval-share025-200" / "mix", [(0, 9)]),
               "cut/mix": (SHIPPED / "mix", [(0, 7)]), "before/mix": (SPAN09 / "mix", [(1, 3)])}
    for name, (source, cells) in planted.items():
        folder = tmp_path / f"finetune-retrieval-{name}"
        (folder / "retrieval").mkdir(parents=True)
        done = json.loads((source / "done.json").read_text())
        (folder / "done.json").write_text(json.dumps({**done, "example_window": 512} if name == "cut/mix" else done))
        rows = [{**template, "depth": d / 4, "correct": k, "trials": n, "seeds_list": ",".join(map(str, range(n))),
                 "seconds": 60.0} for d, (k, n) in enumerate(cells)]
        (folder / "retrieval" / "retrieval.json").write_text(json.dumps({"schema": 2, "rows": rows}))
    out = table("--results", str(tmp_path))
    cells = row_of(out, "YaRN", "2x (16k), fine-tuned")
    assert cells[2] == f"{rate(6, 8)} (RULER's noise; depths 0, 0.25; float32; seeds 0, 1 (seed 1: 1 of 2 depths))"
    assert cells[3:5] == ["not run", "not run"] and cells[-1] == "3 min"
    assert "--seeds 0,1" in out and "--window 2048" in out and "--example-window 1024" in out
    assert sum(line.startswith("|") for line in out.splitlines()) == 3   # head, rule, one row
    assert [line for line in out.splitlines() if line.startswith("- 2x")] == [
        f"- 2x, 1k-token windows, a quarter synthetic, 200 steps (the default before): niah_single {rate(1, 3)} "
        "(RULER's noise; depth 0; float32; seed 0); 1 min; commands (2)"]


def test_training_free_yarn_in_hamlet_is_its_own_cell_beside_noise(tmp_path):
    """YaRN s = 2's rows in held-out Hamlet (retrieval-2x-hamlet) read beside its noise rows in the
    training-free 2x row, each haystack its own count, with the command that made them."""
    template = next(r for r in stored(RESULTS / "retrieval-2x" / "retrieval.json")
                    if r["method"] == "yarn" and r["task"] == "niah_single" and r["length"] == 16384)
    rows = {"retrieval-2x": [(2, 2)], "retrieval-2x-hamlet": [(1, 2), (2, 2)]}
    for folder, cells in rows.items():
        (tmp_path / folder).mkdir()
        hay = "embedded:shakespeare/hamlet" if folder.endswith("hamlet") else "noise"
        planted = [{**template, "haystack": hay, "depth": d / 4, "correct": k, "trials": n,
                    "seeds_list": ",".join(map(str, range(n))), "seconds": 30.0} for d, (k, n) in enumerate(cells)]
        (tmp_path / folder / "retrieval.json").write_text(json.dumps({"schema": 2, "rows": planted}))
    out = table("--results", str(tmp_path))
    cell = row_of(out, "YaRN", "2x (16k), training-free")[2]
    assert cell == f"{rate(2, 2)} (RULER's noise; depth 0; float32); {rate(3, 4)} (Hamlet (held out); depths 0, 0.25; float32)"
    assert "--dataset embedded:shakespeare/hamlet --no-progress --out benchmarks/results/retrieval-2x-hamlet`" in out


def test_a_fine_tuned_arm_of_another_mix_is_not_pooled_with_the_recipe(tmp_path):
    """At 4x, the recipe's checkpoint and the one trained with distractor facts answer the same
    task in the same haystack: the recipe's row holds its own count alone, the arm's is listed
    below the table under its mix's name, never one sum."""
    source = RESULTS / "effective-length-4x" / "noise-finetuned-1k-windows-multi_key"
    template = stored(source / "retrieval.json")[0]
    for name, cells in {"noise-finetuned-multi_key": [(1, 2), (2, 2)],
                        "noise-finetuned-distractors-multi_key": [(0, 2), (2, 2), (1, 2)]}.items():
        folder = tmp_path / "effective-length-4x" / name
        folder.mkdir(parents=True)
        rows = [{**template, "depth": d / 4, "correct": k, "trials": n, "seconds": 60.0} for d, (k, n) in enumerate(cells)]
        (folder / "retrieval.json").write_text(json.dumps({"schema": 2, "rows": rows}))
    out = table("--results", str(tmp_path))
    assert row_of(out, "YaRN", "4x (32k), fine-tuned")[3] == f"{rate(3, 4)} (RULER's noise; 2 of 5 depths ran; float32; seed 0)"
    arms = [line for line in out.splitlines() if line.startswith("- 4x, 1k-token windows, mix with 3 distractor facts: ")]
    assert arms == [f"- 4x, 1k-token windows, mix with 3 distractor facts: multi_key {rate(3, 6)} (RULER's noise; 3 of 5 depths ran; "
                    "float32; seed 0); 3 min; commands (2)"]
    assert re.search(r"^2\. `hf-posext retrieval --tasks multi_key --model runs/cpu-smollm2-retrieval-4x-distractors/final ",
                     out, re.M)


def test_a_seed_that_ran_fewer_depths_is_named_in_the_pooled_cell(tmp_path):
    """Two seeds of the 4x recipe pooled, the second run at one depth only: the cell sums both and
    says the second seed's depths, lest the pool's "depths 0, 0.25" read as every seed's."""
    template = stored(RESULTS / "effective-length-4x" / "noise-finetuned" / "retrieval.json")[0]
    for name, cells in {"noise-finetuned": [(2, 2), (1, 2)], "noise-finetuned-seed1": [(2, 2)]}.items():
        folder = tmp_path / "effective-length-4x" / name
        folder.mkdir(parents=True)
        rows = [{**template, "depth": d / 4, "correct": k, "trials": n, "seconds": 60.0} for d, (k, n) in enumerate(cells)]
        (folder / "retrieval.json").write_text(json.dumps({"schema": 2, "rows": rows}))
    cell = row_of(table("--results", str(tmp_path)), "YaRN", "4x (32k), fine-tuned")[2]
    assert cell == f"{rate(5, 6)} (RULER's noise; 2 of 5 depths ran; float32; seeds 0, 1 (seed 1: 1 of 2 depths))"


def test_the_documents_control_is_not_the_recipe_s_perplexity(tmp_path):
    """The documents-only control's 32k perplexity is stored beside the recipe's; the table's 4x
    fine-tuned perplexity cell stays the recipe's own, read from the recipe's file alone."""
    source = RESULTS / "effective-length-4x" / "perplexity-finetuned" / "perplexity.json"
    rows = stored(source)
    truncate, baseline = (next(r for r in rows if r["protocol"] == p) for p in ("truncate", "baseline"))

    recipe = past_l(truncate) - past_l(baseline)
    control = [{**r, "bucket_nll": [x * 2 for x in r["bucket_nll"]]} if r is truncate else r
               for r in rows]   # a control whose whole-prompt reading costs twice as much
    for name, planted in {"perplexity-finetuned": rows, "perplexity-finetuned-documents": control}.items():
        (tmp_path / "effective-length-4x" / name).mkdir(parents=True)
        (tmp_path / "effective-length-4x" / name / "perplexity.json").write_text(json.dumps({"schema": 2, "rows": planted}))
    out = table("--results", str(tmp_path))
    cell = row_of(out, "YaRN", "4x (32k), fine-tuned")[4]
    assert f"= {recipe:+.3f} nats; seed 0)" in cell and cell.count("nats") == 1, cell
    # the control is listed apart, under its own name, with its own (doubled) reading
    doubled = past_l({**truncate, "bucket_nll": [x * 2 for x in truncate["bucket_nll"]]}) - past_l(baseline)
    control_line = next(line for line in out.splitlines() if line.startswith("- 4x, 1k-token windows, documents only, no synthetic examples: "))
    assert f"= {doubled:+.3f} nats; seed 0)" in control_line and abs(doubled - recipe) > 1


def test_the_code_cells_are_the_code_mix_folders_summed(page_table):
    """In held-out code, the 2x fine-tuned row sums the shipped recipe's code-mix seeds (prose-2k,
    prose-2k-seed<s>) and nothing trained with code in its mix; training-free YaRN reads the free arm."""
    mix = CODE_MIX
    code = "source code (torch/_refs/__init__.py, torch 2.13.0); depths 0.1, 0.5, 0.9; float32"
    prose = [r for f in sorted(mix.glob("prose-2k*")) if "noise" not in f.name for r in stored(f / "retrieval.json")
             if r["task"] == "niah_single"]
    assert len({r["model"] for r in prose}) >= 2   # seeds 0 and 1 at least
    seeds = ", ".join(str(s) for s in range(len({r["model"] for r in prose})))
    cell = row_of(page_table, "YaRN", "2x (16k), fine-tuned")[2]
    assert f"{pooled_rate(prose)} ({code}; seeds {seeds})" in cell
    free = [r for r in stored(mix / "free" / "retrieval.json") if r["method"] == "yarn"]
    assert f"{pooled_rate(free)} ({code})" in \
        row_of(page_table, "YaRN", "2x (16k), training-free")[2]
    with_code = [r for f in ("code-2k", "code-2k-seed1") for r in stored(mix / f / "retrieval.json")]
    listed = next(line for line in page_table.splitlines() if line.startswith("- 2x, code haystacks in the mix"))
    assert f"{pooled_rate(with_code)} ({code}; seeds 0, 1)" \
        in listed


@pytest.mark.parametrize("haystack, label, at_32k", [
    ("hamlet", "Hamlet (held out)", ("hamlet", "hamlet-finetuned")),
    ("noise", "RULER's noise", ("noise", "noise-finetuned")),
])
def test_a_reference_is_the_unpatched_model_within_l_asked_the_32k_cells_needles(page_table, haystack, label, at_32k):
    """The unpatched model at 8k in the haystack (what its 32k cells are read against): its line
    sums its rows, and its first trials ask the needles the 32k cells ask (the trial seeds fix them,
    not the length), so a needle missed at 32k can be looked up within L."""
    out = RESULTS / "effective-length-4x"
    reference = stored(out / f"{haystack}-reference" / "retrieval.json")
    assert {(r["method"], r["length"]) for r in reference} == {("none", 8192)}
    within = next(line for line in page_table.splitlines() if line.startswith("- unpatched: niah_single "))
    assert f"{pooled_rate(reference)} ({label}; five depths; float32)" in within

    def asked(rows: list[dict]) -> dict[tuple, list]:   # (depth, trial seed) -> the needle's answer
        return {(r["depth"], int(s)): a for r in rows for s, a in zip(r["seeds_list"].split(","), r["answers"])}
    within_l = asked(reference)
    for folder in at_32k:   # training-free YaRN s = 4; the recipe, seed 0
        found = asked(stored(out / folder / "retrieval.json"))
        assert found and all(within_l[key] == answer for key, answer in found.items()), folder


def test_the_searched_configs_rows_read_their_own_folders(page_table):
    """A searched `longrope` checkpoint is asked with no method (its rows say `none`), so its row
    must come from its own folders, not the unpatched model's: its 16k needles, and its Hamlet
    perplexity against the unpatched model's sliding window over the same tokens, worked here from
    the stored buckets."""
    sbs = RESULTS / "side-by-side"

    def nll(row: dict) -> float:
        return sum(row["bucket_nll"]) / sum(row["bucket_tokens"])
    for objective in ("needle", "perplexity"):
        name = f"{objective}-searched longrope"
        rows = [r for r in stored(sbs / f"retrieval-16k-search-{objective}" / "retrieval.json") if r["task"] == "niah_single"]
        assert row_of(page_table, name, "2x (16k), training-free")[2].startswith(
            f"{pooled_rate(rows)} (RULER's noise; five depths; bfloat16)")
        searched = next(r for r in stored(sbs / f"eval-32k-search-{objective}" / "perplexity.json")
                        if r["protocol"] == "truncate" and r["length"] == 32768)
        base = next(r for r in stored(sbs / "eval-32k" / "perplexity.json")
                    if r["protocol"] == "baseline" and r["length"] == 32768)
        ratio = math.exp(nll(searched) - nll(base))
        assert row_of(page_table, name, "4x (32k), training-free")[4].startswith(f"{ratio:.4f}x (Hamlet (held out), 32k")


def test_the_references_past_l_read_the_baseline_run_s_folder(tmp_path):
    """`run noise --method baseline` asks the unpatched model at 32k and the sliding 8k baseline in
    one folder: the first is the unpatched row's 4x cell (not dropped as the unpatched model asked
    beside a method within L), the second a row of its own."""
    template = next(r for r in stored(RESULTS / "effective-length-4x" / "noise" / "retrieval.json")
                    if r["length"] == 32768)
    cells = {"none": [(0, 2), (0, 2)], "baseline": [(0, 2), (2, 2)]}
    rows = [{**template, "method": m, "factor": 1.0, "factor_spec": "1", "knobs": "", "depth": d, "correct": k,
             "trials": n, "seeds_list": "0,1", "look": None, "seconds": 60.0, **({"window": 8192} if m == "baseline" else {})}
            for m, counts in cells.items() for d, (k, n) in zip((0.0, 1.0), counts)]
    folder = tmp_path / "effective-length-4x" / "noise-baseline"
    folder.mkdir(parents=True)
    (folder / "retrieval.json").write_text(json.dumps({"schema": 2, "rows": rows}))
    reference = tmp_path / "effective-length-4x" / "noise-reference"   # the grid's bar in noise
    reference.mkdir()
    (reference / "retrieval.json").write_text((RESULTS / "effective-length-4x" / "noise-reference" / "retrieval.json").read_text())
    out = table("--results", str(tmp_path))
    assert row_of(out, "unpatched", "4x (32k), training-free")[2] == f"{rate(0, 4)} (RULER's noise; 2 of 5 depths ran; float32)"
    sliding = row_of(out, "unpatched, sliding 8k window (each prompt cut to it)", "4x (32k), training-free")
    assert sliding[2] == f"{rate(2, 4)} (RULER's noise; 2 of 5 depths ran; float32)"
    assert sliding[4] == "1x (the sliding window itself)"   # the perplexity column's reference, by definition
    assert "--methods none --baseline --lengths 32k" in out
    # references, not settings with an effective length: neither is a row of the grid (with no
    # setting beside them here, the grid has no table at all)
    grid = out.partition("## Effective length by haystack")[2]
    assert "sliding 8k window" not in grid and "| unpatched, training-free |" not in grid


def test_self_extend_with_longlm_s_knobs_is_a_row_of_its_own(tmp_path):
    """`run noise --method self_extend-longlm` asks Self-Extend (its rows say `self_extend`) with
    other knobs in its own folder: its cells must not pool with the fitted knobs' run, and its
    row names the knobs and its command."""
    template = next(r for r in stored(RESULTS / "effective-length-4x" / "noise" / "retrieval.json")
                    if r["length"] == 32768)
    out_dir = tmp_path / "effective-length-4x"
    for folder, knobs, counts in (("noise-self_extend", "window=6144,group_size=auto", [(0, 2), (0, 2)]),
                                  ("noise-self_extend-longlm", "window=1024,group_size=8", [(2, 2), (1, 2), (2, 2)])):
        rows = [{**template, "method": "self_extend", "knobs": knobs, "depth": d, "correct": k, "trials": n,
                 "seeds_list": "0,1", "look": 1, "seconds": 600.0}
                for d, (k, n) in zip((0.0, 0.25, 0.5), counts)]
        (out_dir / folder).mkdir(parents=True)
        (out_dir / folder / "retrieval.json").write_text(json.dumps({"schema": 2, "rows": rows}))
    out = table("--results", str(tmp_path))
    assert row_of(out, "Self-Extend", "4x (32k), training-free")[2] == f"{rate(0, 4)} (RULER's noise; 2 of 5 depths ran; float32)"
    longlm = row_of(out, "Self-Extend, LongLM's knobs (window 1,024, G = 8)", "4x (32k), training-free")
    assert longlm[2] == f"{rate(5, 6)} (RULER's noise; 3 of 5 depths ran; float32)"
    assert "--methods self_extend --knobs self_extend:window=1024,self_extend:group_size=8" in out


def test_the_longlm_variant_s_perplexity_reads_its_own_folder(tmp_path):
    """`perplexity --method self_extend-longlm` stores the variant's 32k row and the unpatched
    model's sliding 8k window in one folder: its cell is exp(mean NLL difference), whole and past
    L, worked here from the stored buckets (the side-by-side's 32k rows planted as that folder)."""
    rows = stored(RESULTS / "side-by-side" / "eval-32k" / "perplexity.json")
    truncate = next(r for r in rows if r["method"] == "self_extend" and r["protocol"] == "truncate")
    baseline = next(r for r in rows if r["protocol"] == "baseline" and r["length"] == 32768)
    folder = tmp_path / "effective-length-4x" / "perplexity-self_extend-longlm"
    folder.mkdir(parents=True)
    (folder / "perplexity.json").write_text(json.dumps({"schema": 2, "rows": [truncate, baseline]}))

    def whole(row: dict) -> float:
        return sum(row["bucket_nll"]) / sum(row["bucket_tokens"])
    cell = row_of(table("--results", str(tmp_path)), "Self-Extend, LongLM's knobs (window 1,024, G = 8)",
                  "4x (32k), training-free")[4]
    assert cell.startswith(f"{math.exp(whole(truncate) - whole(baseline)):.4f}x (Hamlet (held out), 32k, bfloat16; "
                           f"past L {math.exp(past_l(truncate) - past_l(baseline)):.4f}x)"), cell

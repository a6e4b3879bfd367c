"""The effective length by haystack (benchmarks/effective_length_grid.py, printed by `python
benchmarks/effective_length_4x.py table`), on rows planted in a temporary results folder: the bar
is the unpatched model's accuracy within L less 0.1, worked out here by hand from the planted
counts; a length cleared counts only when every shorter one of the grid is, a cell short of five
depths leaves the reading open, a whole cell that misses caps it. The script runs as a command
(tests/test_layout.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _rates import rate
from _recipekit import ROOT, SUBPROCESS_ENV

pytestmark = pytest.mark.slow   # a subprocess that imports torch
FOUR_X = ROOT / "benchmarks" / "results" / "effective-length-4x"


def template(folder: str) -> dict:
    return json.loads((FOUR_X / folder / "retrieval.json").read_text())["rows"][0]


def plant(root: Path, folder: str, source: str, length: int, cells: list[tuple[int, int]], **fields) -> None:
    """`cells` (correct, trials) at depths 0, 0.25, ... into results/effective-length-4x/<folder>,
    each row the source folder's first with `fields` set."""
    out = root / "effective-length-4x" / folder
    out.mkdir(parents=True)
    rows = [{**template(source), **fields, "length": length, "depth": d / 4, "correct": k, "trials": n,
             "seeds_list": ",".join(map(str, range(n))), "seconds": 60.0} for d, (k, n) in enumerate(cells)]
    (out / "retrieval.json").write_text(json.dumps({"schema": 2, "rows": rows}))


def grid_rows(root: Path) -> dict[tuple[str, str, str], list[str]]:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "effective_length_4x.py"), "table",
                           "--results", str(root)], capture_output=True, text=True, cwd=ROOT, env=SUBPROCESS_ENV,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    text = done.stdout.split("## Effective length by haystack", 1)[1]
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in text.splitlines()
             if line.startswith("| ") and not line.startswith("| haystack")]
    return {(c[0], c[1], c[2]): c[3:] for c in cells}


def test_the_recipe_clears_each_length_up_to_the_first_it_has_no_whole_cell_for(tmp_path):
    """Noise: the base 8/10 within L, so the bar is 0.7; the recipe 10/10 at 8k and 7/10 at 16k (equal
    to the bar: cleared), four depths only at 32k: at least 16k, open at 32k. YaRN s = 4, 6/10 at
    32k and nothing shorter: below 32k, open from 8k."""
    plant(tmp_path, "noise-reference", "noise-reference", 8192, [(0, 2), (2, 2), (2, 2), (2, 2), (2, 2)])
    plant(tmp_path, "noise-finetuned-8k", "noise-finetuned", 8192, [(2, 2)] * 5)
    plant(tmp_path, "noise-finetuned-16k", "noise-finetuned", 16384, [(2, 2), (2, 2), (1, 2), (2, 2), (0, 2)])
    plant(tmp_path, "noise-finetuned", "noise-finetuned", 32768, [(2, 2)] * 4)
    plant(tmp_path, "noise", "noise", 32768, [(0, 2), (1, 2), (2, 2), (1, 2), (2, 2)])
    rows = grid_rows(tmp_path)
    recipe = rows[("RULER's noise", "niah_single", "YaRN, the 4x recipe (fine-tuned)")]
    assert recipe == ["0.70 (8/10 - 0.1)", rate(10, 10), rate(7, 10), f"{rate(8, 8)} (4 of 5 depths)",
                      "at least 16k (2x); open: no five-depth cell at 32k", ""]
    yarn = rows[("RULER's noise", "niah_single", "YaRN s = 4, training-free")]
    assert yarn == ["0.70 (8/10 - 0.1)", "not run", "not run", rate(6, 10),
                    "below 32k (32k misses the bar); open: no five-depth cell at 8k",
                    "missed (accuracy 0.60, lower bound 0.31)"]
    assert len(rows) == 2   # the reference is the bar, not a row of its own; no multi_key without its reference


def test_multi_key_reads_against_its_own_reference(tmp_path):
    """multi_key: the base 4/10 within L (bar 0.3), the recipe 4/10 at 32k only: open from 8k, its
    fixed target (0.8, no lower bound) missed; niah_single's reference is not multi_key's."""
    plant(tmp_path, "noise-reference", "noise-reference", 8192, [(2, 2)] * 5)
    plant(tmp_path, "noise-reference-multi_key", "noise-reference", 8192, [(0, 2), (1, 2), (0, 2), (1, 2), (2, 2)],
          task="multi_key")
    plant(tmp_path, "noise-finetuned-seed2-multi_key", "noise-finetuned-seed2-multi_key", 32768,
          [(0, 2), (1, 2), (0, 2), (1, 2), (2, 2)])
    rows = grid_rows(tmp_path)
    assert list(rows) == [("RULER's noise", "multi_key", "YaRN, the 4x recipe (fine-tuned)")]
    assert rows[list(rows)[0]] == ["0.30 (4/10 - 0.1)", "not run", "not run", rate(4, 10),
                                   "open: no five-depth cell at 8k", "missed (accuracy 0.40 vs 0.8)"]


def test_a_miss_at_a_shorter_length_stops_the_reading_though_a_longer_one_clears(tmp_path):
    """Hamlet: base 6/10 (bar 0.5); the recipe 8/10 at 8k, 4/10 at 16k (misses), 10/10 at 32k: its
    effective length is 8k, and the fixed target at 32k is met on its own."""
    plant(tmp_path, "hamlet-reference", "hamlet-reference", 8192, [(0, 2), (2, 2), (0, 2), (2, 2), (2, 2)])
    plant(tmp_path, "hamlet-finetuned-8k", "hamlet-finetuned", 8192, [(0, 2), (2, 2), (2, 2), (2, 2), (2, 2)])
    plant(tmp_path, "hamlet-finetuned-16k", "hamlet-finetuned", 16384, [(0, 2), (0, 2), (2, 2), (0, 2), (2, 2)])
    plant(tmp_path, "hamlet-finetuned", "hamlet-finetuned", 32768, [(2, 2)] * 5)
    recipe = grid_rows(tmp_path)[("Hamlet (held out)", "niah_single", "YaRN, the 4x recipe (fine-tuned)")]
    assert recipe[0] == "0.50 (6/10 - 0.1)"
    assert recipe[4:] == ["8k (1x); 16k misses the bar", "met"]


def test_the_unpatched_cells_a_method_s_run_asks_within_l_are_not_a_second_reference(tmp_path):
    """YaRN s = 4's fixed grid at 8k stores the unpatched model's cells beside its own (retrieval
    always asks it): they repeat the reference's needles, so the bar stays the reference's alone
    (8/10, not 8/10 + 2/10) and the 8k cell is YaRN's (10/10)."""
    plant(tmp_path, "noise-reference", "noise-reference", 8192, [(0, 2), (2, 2), (2, 2), (2, 2), (2, 2)])
    yarn = template("noise")
    plant(tmp_path, "noise-8k", "noise-reference", 8192, [(0, 2), (0, 2), (0, 2), (0, 2), (2, 2)])
    rows = json.loads((tmp_path / "effective-length-4x" / "noise-8k" / "retrieval.json").read_text())["rows"]
    rows += [{**r, "method": "yarn", "factor": yarn["factor"], "factor_spec": yarn["factor_spec"], "correct": 2}
             for r in rows]
    (tmp_path / "effective-length-4x" / "noise-8k" / "retrieval.json").write_text(json.dumps({"schema": 2, "rows": rows}))
    plant(tmp_path, "noise", "noise", 32768, [(2, 2)] * 5)
    assert grid_rows(tmp_path)[("RULER's noise", "niah_single", "YaRN s = 4, training-free")][:4] == [
        "0.70 (8/10 - 0.1)", rate(10, 10), "not run", rate(10, 10)]


def yarn_rows(root: Path, folder: str, cells: list[tuple[int, int]], length: int, keep: bool = True) -> None:
    """Add YaRN s = 4 cells (depths 0, 0.25, ...) to a planted folder's rows (`keep`: its own rows too)."""
    path = root / "effective-length-4x" / folder / "retrieval.json"
    rows, yarn = json.loads(path.read_text())["rows"], template("noise")
    added = [{**rows[0], "method": "yarn", "factor": yarn["factor"], "factor_spec": yarn["factor_spec"], "length": length,
              "depth": d / 4, "correct": k, "trials": n, "seeds_list": ",".join(map(str, range(n)))}
             for d, (k, n) in enumerate(cells)]
    path.write_text(json.dumps({"schema": 2, "rows": (rows if keep else []) + added}))


def test_a_4x_setting_s_cell_at_16k_is_the_grid_s_not_the_2x_setting_s_row(tmp_path):
    """YaRN s = 4 at 16k is a cell of the 4x setting below 4L: the grid reads it; the table's
    "2x (16k), training-free" row is YaRN s = 2's and must not show it (no 2x source planted: no such row)."""
    plant(tmp_path, "noise-reference", "noise-reference", 8192, [(0, 2), (2, 2), (2, 2), (2, 2), (2, 2)])
    plant(tmp_path, "noise-16k", "noise", 16384, [(1, 2), (1, 2), (0, 2), (1, 2), (0, 2)])
    plant(tmp_path, "noise", "noise", 32768, [(2, 2)] * 5)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "effective_length_4x.py"), "table",
                           "--results", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=SUBPROCESS_ENV,
                          timeout=300)
    table = done.stdout.split("## Effective length by haystack", 1)[0]
    assert not [line for line in table.splitlines() if line.startswith("| YaRN | 2x (16k)")], table
    assert rate(3, 10) not in table
    assert grid_rows(tmp_path)[("RULER's noise", "niah_single", "YaRN s = 4, training-free")][1:4] == [
        "not run", rate(3, 10), rate(10, 10)]


def test_a_method_asked_beside_the_reference_is_counted_once_in_its_own_run_within_l(tmp_path):
    """Code's reference run asked YaRN s = 4 at 8k beside the unpatched model (seeds 0-3, two
    depths); YaRN's own fixed grid at 8k asks seeds 0 and 1 of the same needles: its 8k cell is
    its own run's (2/10), not that pooled with the reference's (2/18)."""
    plant(tmp_path, "code-reference", "code-reference", 8192, [(1, 4), (1, 4), (1, 4), (3, 4), (4, 4)], method="none")
    yarn_rows(tmp_path, "code-reference", [(0, 4), (0, 4)], 8192)
    plant(tmp_path, "code-8k", "code-reference", 8192, [(0, 2), (1, 2), (0, 2), (2, 2), (2, 2)], method="none")
    yarn_rows(tmp_path, "code-8k", [(0, 2), (0, 2), (0, 2), (0, 2), (2, 2)], 8192)
    plant(tmp_path, "code-16k", "code-reference", 16384, [(0, 2)] * 5, method="none")
    yarn_rows(tmp_path, "code-16k", [(1, 2)] * 5, 16384, keep=False)
    row = grid_rows(tmp_path)[("source code (torch/_refs/__init__.py, torch 2.13.0)", "niah_single",
                               "YaRN s = 4, training-free")]
    assert row[:3] == ["0.40 (10/20 - 0.1)", rate(2, 10), rate(5, 10)]
    assert row[4] == "below 8k (8k misses the bar)", row

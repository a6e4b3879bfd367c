"""`python benchmarks/side_by_side.py report --results DIR` (the side-by-side page; its 4x section
here) on hand-made rows: each ratio is the perplexity over a span / the sliding baseline's over the
same tokens, computed here from the bucket sums by hand; a step not run reads "not run"; searches
of different budgets say so."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
L, TARGET = 8192, 32768                        # the script's 4x length of the embedded model
EDGES = [0, 8192, 16384, 24576, 32768]
N = 8192                                       # tokens in each bucket


def _row(method: str, nll: list[float], protocol: str = "truncate", data: str = "abc") -> dict:
    return {"method": method, "protocol": protocol, "length": TARGET, "trained_length": L, "factor": 4.0,
            "bucket_edges": EDGES, "bucket_nll": nll, "bucket_tokens": [N] * 4, "nll": sum(nll),
            "tokens": 4 * N, "data_hash": data, "dtype": "bfloat16", "seconds": 10.0, "model": "tiny",
            "dataset": "embedded:shakespeare/hamlet", "docs": 1, "window": L, "stride": 512}


def _write(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / name).write_text(json.dumps({"rows": rows}))


@pytest.mark.slow
def test_the_4x_section_reads_every_method_and_says_what_was_not_run(tmp_path):
    results = tmp_path / "results"
    out = results / "side-by-side"
    _write(out / "eval-32k", "perplexity.json", [
        _row("none", [8000.0] * 4, "baseline"), _row("yarn", [8800.0, 8800.0, 9600.0, 9600.0]),
        _row("cope", [8000.0] * 4, data="other text")])
    _write(out / "eval-32k-search-needle", "perplexity.json", [_row("none", [8000.0, 8000.0, 10400.0, 8800.0])])
    needle = out / "search-needle-32k"
    needle.mkdir()
    (needle / "search_log.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"kind": "settings", "settings": {"objective": "needle", "algorithm": "evolution", "proxy_length": 1024}},
        {"kind": "seed", "method": "yarn", "nll": 1.5, "elapsed": 60},
        {"kind": "candidate", "generation": 1, "nll": 1.25, "elapsed": 120}]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "side_by_side.py"), "report", "--results", str(results)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert proc.returncode == 0, proc.stderr
    page = (results / "side_by_side.md").read_text()
    text = page[page.index("## At 32k"):page.index("## Commands")]
    cells = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[3:6] for line in text.splitlines()
             if line.startswith("| ") and " | " in line}
    ratio = lambda a, b, n: f"{math.exp((a - b) / n):.4f}"   # noqa: E731   exp(mean NLL difference)
    # within L: the first bucket; past L: the other three
    assert cells["yarn (s = 4)"] == [ratio(8800, 8000, N), ratio(28000, 24000, 3 * N), ratio(36800, 32000, 4 * N)]
    assert cells["search, objective=needle"] == [ratio(8000, 8000, N), ratio(27200, 24000, 3 * N),
                                                 ratio(35200, 32000, 4 * N)]
    assert cells["cope"] == ["not compared (below)"] * 3 and "data_hash other text vs abc" in text
    for label in ("dpe (detected scales)", "search, objective=perplexity"):
        assert cells[label] == ["not run"] * 3
    assert "DPE's detection: not run." in text
    assert "different wall-time budgets" in text and "- perplexity: reused: searched by benchmarks/search.py tune4" in text
    searches = [line for line in text.splitlines() if line.startswith("| [needle]") or line.startswith("| perplexity")]
    assert searches[0].startswith("| perplexity | not run |  | 45 |")
    assert "| evolution | 1024 | 20 | 1 + 1 | 2.0 | 1.2500 | generation 1 | no |" in searches[1]
    assert (results / "side_by_side_32k.png").is_file()

"""benchmarks/side_by_side_4x.py (the side-by-side page's 4x section) on hand-made rows: each ratio is the
perplexity over a span / the sliding baseline's over the same tokens, computed here from the
bucket sums by hand; a step not run reads "not run"; searches of different budgets say so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
L, TARGET = 2048, 4096
EDGES = [0, 1024, 2048, 3072, 4096]


@pytest.fixture()
def report(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import side_by_side_4x
    import side_by_side_report
    return side_by_side_report, side_by_side_4x


def _row(method: str, nll: list[float], protocol: str = "truncate", data: str = "abc") -> dict:
    return {"method": method, "protocol": protocol, "length": TARGET, "trained_length": L, "factor": 2.0,
            "bucket_edges": EDGES, "bucket_nll": nll, "bucket_tokens": [1024] * 4, "nll": sum(nll),
            "tokens": 4096, "data_hash": data, "dtype": "bfloat16", "seconds": 10.0, "model": "tiny",
            "dataset": "embedded:shakespeare/hamlet", "docs": 1, "window": L, "stride": 512}


def _write(folder: Path, name: str, rows: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / name).write_text(json.dumps({"rows": rows}))


def test_the_4x_section_reads_every_method_and_says_what_was_not_run(report, tmp_path):
    rep, four = report
    out, page = tmp_path / "results" / "side-by-side", tmp_path / "results" / "page.md"
    _write(out / "eval-4k", "perplexity.json", [
        _row("none", [1000.0] * 4, "baseline"), _row("yarn", [1100.0, 1100.0, 1200.0, 1200.0]),
        _row("cope", [1000.0] * 4, data="other text")])
    _write(out / "eval-4k-search-needle", "perplexity.json", [_row("none", [1000.0, 1000.0, 1300.0, 1100.0])])
    needle = out / "search-needle-4k"
    needle.mkdir()
    (needle / "search_log.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"kind": "settings", "settings": {"objective": "needle", "algorithm": "evolution", "proxy_length": 1024}},
        {"kind": "seed", "method": "yarn", "nll": 1.5, "elapsed": 60},
        {"kind": "candidate", "generation": 1, "nll": 1.25, "elapsed": 120}]))
    setup = rep.Setup(tune="embedded:shakespeare/king-lear", held_out="embedded:shakespeare/hamlet",
                      target=TARGET, knobs="", tasks="", depths="", dpe_file="dpe-4k-bf16.json", commands="",
                      searches=(rep.Search("needle", needle, 20),
                                rep.Search("perplexity", tmp_path / "elsewhere", 45, "reused from elsewhere")))
    text = "\n".join(four.section_4x(out, page, setup))
    cells = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[3:6] for line in text.splitlines()
             if line.startswith("| ") and " | " in line}
    ratio = lambda a, b, n: f"{math.exp((a - b) / n):.4f}"   # noqa: E731   exp(mean NLL difference)
    assert cells["yarn (s = 2)"] == [ratio(2200, 2000, 2048), ratio(2400, 2000, 2048), ratio(4600, 4000, 4096)]
    assert cells["search, objective=needle"] == [ratio(2000, 2000, 2048), ratio(2400, 2000, 2048),
                                                 ratio(4400, 4000, 4096)]
    assert cells["cope"] == ["not compared (below)"] * 3 and "data_hash other text vs abc" in text
    for label in ("dpe (detected scales)", "search, objective=perplexity"):
        assert cells[label] == ["not run"] * 3
    assert "DPE's detection: not run." in text
    assert "different wall-time budgets" in text and "- perplexity: reused from elsewhere." in text
    searches = [line for line in text.splitlines() if line.startswith("| [needle]") or line.startswith("| perplexity")]
    assert searches[0].startswith("| perplexity | not run |  | 45 |")
    assert "| evolution | 1024 | 20 | 1 + 1 | 2.0 | 1.2500 | generation 1 | no |" in searches[1]
    assert (tmp_path / "results" / "page_4k.png").is_file()

"""The result record (hf_posext/evaluation/shared/record.py): keys from declared identity fields
only, schema-versioned files read through one migration, `RowStore.update`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hf_posext.evaluation import RetrievalGrid, ResultsStore, read_rows
from hf_posext.evaluation.shared.grid import plan_jobs
from hf_posext.evaluation.shared.record import SCHEMA_VERSION, RecordError, answers_text, outputs_text
from _evalkit import tiny_model

REPO = Path(__file__).resolve().parents[1]


def _keys(model, cells):
    return [j.key for j in plan_jobs(model, cells, {"dtype": "float32"}, lambda c: [c.length])]


def test_a_new_column_leaves_every_key_as_it_was():
    model = tiny_model()
    cells = RetrievalGrid(["yarn"], [64], depths=[0.5], trials=2).cells(64)
    cells = [dataclasses.replace(c, extra={**c.extra, "data_hash": "abc"}) for c in cells]
    before = _keys(model, cells)
    with_column = [dataclasses.replace(c, columns={"note": "a field added later"}) for c in cells]
    assert _keys(model, with_column) == before
    # a declared identity field does re-key: the key is not blind to what it declares
    other = [dataclasses.replace(c, extra={**c.extra, "depth": 0.25}) for c in cells]
    assert set(_keys(model, other)).isdisjoint(before)


def test_an_undeclared_cell_setting_is_refused_not_silently_keyed():
    cells = RetrievalGrid(["yarn"], [64], depths=[0.5], trials=2).cells(64)
    odd = [dataclasses.replace(cells[0], extra={**cells[0].extra, "temperature": 0.7})]
    with pytest.raises(RecordError, match="temperature.*not declared"):
        _keys(tiny_model(), odd)


def test_a_version_1_file_reads_as_lists_and_is_written_back_versioned(tmp_path):
    row = {"key": "k", "method": "yarn", "length": 64, "protocol": "retrieval", "correct": 1,
           "accuracy": 0.5, "answers": "12/34 56", "outputs": "12 and 34 | 7"}
    (tmp_path / "retrieval.json").write_text(json.dumps({"rows": [row]}))
    (got,) = read_rows(tmp_path / "retrieval.json")
    assert got["answers"] == [["12", "34"], ["56"]] and got["outputs"] == ["12 and 34", "7"]
    assert answers_text(got) == "12/34 56" and outputs_text(got) == "12 and 34 | 7"
    with ResultsStore(tmp_path, "retrieval", resume=True) as store:   # resuming writes it at the new schema
        store.update("k", decision="above")
    data = json.loads((tmp_path / "retrieval.json").read_text())
    assert data["schema"] == SCHEMA_VERSION and data["rows"][0]["decision"] == "above"
    assert data["rows"][0]["outputs"] == ["12 and 34", "7"]


def test_a_newer_schema_is_refused_with_the_fix(tmp_path):
    (tmp_path / "perplexity.json").write_text(json.dumps({"schema": SCHEMA_VERSION + 1, "rows": []}))
    with pytest.raises(RecordError, match="upgrade hf_posext"):
        read_rows(tmp_path / "perplexity.json")


def test_every_committed_results_file_carries_the_schema_and_reads():
    found = 0
    for path in sorted((REPO / "benchmarks" / "results").rglob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("rows"), list) and \
                all(isinstance(r, dict) and "key" in r for r in data["rows"]):
            assert data.get("schema") == SCHEMA_VERSION, path
            rows = read_rows(path)
            assert all(isinstance(r["outputs"], list) for r in rows if "outputs" in r), path
            found += 1
    assert found > 50


def test_no_store_is_probed_and_no_field_is_joined():
    """A store's API is its protocol (no hasattr probing), and no stored field is a joined string."""
    for path in (REPO / "hf_posext").rglob("*.py"):
        text = path.read_text()
        assert "hasattr(store" not in text, path
        assert '" | ".join(" ".join(t.split())' not in text or path.name == "record.py", path

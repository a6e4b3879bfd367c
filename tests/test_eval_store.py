"""ResultsStore's writes and RowsView's refusal to write (the grid's two RowStore kinds)."""


import pytest

from hf_posext.evaluation.shared.store import ResultsStore, RowsView
from hf_posext.evaluation.shared.record import read_rows


def test_store_refuses_a_second_row_with_the_same_key_and_reorders_on_disk(tmp_path):
    with ResultsStore(tmp_path, "rows") as store:
        for key in ("a", "b", "c"):
            store.add({"key": key})
        with pytest.raises(KeyError, match="duplicate result for b"):
            store.add({"key": "b"})
        store.reorder(["c", "a"])   # rows not named keep their place before the named ones
    assert [r["key"] for r in read_rows(tmp_path / "rows.json")] == \
        ["b", "c", "a"]


def test_rows_view_reads_but_refuses_writes():
    view = RowsView([{"key": "a", "x": 1}])
    assert view.has("a") and view.get("a")["x"] == 1 and not view.has("b")
    for write in (lambda: view.add({"key": "b"}), lambda: view.reorder(["a"])):
        with pytest.raises(RuntimeError, match="read-only"):
            write()

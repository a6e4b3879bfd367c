"""The reader table (hf_posext/portability/readers.py): one id per reader, one printed name per
id, and every name `check`, `export` and the doctor print derived from that table."""

import re
from dataclasses import replace
from pathlib import Path

import pytest

from hf_posext import cli
from hf_posext.commands.check import _tiny_checkpoint
from hf_posext.portability import measured, readers
from hf_posext.portability.exporting import TARGETS
from hf_posext.portability.verdicts import check

MISTRAL = {"beta_fast": 128, "beta_slow": 2, "mscale_coefficient": 0.07}


def test_every_reader_id_has_exactly_one_name():
    ids = [r.id for r in readers.READERS]
    names = [r.name for r in readers.READERS]
    assert len(set(ids)) == len(ids) == len(set(names)), (ids, names)
    assert readers.IDS == tuple(ids)
    assert set(ids).isdisjoint(names)   # an id is never a printed name, so neither passes as the other
    for r in readers.READERS:
        assert re.fullmatch(r"[a-z0-9-]+", r.id), r.id
        assert readers.get(r.id) is r and readers.name(r.id) == r.name
    with pytest.raises(KeyError, match="vllm-07b12f1"):
        readers.get("vLLM 07b12f1")   # a display name is not a key


def test_targets_and_verdicts_come_from_the_table(tmp_path):
    assert TARGETS == readers.targets() + ("gguf",)
    assert sorted(i for t in readers.targets() for i in readers.of_target(t)) == sorted(readers.IDS)
    verdicts = check(_tiny_checkpoint(tmp_path / "linear", "linear", {}))
    assert [v.reader for v in verdicts] == list(readers.IDS)
    assert [v.name for v in verdicts] == [r.name for r in readers.READERS]


def test_measured_releases_name_readers_of_the_table():
    for reader, release in measured.releases().items():
        assert reader in readers.IDS and release
    for cell in measured.load()["cells"]:
        assert cell["reader"] in measured.releases(), cell


def _shown(r: readers.Reader) -> str:
    """The column `check` prints for reader `r`, from the table's fields alone."""
    release = measured.releases().get(r.id)
    if r.target == "transformers":
        return r.name
    if release is None:
        return f"{r.name} (re-derived, not run)"
    if r.measured_as:
        return f"{r.engine} ({r.measured_as} {release}, measured)"
    return f"{r.engine} {release} (measured)"


def test_printed_names_come_from_the_table(tmp_path, monkeypatch, capsys):
    """Rename every reader in the table: `check`'s columns, the doctor's `affects` and `export`'s
    verdict lines print the new names (none is spelled anywhere else)."""
    path = _tiny_checkpoint(tmp_path / "yarn", "yarn", MISTRAL)
    renamed = {r.id: replace(r, name=f"<{r.name}>", engine=f"<{r.engine}>") for r in readers.READERS}
    monkeypatch.setattr(readers, "_BY_ID", renamed)

    assert cli.main(["check", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    columns = [line.strip() for line in lines[1:1 + len(renamed)]]
    for line, r in zip(columns, renamed.values()):
        assert line.startswith(_shown(r)), (line, _shown(r))
    affects = next(line for line in lines if "affects:" in line)
    vllm = renamed[readers.VLLM_07B12F1.id]
    assert f"{vllm.name} ({vllm.engine} {measured.releases()[vllm.id]})" in affects, affects

    assert cli.main(["export", str(path), str(tmp_path / "out"), "--target", "vllm"]) == 0
    out = capsys.readouterr().out.splitlines()[1:]
    assert len(out) == len(renamed)
    for line, r in zip(out, renamed.values()):
        assert line.strip().startswith(f"{r.name} "), (line, r.name)


def test_no_reader_name_is_spelled_outside_the_table():
    """Code compares ids: the readers' printed names are written in readers.py only."""
    root = Path(__file__).resolve().parents[1] / "hf_posext"
    names = [r.name for r in readers.READERS if " " in r.name]   # the ones no engine name shares
    found = [(str(p.relative_to(root)), n) for p in root.rglob("*.py") if p.name != "readers.py"
             for n in names if f'"{n}"' in p.read_text()]
    assert not found, found

"""The result record: what a stored row of each protocol is, which of its fields make its key,
and how a results file is read and written. Every reader (the library, the CLI, benchmarks,
tests) goes through `read_rows`; every writer through `rows_text`.

A row's key is a digest of the run identity (`identity.run_identity`), the cell's method, factor,
knobs, length and protocol, and the cell settings its protocol declares as identity below:
nothing else. A new column (a result, a note, a timing) therefore never re-keys stored rows;
a new cell setting that should re-key them must be declared here, and a cell carrying an
undeclared setting is refused (`identity_settings`), so nothing enters or leaves a key unseen.

Schema versions (the `schema` field of every results file):
    1  files written before the field existed: a retrieval row's `answers` as one string (each
       trial's accepted answers joined by "/", trials by " "), `outputs` as each trial's text cut
       to 60 characters and joined by " | ";
    2  `answers` a list (per trial, the list of accepted answers), `outputs` a list of the
       trials' whole texts. Version-1 rows are read through `_migrate_1` (their cut texts stay
       cut: only the split is recovered).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class RecordType:
    """One protocol's record: the cell settings that are part of its key (`identity`), the
    result columns every stored row carries (`results`, checked on read) and the columns
    stored as JSON lists (`lists`; the CSV view writes them as JSON text)."""

    name: str
    identity: tuple[str, ...]
    results: tuple[str, ...]
    lists: tuple[str, ...] = ()


# Every row, whatever its protocol: what the grid, the tables and the plots read.
ROW_FIELDS = ("method", "length", "protocol")
# The sliding-window baseline: the unpatched model reading only its own trained window. Perplexity
# stores it as protocol `baseline` of method `none`; retrieval as rows of this method, whose prompts
# were cut to the window (`RetrievalGrid.baseline`), so they never pool with the full prompt's.
BASELINE = "baseline"

PERPLEXITY = RecordType("perplexity", identity=("window", "chunk_size", "stride", "eval_tokens"),
                        results=("perplexity",))
# `window`: the sliding-window baseline's cells only (its prompts cut to the window), absent elsewhere
RETRIEVAL = RecordType("retrieval", identity=("task", "haystack", "depth", "trials", "seeds_list",
                                              "layout_seeds", "data_hash", "window"),
                       results=("correct", "accuracy", "answers", "outputs"), lists=("answers", "outputs"))
# The passkey is the retrieval suite's single-needle task on the noise haystack: the same record,
# read by its tables through `factor_spec` and `depth` as well.
PASSKEY = RecordType("passkey", identity=RETRIEVAL.identity,
                     results=("factor_spec", "depth", "accuracy", "answers", "outputs"), lists=RETRIEVAL.lists)
# The recipe's evaluation stores perplexity rows under `results`, the baseline under `baseline`.
RECORDS = {r.name: r for r in (PERPLEXITY, RETRIEVAL, PASSKEY)}
RECORD_OF_PROTOCOL = {"truncate": PERPLEXITY, "sliding": PERPLEXITY, "baseline": PERPLEXITY,
                      "retrieval": RETRIEVAL}


class RecordError(ValueError):
    """A results file or a cell that does not fit its record; the message says what to do."""


def identity_settings(protocol: str, settings: dict) -> dict:
    """The cell settings that enter a key: every one must be declared by the protocol's record."""
    record = RECORD_OF_PROTOCOL.get(protocol)
    if record is None:
        raise RecordError(f"protocol {protocol!r} has no result record; declare it in "
                          "hf_posext/evaluation/shared/record.py.")
    undeclared = sorted(set(settings) - set(record.identity))
    if undeclared:
        raise RecordError(f"cell setting(s) {', '.join(undeclared)} of protocol {protocol!r} are not "
                          f"declared in the {record.name} record: declare them as identity (they "
                          "re-key stored rows) or pass them as columns (Cell.columns).")
    return dict(settings)


def record_for(path: Path) -> RecordType | None:
    """The record a results file holds, from its name (`retrieval.json`, `perplexity.json`, ...);
    None for the recipe's files, which hold perplexity rows under other names."""
    return RECORDS.get(Path(path).stem)


def _split_answers(text: str) -> list[list[str]]:
    return [trial.split("/") for trial in str(text).split(" ")] if str(text) else []


def _migrate_1(row: dict) -> dict:
    """A version-1 row as version 2: the joined answer and output strings as lists."""
    if isinstance(row.get("answers"), str):
        row = {**row, "answers": _split_answers(row["answers"])}
    if isinstance(row.get("outputs"), str):
        row = {**row, "outputs": str(row["outputs"]).split(" | ")}
    return row


def migrate(data: object, where: str = "results file") -> list[dict]:
    """The rows of a parsed results file, at the current schema version."""
    if isinstance(data, list):          # never written by hf_posext, but a plain list of rows
        raise RecordError(f"{where} is not a hf_posext results file (a bare list, no 'rows').")
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise RecordError(f"{where} is not a hf_posext results file (no 'rows'); move it away or "
                          "choose another --out.")
    version = data.get("schema", 1)
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise RecordError(f"{where} has schema version {version!r}; this hf_posext reads 1 to "
                          f"{SCHEMA_VERSION}: upgrade hf_posext to read it.")
    rows = data["rows"]
    if version == 1:
        rows = [_migrate_1(r) if isinstance(r, dict) else r for r in rows]
    return rows


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a results file, migrated to the current schema. Lock-free: a writer replaces
    the file atomically, so a reader sees either the old whole file or the new one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such results file.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RecordError(f"{path} is damaged ({err}); move it away or choose another --out.") from None
    return migrate(data, str(path))


def rows_text(rows: list[dict]) -> str:
    """A results file's text: the schema version and the rows."""
    return json.dumps({"schema": SCHEMA_VERSION, "rows": rows}, indent=1, default=str) + "\n"


def outputs_text(row: dict, width: int = 60) -> str:
    """A retrieval row's answers as tables show them: each trial's text with its whitespace
    collapsed, cut to `width` characters, joined by " | " (what version-1 files stored)."""
    return " | ".join(" ".join(str(t).split())[:width] for t in row["outputs"])


def answers_text(row: dict) -> str:
    """A retrieval row's expected answers as one line: per trial joined by "/", trials by " "."""
    return " ".join("/".join(a) for a in row["answers"])

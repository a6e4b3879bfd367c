"""Results files: `<out>/<name>.json` (the source of truth) and `<out>/<name>.csv` (a view).

- One writer per folder: `<out>/.<name>.lock` is held (with `filelock`, the lock library
  transformers and huggingface_hub already use) for the store's life; a second run on the same
  `--out` is refused at once, naming the holder's pid.
- Every write is atomic (temporary file, fsync, `os.replace`), after every finished cell, so a
  run killed at any moment leaves complete files holding every finished row.
- Damaged files are refused or repaired with a one-line message: a JSON that does not parse, or
  a row without `key`, is refused (nothing is guessed); a CSV that disagrees with the JSON (e.g.
  cut mid-line) is rewritten from the JSON.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Protocol

from filelock import FileLock, Timeout

from ...portability.atomic import atomic_write, create_new
from ...errors import ConfigError
from .record import ROW_FIELDS, RecordError, migrate, record_for, rows_text

_IDENTITY_FIELDS = ("model_fingerprint", "dtype", "device", "attn_implementation", "data_hash",
                    "versions")


class RowStore(Protocol):
    """What the grid (`grid.run_grid`) reads and writes: rows keyed by `row["key"]`.
    `ResultsStore` persists them; `RowsView` is the read-only copy a non-writing rank holds."""

    rows: list[dict]

    def has(self, key: str) -> bool: ...

    def get(self, key: str) -> dict: ...

    def add(self, row: dict, flush: bool = True) -> None: ...

    def update(self, key: str, **columns) -> None:
        """Set `columns` on the stored row of `key` (e.g. a sequential look's decision) and persist."""

    def reorder(self, keys: list[str]) -> None: ...


class ResultsError(ConfigError):
    """A results folder that cannot be used as asked; the message says why and what to do."""


def _check_row(path: Path, i: int, row: dict) -> None:
    """A stored row without what the grid, tables and plots read (record.py: every row's fields and
    its record's results) is refused on load, not met as a KeyError after new cells were computed."""
    record = record_for(path)
    needed = ROW_FIELDS + (record.results if record is not None else ())
    missing = [f for f in needed if f not in row]
    if not missing and (isinstance(row["length"], bool) or not isinstance(row["length"], int)):
        missing = ["length (a whole number)"]
    if missing:
        raise ResultsError(f"{path}: row {i} (key {row['key']}) has no {', '.join(missing)} (an "
                           "older hf_posext's row format, or edited by hand); delete that row to "
                           "recompute it, move the file away, or choose another --out.")


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise ResultsError(f"{path} is a symbolic link; hf_posext never writes through one (it "
                           "would overwrite the file it points to). Remove it, or choose another --out.")


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return f.read()
    except FileNotFoundError:
        return None


def check_out_dir(out: str | Path) -> Path:
    """Create `out` (and its parents) and prove it writable, before anything expensive runs."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ResultsError(f"--out {out} is a file, not a folder; choose a folder.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test.{os.getpid()}"
        create_new(probe).close()
        probe.unlink()
    except OSError as err:
        raise ResultsError(f"--out {out}: cannot write there ({err.strerror or err}); choose a "
                           "writable folder.") from None
    return out


def csv_text(rows: list[dict]) -> str:
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for r in rows:   # lists (a retrieval row's answers and outputs) as JSON text, whole
        writer.writerow({k: ("" if v is None else json.dumps(v) if isinstance(v, list) else v)
                         for k, v in r.items()})
    return buf.getvalue()


class ResultsStore:
    """Rows keyed by `row["key"]`, persisted to `<out>/<name>.json` and `.csv`.

    `resume=False` refuses a folder that already holds results; `resume=True` loads them. The
    lock is taken in the constructor and released by `close()` (or at process exit)."""

    def __init__(self, out_dir: str | Path, name: str, resume: bool = False, lock: bool = True):
        self.out = check_out_dir(out_dir)
        self.json_path = self.out / f"{name}.json"
        self.csv_path = self.out / f"{name}.csv"
        self.rows: list[dict] = []
        self._lock = None
        if lock:
            pid_file = self.out / f".{name}.lock.pid"
            for path in (self.out / f".{name}.lock", pid_file):
                _refuse_link(path)   # filelock opens its file with O_TRUNC, following links
            self._lock = FileLock(str(self.out / f".{name}.lock"), timeout=0)
            try:
                self._lock.acquire()
            except Timeout:
                holder = (_read(pid_file) or "?").strip() if pid_file.is_file() else "?"
                raise ResultsError(f"another run (pid {holder[:12]}) is writing to {self.out}; "
                                   "wait for it to finish or choose another --out.") from None
            atomic_write(pid_file, str(os.getpid()))
        try:
            self._load(resume)
        except Exception:
            self.close()
            raise
        self._index = {r["key"]: r for r in self.rows}

    def _load(self, resume: bool) -> None:
        if not (self.json_path.exists() or self.csv_path.exists()):
            return
        if not resume:
            raise ResultsError(f"{self.out} already holds {self.json_path.stem} results. Pass "
                               "--resume to keep its finished cells, or choose another --out.")
        if not self.json_path.exists():
            raise ResultsError(f"{self.csv_path} has no {self.json_path.name} beside it (the JSON "
                               "is the source of truth); move the CSV away to start afresh.")
        try:
            data = json.loads(self.json_path.read_text(encoding="utf-8"))
            rows = migrate(data, str(self.json_path))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ResultsError(f"{self.json_path} is damaged ({err}); move it away or choose "
                               "another --out.") from None
        except RecordError as err:
            raise ResultsError(str(err)) from None
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or not row.get("key"):
                raise ResultsError(f"{self.json_path}: row {i} has no 'key' (edited by hand?); "
                                   "fix or remove that row, or choose another --out.")
            _check_row(self.json_path, i, row)
        self.rows = rows
        if data.get("schema") is None:
            self.flush()   # an older file: written once at the current schema (record.py)
        if _read(self.csv_path) != csv_text(rows):
            atomic_write(self.csv_path, csv_text(rows))
            print(f"note: {self.csv_path.name} was missing or damaged; rewritten from "
                  f"{self.json_path.name}.", file=sys.stderr)

    def close(self) -> None:
        if self._lock is not None and self._lock.is_locked:
            (self.out / f".{self.json_path.stem}.lock.pid").unlink(missing_ok=True)
            self._lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def has(self, key: str) -> bool:
        return key in self._index

    def get(self, key: str) -> dict:
        return self._index[key]

    def add(self, row: dict, flush: bool = True) -> None:
        if row["key"] in self._index:
            raise KeyError(f"duplicate result for {row['key']}")
        self.rows.append(row)
        self._index[row["key"]] = row
        if flush:
            self.flush()

    def update(self, key: str, **columns) -> None:
        self._index[key].update(columns)
        self.flush()

    def reorder(self, keys: list[str]) -> None:
        """Rows of `keys` in that order, after the rows of earlier runs that are not among them."""
        wanted = set(keys)
        self.rows = [r for r in self.rows if r["key"] not in wanted] + \
                    [self._index[k] for k in keys if k in self._index]
        self.flush()

    def flush(self) -> None:
        atomic_write(self.json_path, rows_text(self.rows))
        atomic_write(self.csv_path, csv_text(self.rows))

    def identity_conflicts(self, identity: dict) -> list[str]:
        """Run-identity fields on which stored rows differ from `identity` (the CLI refuses to
        resume into a folder holding another run's results)."""
        return [f for f in _IDENTITY_FIELDS if f in identity and
                any(f in r and r[f] != identity[f] for r in self.rows)]


class RowsView:
    """The rows of a store as seen by a rank that does not write (distributed evaluation)."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        self._index = {r["key"]: r for r in rows}

    def has(self, key: str) -> bool:
        return key in self._index

    def get(self, key: str) -> dict:
        return self._index[key]

    def add(self, row: dict, flush: bool = True) -> None:
        raise RuntimeError("RowsView is read-only: only rank 0 writes results (run_grid).")

    def update(self, key: str, **columns) -> None:
        raise RuntimeError("RowsView is read-only: only rank 0 writes results (run_grid).")

    def reorder(self, keys: list[str]) -> None:
        raise RuntimeError("RowsView is read-only: only rank 0 writes results (run_grid).")

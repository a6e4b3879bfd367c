"""Evaluation text: tokenise documents once and cache the token ids on disk.

Documents come from `hf_posext.data.documents` (the loader shared with the fine-tuning recipe); this
module adds the tokenizer fingerprint, the on-disk token cache and the selection of documents
long enough for a grid.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ...data.documents import Document, TextSource, keep_long, load_documents, looks_like_path
from ...errors import CheckpointError

__all__ = ["Document", "TextSource", "TokenCache", "TokenizedDocs", "load_documents",
           "looks_like_path", "scored_bytes", "select_documents", "tokenizer_fingerprint"]


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


def cache_home() -> Path:
    """hf_posext's cache: $HF_POSEXT_CACHE, else $XDG_CACHE_HOME/hf_posext (~/.cache/hf_posext)."""
    return Path(os.environ.get("HF_POSEXT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hf_posext"))


def default_cache_dir() -> Path:
    return cache_home() / "tokens"


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
            try:   # allow_pickle=False (numpy's default): a cache file can hold numbers only
                ids = np.load(path, allow_pickle=False)
            except (ValueError, OSError, EOFError) as err:
                raise CheckpointError(f"token cache file {path} is corrupted ({type(err).__name__}); "
                                      "delete it (it is rebuilt from the text) and rerun.") from None
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise CheckpointError(f"token cache file {path} holds {ids.dtype} of shape {ids.shape}, "
                                      "not token ids; delete it (it is rebuilt) and rerun.")
            return ids
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
    fingerprint: str            # hash of the selected ids: the "data" part of a result's identity
    names: list[str] = field(default_factory=list)


def select_documents(documents, cache: TokenCache, min_tokens: int, max_docs: int | None) -> TokenizedDocs:
    """The first `max_docs` documents (`Document`s or strings) with at least `min_tokens` tokens
    (the truncate protocol's rule: the same documents at every length). Raises when none is."""
    read: list = []

    def encoded():
        for doc in documents:
            text = doc.text if isinstance(doc, Document) else doc
            if isinstance(text, str) and text:
                read.append(doc)
                yield cache.encode(text)

    kept = keep_long(encoded(), min_tokens, max_docs)
    h = hashlib.sha256()
    for _, ids in kept:
        h.update(np.asarray(ids, dtype=np.int32).tobytes())
    names = [read[i].name if isinstance(read[i], Document) else f"doc{i}" for i, _ in kept]
    return TokenizedDocs([np.asarray(ids) for _, ids in kept], len(read), h.hexdigest()[:12], names)


def scored_bytes(tokenizer, docs) -> Callable[[int], int]:
    """n -> UTF-8 bytes of the text that tokens 1..n-1 of every document decode to: the tokens a
    length-n cell scores. Bits per byte = NLL / ln 2 / bytes compares models with different
    tokenizers (a tokenizer with longer tokens has fewer, harder tokens per byte)."""
    @functools.lru_cache(maxsize=None)
    def count(n: int) -> int:
        return sum(len(tokenizer.decode([int(t) for t in d[1:n]], skip_special_tokens=False,
                                        clean_up_tokenization_spaces=False).encode("utf-8"))
                   for d in docs)
    return count

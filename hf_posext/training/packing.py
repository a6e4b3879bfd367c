"""Tokenising and packing the training documents with `datasets.map` (the approach of
transformers' `run_clm.py` example), so the token stream is an Arrow file on disk, computed once by
the main process (`accelerator.main_process_first()`) and memory-mapped by every rank, instead of a
Python list of every token on every rank.

YaRN §4.1 packs documents into full-length sequences, each document wrapped in BOS ... EOS, so no
compute is spent on padding. As in `run_clm.py`'s `group_texts`, packing runs over batches of
`PACK_BATCH` documents and drops each batch's incomplete tail (the order of documents is kept).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..data.documents import keep_long
from ..evaluation.shared.data import tokenizer_fingerprint

PACK_BATCH = 1000


def cache_root() -> Path:
    """datasets' own cache directory (HF_DATASETS_CACHE), in a sub-folder of this project."""
    import datasets
    return Path(datasets.config.HF_DATASETS_CACHE) / "hf_posext_packed"


def packed_sequences(docs: Sequence, tokenizer, seq_len: int, bos_id: int | None, eos_id: int | None,
                     cache_dir: str | Path | None = None):
    """(sequences, names): a `datasets.Dataset` with one column `input_ids` of `seq_len` token ids
    per row, torch formatted, built from `docs` (objects with `.name` and `.text`), and the names of
    the documents it holds.

    Documents shorter than one window are left out first (long-context fine-tuning needs long
    documents: a window longer than a document would only see short documents glued together);
    raises when none is left. The result is cached under a fingerprint of (texts, tokenizer,
    seq_len, bos, eos): rerunning the recipe on the same data reads the Arrow file back.
    """
    import datasets
    from datasets.fingerprint import Hasher


    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    root.mkdir(parents=True, exist_ok=True)
    texts = [d.text for d in docs]
    key = Hasher.hash([Hasher.hash(texts), tokenizer_fingerprint(tokenizer), seq_len, bos_id, eos_id])
    raw = datasets.Dataset.from_dict({"name": [d.name for d in docs], "text": texts})

    def tokenize(batch):
        ids = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
        return {"ids": ids, "n": [len(x) for x in ids]}

    tokens = raw.map(tokenize, batched=True, remove_columns=["text"], desc="tokenizing",
                     cache_file_name=str(root / f"{key}-tokens.arrow"), new_fingerprint=f"{key}-t")
    # The shared rule (hf_posext.data.documents.keep_long) on the lengths only: no token list in Python.
    kept = keep_long((range(n) for n in tokens["n"]), seq_len, purpose="training window",
                     what="training document")
    long_docs = tokens.select([i for i, _ in kept]).remove_columns("n")
    prefix, suffix = [bos_id] if bos_id is not None else [], [eos_id] if eos_id is not None else []

    def pack(batch):
        stream = [tok for ids in batch["ids"] for tok in (prefix + ids + suffix)]
        n = len(stream) // seq_len
        return {"input_ids": [stream[i * seq_len:(i + 1) * seq_len] for i in range(n)]}

    packed = long_docs.map(pack, batched=True, batch_size=PACK_BATCH, remove_columns=["ids", "name"],
                           desc="packing", cache_file_name=str(root / f"{key}-packed.arrow"),
                           new_fingerprint=f"{key}-p")
    return packed.with_format("torch"), list(long_docs["name"])

"""Training and evaluation documents for the fine-tuning recipe.

- `recipe_documents`: the documents `data` names, read by the evaluation's loader
  (hf_posext.data.documents: the embedded Shakespeare plays, local files, or a Hub dataset
  through `datasets.load_dataset`, PG19 as in the PI and YaRN papers), as `Document(name, text)`.
- `split_holdout`: documents held out for evaluation are never trained on.
- `haystack_documents`: the other sources synthetic examples are built in (`data.synthetic.haystacks`),
  checked against the held-out documents too.
- `epoch_order`: the seeded order of the packed sequences in each epoch.
Tokenising and packing: `packing.py`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..data.documents import Document, TextSource, load_documents


def recipe_documents(data) -> list[Document]:
    """The documents of the recipe's `data` section (`DataConfig`), as a list: the evaluation's
    loader (`hf_posext.data.documents.load_documents`), its errors naming the recipe's keys."""
    source = TextSource(data.source, data.subset, data.split, data.text_column, column_flag="data.text_column")
    return list(load_documents(source, max_docs=data.max_documents, streaming=data.streaming))


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


def haystack_documents(haystacks: Sequence[str], held_out: Sequence[Document], training: str
                       ) -> dict[str, list[Document]]:
    """The documents of each source in `haystacks` other than `training` (the windows' own text),
    loaded now so a bad name fails before the model loads; none may hold a held-out text."""
    held = {d.text for d in held_out}
    out = {}
    for name in haystacks:
        if name == training:
            continue
        try:
            out[name] = list(load_documents(TextSource(name, split="train")))
        except (ValueError, FileNotFoundError) as err:
            raise ValueError(f"data.synthetic.haystacks: {name!r}: {err}") from None
        if held & {d.text for d in out[name]}:
            raise ValueError(f"data.synthetic.haystacks: {name!r} holds a document held out for evaluation "
                             "(data.eval_documents); use another source.")
    return out


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The shuffled order of `n` sequences in a given epoch; a pure function of (seed, epoch), so
    a resumed run sees exactly the batches an uninterrupted one would."""
    g = torch.Generator().manual_seed(seed * 7919 + epoch)
    return torch.randperm(n, generator=g).tolist()

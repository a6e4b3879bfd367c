"""The recipe's data mix (`data.synthetic`, hf_posext/training/synthetic.py): synthetic long-range
examples built from the training windows, seeded, in the configured share, with PoSE position ids
that keep the fact in the first chunk and put the question near the target length, never the
evaluation's needle wording or held-out text; and its bad inputs, refused before the model loads."""

from __future__ import annotations

import difflib
import math
import random
import re
import string

import pytest
import torch
import yaml

from _recipekit import char_tokenizer, format_pattern, load_finetune, make_assets, recipe_argv
from hf_posext.data.documents import Document
from hf_posext.evaluation.retrieval import TASKS, tasks
from hf_posext.training.packing import packed_sequences
from hf_posext.training.pose import PoseCollator, span_of
from hf_posext.training.recipe import prepare_data
from hf_posext.training.recipe_config import SyntheticConfig, config_from_dict, parse_args
from hf_posext.training.synthetic import FORMATS, mix_synthetic

finetune = load_finetune()
pytestmark = pytest.mark.usefixtures("one_thread")
WINDOW, TARGET = 256, 4096
WORDS = ["Horatio", "castle", "green", "silver", "thunder", "market", "night", "Elsinore", "raven"]


def wide_tokenizer():
    """One token per character, with capitals, digits and the formats' punctuation, decoding
    without spaces between characters (so the text of an example reads back as written)."""
    from tokenizers import decoders
    tok = char_tokenizer(string.ascii_letters + string.digits + " .,\n?:=")
    tok.backend_tokenizer.decoder = decoders.Fuse()
    return tok


@pytest.fixture(scope="module")
def tok():
    return wide_tokenizer()


@pytest.fixture(scope="module")
def packed(tok, tmp_path_factory):
    rng = random.Random(0)
    docs = [Document(f"d{i}", " ".join(rng.choice(WORDS) for _ in range(300))) for i in range(6)]
    seqs, _ = packed_sequences(docs, tok, WINDOW, 1, 2, cache_dir=tmp_path_factory.mktemp("mix"))
    return seqs


def _mix(packed, tok, tmp_path, seed=0, num_chunks=2, **over):
    return mix_synthetic(packed, tok, SyntheticConfig(**{"share": 0.5, **over}), seed=seed,
                         num_chunks=num_chunks, cache_dir=tmp_path)


def _synthetic_rows(mixed) -> list[tuple[int, dict]]:
    return [(i, mixed[i]) for i in range(len(mixed)) if mixed[i]["format"]]


# ------------------------------------------------------------------------------------ examples
def test_examples_hold_an_early_fact_document_text_and_the_question_at_the_end(packed, tok, tmp_path):
    mixed = _mix(packed, tok, tmp_path)
    rows = _synthetic_rows(mixed)
    assert rows and {r["format"] for _, r in rows} == set(FORMATS)
    for i, r in rows:
        ids, orig = r["input_ids"].tolist(), packed[i]["input_ids"].tolist()
        a, b, q, ans = (int(r[k]) for k in ("fact_start", "fact_end", "question_start", "answer_start"))
        assert len(ids) == WINDOW and 0 <= a <= WINDOW // 16 < b < q < ans < WINDOW
        fmt = FORMATS[r["format"]]
        fact = tok.decode(ids[a:b]).strip()
        # the fact is the format's sentence, its answer is the value written in it
        m = format_pattern(fmt.fact).fullmatch(fact)
        assert m, fact
        assert tok.decode(ids[ans:]) == fmt.answer.format(value=m["value"])
        assert tok.decode(ids[q:ans]).strip() == fmt.question.format(key=m["key"])
        if fmt.value == "digits":
            assert 4 <= len(m["value"]) <= 7 and m["value"].isdigit()
        # keys (and word values) are words of the window's own text
        assert m["key"] in WORDS and (fmt.value == "digits" or m["value"] in WORDS)
        # the rest is the window's document text, in order
        assert ids[:a] == orig[:a] and ids[b:q] == orig[a:a + q - b]


def test_the_mix_is_seeded(packed, tok, tmp_path):
    cols = ["input_ids", "fact_start", "answer_start"]
    first = _mix(packed, tok, tmp_path / "a", seed=3)
    again = _mix(packed, tok, tmp_path / "b", seed=3)
    other = _mix(packed, tok, tmp_path / "c", seed=4)
    same = all(torch.equal(first[i][c], again[i][c]) for i in range(len(first)) for c in cols)
    differs = any(not torch.equal(first[i][c], other[i][c]) for i in range(len(first)) for c in cols)
    assert same and differs


@pytest.mark.parametrize("share", [0.0, 0.2, 0.5, 1.0])
def test_the_share_of_synthetic_windows_is_respected(packed, tok, tmp_path, share):
    mixed = _mix(packed, tok, tmp_path, share=share, formats=["remember_kv", "word_pair"])
    rows = _synthetic_rows(mixed)
    assert len(mixed) == len(packed) and len(rows) == round(share * len(packed))
    assert {r["format"] for _, r in rows} <= {"remember_kv", "word_pair"}
    plain = [i for i in range(len(mixed)) if not mixed[i]["format"]]
    assert all(torch.equal(mixed[i]["input_ids"], packed[i]["input_ids"]) for i in plain)
    assert all(span_of(mixed[i]) is None for i in plain)


# ------------------------------------------------------------------------------------ positions
@pytest.mark.parametrize("num_chunks", [2, 3])
def test_positions_put_the_fact_in_the_first_chunk_and_the_question_near_the_target(packed, tok, tmp_path,
                                                                                     num_chunks):
    mixed = _mix(packed, tok, tmp_path, num_chunks=num_chunks)
    collator = PoseCollator(WINDOW, TARGET, num_chunks, seed=0, min_span=0.5)
    lasts = []
    for i, r in _synthetic_rows(mixed):
        span = span_of(r)
        for index in range(i, i + 40 * len(mixed), len(mixed)):   # the same row over 40 epochs
            pos = collator([r["input_ids"]], [index], [span])["position_ids"][0]
            assert bool((pos[1:] > pos[:-1]).all()) and int(pos[-1]) <= TARGET - 1
            assert torch.equal(pos[:span.fact_end], torch.arange(span.fact_end))   # first chunk, from 0
            tail = pos[span.question_start:]                                       # one contiguous chunk
            assert torch.equal(tail, torch.arange(int(tail[0]), int(tail[0]) + len(tail)))
            assert int((pos[1:] - pos[:-1] != 1).sum()) <= num_chunks - 1
            assert int(pos[-1]) >= math.ceil(0.5 * TARGET) - 1                    # min_span x target
            lasts.append(int(pos[-1]))
    # uniform over [T/2 - 1, T - 1]: the largest of many draws comes close to the target
    assert max(lasts) >= TARGET - TARGET // 50 and min(lasts) <= 0.6 * TARGET


def test_spanning_positions_refuse_a_layout_without_room_for_the_cuts():
    from hf_posext.training.pose import sample_spanning_position_ids
    with pytest.raises(ValueError, match="cannot cut 3 chunks"):      # one place for two cuts
        sample_spanning_position_ids(16, 64, 3, first_end=10, last_start=10, min_last=40)
    with pytest.raises(ValueError, match="shorter than the training window"):
        sample_spanning_position_ids(16, 8, 2, first_end=4, last_start=10, min_last=4)
    pos = sample_spanning_position_ids(16, 64, 3, first_end=10, last_start=11, min_last=63)
    assert pos[:10].tolist() == list(range(10)) and int(pos[-1]) == 63   # cuts at 10 and 11


def test_labels_are_the_answer_only_or_the_whole_window(packed, tok, tmp_path):
    mixed = _mix(packed, tok, tmp_path)
    (_i, r), plain = _synthetic_rows(mixed)[0], next(j for j in range(len(mixed)) if not mixed[j]["format"])
    span, ids = span_of(r), r["input_ids"]
    labels = PoseCollator(WINDOW, TARGET, 2)([ids, mixed[plain]["input_ids"]], [0, 1],
                                             [span, None])["labels"]
    assert bool((labels[0, :span.answer_start] == -100).all())
    assert torch.equal(labels[0, span.answer_start:], ids[span.answer_start:])
    assert torch.equal(labels[1], mixed[plain]["input_ids"])                 # documents: every token
    whole = PoseCollator(WINDOW, TARGET, 2, answer_only=False)([ids], [0], [span])["labels"]
    assert torch.equal(whole[0], ids)


# --------------------------------------------------------------------------- no evaluation text
TOKEN = re.compile(r"\w+|[^\w\s]")
# Tokens of an evaluation wording that may not appear together in a synthetic example: 3 would
# refuse "What is the", which any question may begin with.
RUN = 4


def _tokens(text: str) -> list[str]:
    return TOKEN.findall(text.lower())


def _grams(tokens, n: int) -> set[tuple]:
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def _template(text: str, others: list[str]) -> tuple:
    """`text`'s tokens, None where the same text of other seeds differs (a key, value or name)."""
    toks, fixed = _tokens(text), set(range(len(_tokens(text))))
    for other in others:
        blocks = difflib.SequenceMatcher(None, toks, _tokens(other), autojunk=False).get_matching_blocks()
        fixed &= {a + k for a, _, n in blocks for k in range(n)}
    return tuple(t if i in fixed else None for i, t in enumerate(toks))


def evaluation_wordings() -> list[tuple]:
    """Every retrieval task's head, needles and question as token templates, from seeded trials
    of each task in `tasks.TASKS` (the evaluation's single source of its formats, so a new task is
    covered without editing this test), and the noise haystack's text."""
    out = [tuple(_tokens(tasks.NOISE))]
    for task in TASKS.values():
        first, *others = [task.trial(seed) for seed in range(6)]
        out.append(_template(first.head, [t.head for t in others]))
        out.append(_template(first.question, [t.question for t in others]))
        for j, needle in enumerate(first.needles):
            out.append(_template(needle, [t.needles[min(j, len(t.needles) - 1)] for t in others]))
    return list(dict.fromkeys(out))


def evaluation_wording_in(text: str, wordings: list[tuple]) -> str | None:
    """The evaluation wording `text` uses, if any: RUN consecutive fixed tokens of one, or a whole
    template holding a slot (e.g. `VAR X = 12345.` with any name and value)."""
    toks = _tokens(text)
    grams = _grams(toks, RUN)
    for w in wordings:
        hit = next((g for g in _grams(w, RUN) if None not in g and g in grams), None)
        if hit:
            return " ".join(hit)
        # a template of slots and punctuation only (", _ .") would match any list: not a wording
        if None in w and any(t is not None and t[0].isalnum() for t in w):
            for i in range(len(toks) - len(w) + 1):
                if all(t is None or t == toks[i + k] for k, t in enumerate(w)):
                    return " ".join(t or "_" for t in w)
    return None


def test_the_evaluation_wordings_are_read_from_every_task():
    """The wordings above find each task's own needles and question at an unseen seed (so the
    check below can fail), and each needle has slots (the keys and values are not wording)."""
    wordings = evaluation_wordings()
    for task in TASKS.values():
        trial = task.trial(1234)
        for text in (trial.needles[0], trial.question):
            assert evaluation_wording_in(text, wordings), (task.name, text)
    assert evaluation_wording_in(tasks.RULER_NEEDLE.format(key="Horatio", value="4242"), wordings)
    assert evaluation_wording_in("VAR ELSIN = 777.", wordings)              # slots take any name
    assert not evaluation_wording_in("What is the code for Horatio? The code for Horatio is", wordings)


def test_no_synthetic_example_uses_the_evaluation_needles(packed, tok, tmp_path):
    wordings = evaluation_wordings()
    for fmt in FORMATS.values():
        for template in (fmt.fact, fmt.question, fmt.answer):
            text = template.format(key="Horatio", value="4242")
            assert evaluation_wording_in(text, wordings) is None, template
    for _, r in _synthetic_rows(_mix(packed, tok, tmp_path, share=1.0)):
        text = tok.decode(r["input_ids"].tolist())
        assert evaluation_wording_in(text, wordings) is None, text


def test_held_out_document_is_not_among_the_training_windows(tmp_path):
    assets = make_assets(tmp_path, archs=("llama",))
    cfg = config_from_dict({"model": {"name": str(assets / "llama")},
                            "data": {"source": str(assets / "docs"), "eval_documents": ["doc3"],
                                     "synthetic": {"share": 0.5}},
                            "training": {"seq_len": 128}, "pose": {"enabled": True},
                            "eval": {"lengths": [64]}})
    tokenizer = char_tokenizer()
    prepared = prepare_data(cfg, tokenizer, log=lambda *_: None)
    assert "doc3" not in prepared.train_names and prepared.eval_names == ["doc3"]
    assert sum(1 for i in range(len(prepared.sequences)) if prepared.sequences[i]["format"]) == \
        round(0.5 * len(prepared.sequences))
    stream = prepared.sequences[:]["input_ids"].flatten().tolist()
    windows = {tuple(stream[i:i + 24]) for i in range(len(stream) - 23)}
    held = [int(x) for x in prepared.eval_ids[0]]
    assert not any(tuple(held[i:i + 24]) in windows for i in range(len(held) - 23))
    trained = tokenizer((assets / "docs" / "doc4.txt").read_text(), add_special_tokens=False)["input_ids"]
    assert any(tuple(trained[i:i + 24]) in windows for i in range(0, len(trained) - 23, 8))


# ------------------------------------------------------------------------------------- config
def test_yaml_round_trip_and_flags(tmp_path):
    raw = {"data": {"synthetic": {"share": 0.25, "formats": ["word_pair", "code_sentence"],
                                  "min_span": 0.75, "loss": "window"}},
           "pose": {"enabled": True}}
    cfg = config_from_dict(raw)
    assert isinstance(cfg.data.synthetic, SyntheticConfig)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    again, _ = parse_args(["--config", str(path)])
    assert again == cfg and again.data.synthetic == SyntheticConfig(0.25, ["word_pair", "code_sentence"],
                                                                     0.75, "window")
    flagged, _ = parse_args(["--config", str(path), "--data.synthetic.share", "0.5",
                             "--data.synthetic.formats", "[remember_kv]"])
    assert (flagged.data.synthetic.share, flagged.data.synthetic.formats) == (0.5, ["remember_kv"])
    assert config_from_dict({}).data.synthetic.share == 0.0        # off unless asked for


# ---------------------------------------------------------------------------------- bad inputs
@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("mix_assets"), archs=("llama",))


@pytest.mark.parametrize("over,match", [
    ({"data__synthetic__share": "1.5"}, r"data.synthetic.share must be a fraction in \[0, 1\], got 1.5"),
    ({"data__synthetic__share": "-0.1"}, r"data.synthetic.share must be a fraction in \[0, 1\], got -0.1"),
    ({"data__synthetic__formats": "[pass_key]"}, r"unknown format\(s\) \['pass_key'\]; use some of"),
    ({"training__seq_len": "300", "model__factor": "4"},
     r"training.seq_len \(300\) is longer than the PoSE target \(256 = .*\); lower training.seq_len"),
    ({"training__seq_len": "32"}, r"'code_sentence' needs up to \d+ tokens .* more than the 32-token window"),
    ({"pose__num_chunks": "1"}, r"needs pose.num_chunks >= 2"),
])
def test_bad_mix_inputs_fail_in_one_line_before_the_model_loads(assets, tmp_path, recipe_model_forbidden, over, match):
    out = tmp_path / "bad"
    with pytest.raises(ValueError, match=match) as err:
        finetune.main(recipe_argv(assets, out, data__synthetic__share=over.pop("data__synthetic__share", "0.5"),
                                  **over))
    assert "\n" not in str(err.value)
    assert not (out / "train_log.csv").exists()


def test_recipe_trains_on_the_mix(assets, tmp_path, monkeypatch):
    """The whole recipe with every window synthetic: the loop hands each example's span to the
    collator, whose batches carry answer-only labels and positions past min_span x target."""
    batches = []
    call = PoseCollator.__call__

    def spy(self, examples, indices, spans=None):
        batch = call(self, examples, indices, spans)
        batches.append((spans, batch))
        return batch

    monkeypatch.setattr(PoseCollator, "__call__", spy)
    finetune.main(recipe_argv(assets, tmp_path / "run", data__synthetic__share="1.0", eval__enabled="false",
                              training__seq_len=128))
    assert len(batches) == 4                                   # 4 steps x batch 1
    for spans, batch in batches:
        span, = spans
        assert span is not None
        scored = int((batch["labels"] != -100).sum())
        assert 0 < scored == 128 - span.answer_start < 128     # only the answer is scored
        assert int(batch["position_ids"].max()) >= math.ceil(0.5 * 256) - 1   # factor 4 x 64
    cfg = yaml.safe_load((tmp_path / "run" / "config.json").read_text())
    assert cfg["data"]["synthetic"]["share"] == 1.0


def test_readme_mix_command_parses_and_validates():
    """recipes/README.md's data-mix command: its accelerate config exists and its recipe flags
    parse and validate (the tiny recipe run above trains with the same keys)."""
    import shlex
    from _recipekit import RECIPES, ROOT
    text = (RECIPES / "README.md").read_text()
    section = text[text.index("## Data mix"):text.index("### The experiment")]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    words = shlex.split(block)
    assert words[:2] == ["accelerate", "launch"] and (ROOT / words[3]).is_file()
    flags = words[words.index("recipes/finetune.py") + 1:]
    cfg, _ = parse_args([str(ROOT / w) if w.endswith(".yaml") else w for w in flags])
    assert cfg.data.synthetic.share == 0.5 and cfg.pose.enabled and cfg.data.eval_documents == ["hamlet"]

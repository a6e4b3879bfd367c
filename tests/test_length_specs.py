"""The trained length, the target length and log-n are specs like the other knobs (rope/knobs.py
TRAINED_LENGTH / TARGET_LENGTH, attention/units.py LOGN_SCALING), each checked once: every door
they come in by (RopeExtensionConfig, AttentionExtensionConfig, `patch` for our methods and for
transformers' llama3, a checkpoint's config.json) refuses the same bad value with the same words,
before anything is patched; the old keyword of the target length is refused, naming the new one."""

import json

import pytest

import hf_posext
from hf_posext import AttentionExtensionConfig, RopeExtensionConfig
from hf_posext.errors import ConfigError

from conftest import TRAINED, tiny_model

LLAMA3 = dict(low_freq_factor=1.0, high_freq_factor=4.0)


def _message(fn) -> str:
    with pytest.raises((TypeError, ValueError)) as err:
        fn()
    return str(err.value)


@pytest.mark.parametrize("bad", [0, -64, 64.5, 64.0, True, "4096"])
def test_every_door_refuses_a_bad_trained_length_in_the_same_words(bad):
    doors = {
        "RopeExtensionConfig": lambda: RopeExtensionConfig("yarn", 2.0, trained_length=bad),
        "AttentionExtensionConfig": lambda: AttentionExtensionConfig("rerope", bad),
        "patch yarn": lambda: hf_posext.patch(tiny_model(), "yarn", 2.0, trained_length=bad),
        "patch llama3": lambda: hf_posext.patch(tiny_model(), "llama3", 2.0, trained_length=bad,
                                                **LLAMA3),
    }
    said = {door: _message(fn) for door, fn in doors.items()}
    expected = f"trained_length must be a positive integer (a number of tokens), got {bad!r}"
    assert all(m == expected for m in said.values()), said


def test_a_trained_length_past_int32_is_refused():
    for fn in (lambda: RopeExtensionConfig("linear", 1.0, trained_length=2 ** 32),
               lambda: AttentionExtensionConfig("rerope", 2 ** 32)):
        assert "past 2,147,483,648 positions (int32)" in _message(fn)


def test_a_checkpoint_with_a_bad_trained_length_is_refused_by_the_same_spec(tmp_path):
    hf_posext.patch(tiny_model(), "llama3", 2.0, **LLAMA3).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    for layout in ("rope_scaling", "rope_parameters"):
        if isinstance(data.get(layout), dict):
            data[layout]["original_max_position_embeddings"] = 0
    (tmp_path / "config.json").write_text(json.dumps(data))
    # the file's key (transformers') named, then the one spec's words
    with pytest.raises(ConfigError, match=r"config.json rope original_max_position_embeddings=0: "
                                          r"trained_length must be a positive integer"):
        hf_posext.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("bad,says", [
    (-5, "target_length must be a positive integer (a number of tokens), got -5"),
    (10.5, "target_length must be a positive integer (a number of tokens), got 10.5"),
    (TRAINED // 2, f"target_length={TRAINED // 2} is shorter than the trained length {TRAINED}"),
    (2 ** 31 + 1, "(factor x trained length) is past 67,108,864 tokens (2^31 int32 positions, factor 1,048,576)"),
])
def test_the_target_length_is_checked_once_for_rope_and_attention_methods(bad, says):
    for fn in (lambda: hf_posext.patch(tiny_model(), "yarn", target_length=bad),
               lambda: hf_posext.patch(tiny_model(), "rerope", target_length=bad),
               lambda: AttentionExtensionConfig("leaky_rerope", TRAINED, leak="auto", target_length=bad)):
        assert says in _message(fn)


def test_the_target_length_sets_the_factor():
    model = hf_posext.patch(tiny_model(), "linear", target_length=4 * TRAINED)
    assert model.config.max_position_embeddings == 4 * TRAINED   # transformers' own key keeps its name


@pytest.mark.parametrize("call", [
    lambda: hf_posext.patch(tiny_model(), "yarn", max_position_embeddings=4 * TRAINED),
    lambda: hf_posext.patch(tiny_model(), "rerope", max_position_embeddings=4 * TRAINED),
])
def test_the_old_keyword_of_the_target_length_is_refused_naming_the_new_one(call):
    assert _message(call) == ("patch() has no keyword max_position_embeddings=: it is called "
                              f"target_length= here; pass target_length={4 * TRAINED}.")


@pytest.mark.parametrize("bad", [1, "true", 0.0])
def test_every_door_refuses_a_bad_logn_in_the_same_words(bad):
    model = tiny_model()
    said = {_message(lambda: hf_posext.patch(model, "yarn", 2.0, logn=bad)),
            _message(lambda: hf_posext.patch(model, "rerope", 2.0, logn=bad)),
            _message(lambda: AttentionExtensionConfig("rerope", TRAINED, logn=bad))}
    assert said == {f"logn must be True or False, got {bad!r}"}
    assert not hf_posext.is_patched(model)

"""The trained length, the target length and log-n are specs like the other knobs (rope/knobs.py
TRAINED_LENGTH / TARGET_LENGTH, attention/units.py LOGN_SCALING), each checked once: every door
they come in by (RopeExtensionConfig, AttentionExtensionConfig, `patch` for our methods and for
transformers' llama3, a checkpoint's config.json) refuses the same bad value with the same words,
before anything is patched. One name each, trained_length and target_length (--target-length):
transformers' names (original_max_position_embeddings, max_position_embeddings) and the old flag
--length are refused at every door naming ours, while config.json keeps transformers' rope key,
which transformers itself reads back."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posext
from hf_posext import AttentionExtensionConfig, RopeExtensionConfig
from hf_posext.errors import ConfigError
from hf_posext.evaluation.shared.inputs import parse_knobs
from hf_posext.rope.compat import IS_V5
from hf_posext.training.recipe_config import parse_args

from _badinputs import cli_refused, counted_loads
from conftest import TRAINED, VOCAB, tiny_model

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


# --- one name each: transformers' names are refused as inputs, and stay its keys on disk --------

OLD, NEW = "original_max_position_embeddings", "trained_length"   # transformers' rope key, ours
SAYS = f"it is called {NEW}= here; pass {NEW}=4096."


@pytest.mark.parametrize("door,call", [
    ("RopeExtensionConfig", lambda: RopeExtensionConfig("yarn", 2.0, **{OLD: 4096})),
    ("RopeExtensionConfig.from_dict", lambda: RopeExtensionConfig.from_dict({"method": "yarn", OLD: 4096})),
    ("AttentionExtensionConfig", lambda: AttentionExtensionConfig("rerope", **{OLD: 4096})),
    ("patch", lambda: hf_posext.patch(tiny_model(), "yarn", 2.0, **{OLD: 4096})),
    ("patch", lambda: hf_posext.patch(tiny_model(), "llama3", 2.0, **{OLD: 4096}, **LLAMA3)),
    ("patch", lambda: hf_posext.patch(tiny_model(), "rerope", 2.0, **{OLD: 4096})),
])
def test_the_old_name_of_the_trained_length_is_refused_by_the_api_naming_the_new_one(door, call):
    assert _message(call) == f"{door}() has no keyword {OLD}=: {SAYS}"


def test_the_old_name_of_the_target_length_is_refused_by_the_attention_config():
    assert _message(lambda: AttentionExtensionConfig("rerope", TRAINED, max_position_embeddings=4096)) == \
        "AttentionExtensionConfig() has no keyword max_position_embeddings=: it is called " \
        "target_length= here; pass target_length=4096."


def test_from_pretrained_refuses_the_old_names_before_any_weight_loads(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    for old, new in ((OLD, NEW), ("max_position_embeddings", "target_length")):
        with counted_loads() as loads:
            said = _message(lambda old=old: hf_posext.from_pretrained(str(tmp_path), "yarn", **{old: 4096}))
        assert said == f"from_pretrained() has no keyword {old}=: it is called {new}= here; pass {new}=4096."
        assert loads == []


def test_knobs_and_the_recipe_refuse_the_old_name_naming_the_new_one(tmp_path, capsys):

    assert parse_knobs(f"yarn:{NEW}=4096", ["yarn"]) == {"yarn": {NEW: 4096}}
    cli_refused(["eval", "--methods", "yarn", "--knobs", f"yarn:{OLD}=4096"], capsys,
                f"--knobs: there is no knob {OLD}: it is called {NEW} here; give {NEW}=4096. (rerun")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model:\n  method: yarn\n  knobs: {{{OLD}: 4096}}\n")
    with pytest.raises(ConfigError, match=f"^model.knobs: there is no knob {OLD}: it is called {NEW} here"):
        parse_args(["--config", str(recipe)])


@pytest.mark.parametrize("command", [["search", "--out", "x"], ["dpe-detect", "--out", "x.json"]])
def test_length_is_refused_naming_target_length(command, capsys):
    cli_refused([*command, "--length", "16k"], capsys,
                "there is no --length: the target length is --target-length here; pass --target-length 16k")
    cli_refused(command, capsys, "--target-length is required")


NATIVE_YARN = {"rope_type": "yarn", "factor": 4.0, OLD: TRAINED, "beta_fast": 32.0, "beta_slow": 1.0}


def _native(rope: dict):
    """A Llama of tiny_model's shape whose rope entry transformers itself holds (no hf_posext)."""
    layout = ({"rope_parameters": {"rope_theta": 10_000.0, **rope}} if IS_V5 else
              {"rope_scaling": dict(rope), "rope_theta": 10_000.0})
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, attn_implementation="eager",
                         max_position_embeddings=round(TRAINED * rope["factor"]), **layout)
    return config, LlamaForCausalLM(config).eval()


def _rope_entries(folder) -> tuple[list[dict], dict]:
    data = json.loads((folder / "config.json").read_text())
    return [data[k] for k in ("rope_parameters", "rope_scaling") if isinstance(data.get(k), dict)], data


def test_a_saved_extension_keeps_transformers_key_and_runs_as_transformers_reads_it(tmp_path):
    """config.json's rope dicts hold L under transformers' key (never ours); the reloaded model's
    frequencies and cos/sin scale are what transformers' own yarn function computes from a rope
    entry written by hand."""
    hf_posext.patch(tiny_model(), "yarn", 4.0).save_pretrained(tmp_path)
    ropes, data = _rope_entries(tmp_path)
    assert ropes and all(r[OLD] == TRAINED and NEW not in r for r in ropes)
    assert data["hf_posext"][NEW] == TRAINED and OLD not in data["hf_posext"]   # our own entry: ours
    rotary = hf_posext.from_pretrained(str(tmp_path)).model.rotary_emb
    inv_freq, scale = ROPE_INIT_FUNCTIONS["yarn"](_native(NATIVE_YARN)[0], None)
    torch.testing.assert_close(rotary.inv_freq, inv_freq, rtol=0, atol=0)
    assert rotary.attention_scaling == pytest.approx(scale, rel=1e-12)


def test_a_checkpoint_transformers_wrote_loads_re_extends_and_saves_its_key(tmp_path):
    _native(NATIVE_YARN)[1].save_pretrained(tmp_path / "native")
    model = hf_posext.from_pretrained(str(tmp_path / "native"))
    assert hf_posext.trained_length(model) == TRAINED      # read from transformers' key
    hf_posext.patch(model, "linear", 2.0)                   # replaces yarn, from L
    assert model.config.max_position_embeddings == 2 * TRAINED
    hf_posext.patch(model, "yarn", 8.0).save_pretrained(tmp_path / "again")
    ropes, _ = _rope_entries(tmp_path / "again")
    assert all((r[OLD], r["factor"]) == (TRAINED, 8.0) and NEW not in r for r in ropes)


def test_an_entry_written_before_the_rename_still_loads(tmp_path):
    """hf_posext's own entry held L under transformers' key before the rename: still read."""
    hf_posext.patch(tiny_model(), "ntk", 4.0).save_pretrained(tmp_path)   # plain RoPE + the entry
    data = json.loads((tmp_path / "config.json").read_text())
    data["hf_posext"][OLD] = data["hf_posext"].pop(NEW)
    (tmp_path / "config.json").write_text(json.dumps(data))
    model = hf_posext.from_pretrained(str(tmp_path))
    assert hf_posext.trained_length(model) == TRAINED
    spec = hf_posext.portability.portable.method_spec(model.config)
    assert (spec.method, spec.factor, spec.trained_length) == ("ntk", 4.0, TRAINED)

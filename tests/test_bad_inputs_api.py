"""Bad inputs to the Python API (the rule: tests/_badinputs.py): `patch` with every
method and each bad factor, on a model without RoPE, with bad method names, knobs and target
lengths; `from_pretrained` with bad arguments and hand-edited config.json files. Each is a
one-line error naming the problem before any weights load, and leaves the model unpatched."""

from __future__ import annotations

import json
import math

import pytest
from _badinputs import refused
from conftest import TRAINED, tiny_model
from transformers import GPT2Config, GPT2LMHeadModel

import hf_posext

pytestmark = pytest.mark.usefixtures("one_thread")

# (factor, what the message names); 1e308: test_bad_inputs_more's absurd factor
BAD_FACTORS = [(0.5, "0.5"), (0, "0"), (-2, "-2"), (math.nan, "nan"), (math.inf, "inf"), ("2", "'2'"),
               (True, "True"), ([2], "[2]")]


@pytest.mark.parametrize("factor,value", BAD_FACTORS, ids=[repr(f) for f, _ in BAD_FACTORS])
@pytest.mark.parametrize("method", hf_posext.METHODS)
def test_patch_refuses_a_bad_factor(method, factor, value):
    model = tiny_model()
    refused(lambda: hf_posext.patch(model, method, factor=factor), "factor", value)
    assert not hf_posext.is_patched(model)


@pytest.mark.parametrize("method", hf_posext.METHODS)
def test_patch_refuses_a_model_without_rope(method):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    refused(lambda: hf_posext.patch(gpt2, method, factor=2), "'gpt2'", "no rotary position embedding")


@pytest.mark.parametrize("name,says", [("", "Unknown RoPE extension method ''"), ("yarnn", "'yarnn'"),
                                       (3, "method must be a string"), ("YaRN ", "'YaRN '"),
                                       ("none", "'none'")])
def test_patch_refuses_a_bad_method_name(name, says):
    """None: test_bad_inputs.test_patch_with_no_method_is_refused."""
    refused(lambda: hf_posext.patch(tiny_model(), name, factor=2), says)


KNOBS = [   # (method, knobs, what the message names); `auto` knobs at 1e9: test_bad_inputs
    ("rerope", dict(window=10_000), "window=10000 exceeds the trained length 64"),
    ("rerope", dict(window=0), "window", "got 0"), ("rerope", dict(window=math.nan), "window", "nan"),
    ("rerope", dict(window=2.5), "window", "2.5"), ("leaky_rerope", dict(leak=1), "leak", "> 1"),
    ("leaky_rerope", dict(leak=math.nan), "leak", "nan"), ("leaky_rerope", dict(leak=-3), "leak", "-3"),
    ("leaky_rerope", dict(leak="auto", window=64, factor=1e9), "smaller factor"),
    ("self_extend", dict(group_size=0), "group_size", "got 0"),
    ("self_extend", dict(group_size=1.5), "group_size", "1.5"),
    ("self_extend", dict(window=10_000), "window=10000 exceeds the trained length 64"),
    ("dual_chunk", dict(chunk_size=10_000), "chunk_size=10000 exceeds the trained length 64"),
    ("dual_chunk", dict(chunk_size=16, local_window=16), "local_window=16", "chunk_size=16"),
    ("dual_chunk", dict(local_window=-1), "local_window", "-1"),
    ("yarn", dict(beta_fast=1, beta_slow=32), "beta_fast", "beta_slow"),
    ("yarn", dict(beta_fast=math.nan), "beta_fast", "nan"),
    ("yarn", dict(mscale_coefficient=-1), "mscale_coefficient", "-1"),
    ("yarn", dict(attention_factor=math.inf), "attention_factor", "inf"),
    ("yarn", dict(trained_length=0), "trained_length", "got 0"),
    ("yarn", dict(betafast=3), "'betafast'", "beta_fast"),
    ("linear", dict(beta_fast=64), "'linear' does not use 'beta_fast'"),
    ("ntk", dict(window=8), "'window'", "not of 'ntk'"),
    ("rerope", dict(logn="yes"), "logn", "'yes'"),
]


@pytest.mark.parametrize("method,knobs,says", [(m, k, s) for m, k, *s in KNOBS], ids=[f"{m}-{k}" for m, k, *_ in KNOBS])
def test_patch_refuses_a_bad_knob(method, knobs, says):
    knobs = {"factor": 2, **knobs}
    model = tiny_model()
    refused(lambda: hf_posext.patch(model, method, **knobs), *says)
    assert not hf_posext.is_patched(model)


@pytest.mark.parametrize("target,value", [(0, "0"), (-5, "-5"), (10.5, "10.5"), (math.nan, "nan"), ("64k", "'64k'")])
def test_patch_refuses_a_bad_target_length(target, value):
    refused(lambda: hf_posext.patch(tiny_model(), "yarn", target_length=target),
            "target_length", value)


def test_patch_refuses_the_old_name_of_the_target_length():
    """One name per input: transformers' config key is not an alias of target_length."""
    refused(lambda: hf_posext.patch(tiny_model(), "yarn", max_position_embeddings=4 * TRAINED),
            "patch() has no keyword max_position_embeddings=", f"pass target_length={4 * TRAINED}")


def test_patch_refuses_a_factor_and_a_target_that_disagree():
    refused(lambda: hf_posext.patch(tiny_model(), "yarn", factor=2, target_length=4096),
            "factor=2 and target_length=4096 disagree", "Pass only one")
    refused(lambda: hf_posext.RopeExtensionConfig("yarn", math.nan), "factor", "nan")


# ------------------------------------------------------------------ from_pretrained, loading
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny Llama as saved, the same extended with yarn s=4, and a GPT-2 (no RoPE)."""
    root = tmp_path_factory.mktemp("api")
    tiny_model().save_pretrained(root / "llama")
    hf_posext.patch(tiny_model(), "yarn", factor=4).save_pretrained(root / "yarn")
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(root / "gpt2")
    return root


@pytest.mark.parametrize("args,kwargs,says", [
    (("nope",), {}, ("nope: no such folder",)),
    (("gpt2", "yarn"), dict(factor=2), ("'gpt2' has no rotary position embedding",)),
    (("llama",), dict(factor=2), ("['factor'] need a method",)),
    (("llama", "yarn"), dict(factor=2, beta_fst=3), ("'beta_fst'", "'beta_fast'")),
    (("llama", "rerope"), dict(factor=2, window=10_000), (f"window=10000 exceeds the trained length {TRAINED}",)),
    (("llama", "yarn"), dict(factor=0.5), ("factor", "0.5")),
    (("llama", "self_extend"), dict(factor=1e9, group_size="auto"), ("smaller factor",)),
    (("llama", "yarn"), dict(max_position_embeddings=4 * TRAINED),
     ("has no keyword max_position_embeddings=", f"pass target_length={4 * TRAINED}")),
    (("llama",), dict(target_length=4 * TRAINED), ("['target_length'] need a method",)),
], ids=["missing", "gpt2", "factor-without-method", "misspelt-knob", "window-above-L", "factor-0.5",
        "self-extend-auto-1e9", "old-target-keyword", "target-without-method"])
def test_from_pretrained_refuses_bad_arguments(folders, args, kwargs, says):
    refused(lambda: hf_posext.from_pretrained(str(folders / args[0]), *args[1:], **kwargs), *says)


def _both(key, value):
    def edit(config):
        for layout in ("rope_scaling", "rope_parameters"):
            if isinstance(config.get(layout), dict):
                config[layout][key] = value
        if key in config:   # transformers 4.x keeps rope_theta beside the dict, and reads it there
            config[key] = value
    return edit


# the other edits (one layout, against the entry, no entry, a bad L): test_bad_inputs
EDITS = {"nan-factor": (_both("factor", math.nan), "factor=nan is not finite"),
         "inf-rope-theta": (_both("rope_theta", math.inf), "rope_theta=inf is not finite"),
         "damaged-entry": (lambda c: c.update(hf_posext={"method": "yarn"}), "is not an entry hf_posext wrote"),
         "unknown-rope-type": (_both("rope_type", "warp"), "unknown rope_type 'warp'"),
         "gpt2-model-type": (lambda c: c.update(model_type="gpt2"), "'gpt2' uses RoPE but is not supported")}


@pytest.mark.parametrize("edit", EDITS)
def test_from_pretrained_refuses_a_hand_edited_config(folders, tmp_path, edit):
    import shutil
    change, says = EDITS[edit]
    folder = tmp_path / "edited"
    shutil.copytree(folders / "yarn", folder)
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    refused(lambda: hf_posext.from_pretrained(str(folder)), str(folder), says)


def test_from_pretrained_refuses_a_config_that_is_not_json(folders, tmp_path):
    import shutil
    shutil.copytree(folders / "yarn", tmp_path / "broken")
    (tmp_path / "broken" / "config.json").write_text("{not json")
    refused(lambda: hf_posext.from_pretrained(str(tmp_path / "broken")), "cannot read its config")

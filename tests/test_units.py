"""A rope method is one unit (hf_posext/rope/units.py): adding one edits that file only, and the
tables users read (README, docs/portability.md) agree with the units."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hf_posext
from hf_posext.portability.portable import saved_rope
from hf_posext.rope.config import RopeExtensionConfig
from hf_posext.rope.units import UNITS

ROOT = Path(__file__).resolve().parents[1]

# The whole diff that adds a toy method: a unit with its own formula (positions divided by s^p,
# a static rope type hf_posext registers), a NEW knob p (`toy_power`, default 2, > 0) and its
# name in the units. Nothing else in the package is edited.
TOY_UNIT = '''
TOY_POWER = positive("toy_power", "toy: positions are divided by factor^toy_power", 2.0)
TOY = RopeMethod(
    "toy", "toy", registered=True, needs_trained_length=False, knobs=(TOY_POWER,),
    compute=lambda c, d, b, n, dev: (methods.default_inv_freq(d, b, dev) / c.factor ** c.toy_power, 1.0),
    rope_keys=lambda c: {"toy_power": c.toy_power})

'''

# Run in a fresh interpreter on the edited copy: everything below must come from the one unit.
TOY_CHECKS = '''
import json, math, pathlib, sys, tempfile
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
import hf_posext
from hf_posext.errors import ConfigError
from hf_posext.evaluation.shared.inputs import parse_knobs, parse_methods
from hf_posext.rope.longrope import longrope_form
from hf_posext.search import SEED_METHODS

assert hf_posext.__file__.startswith(sys.argv[1]), hf_posext.__file__
assert "toy" in hf_posext.METHODS and "toy" in hf_posext.ROPE_METHODS
assert parse_methods("none,toy") == ["none", "toy"]          # the CLI's --methods
assert "toy" in SEED_METHODS                                  # a static method seeds the search
try:
    parse_knobs("beta_fast=64", ["toy"])                      # knobs it does not use: refused
    raise AssertionError("a knob the toy method does not use was accepted")
except ConfigError:
    pass
# its new knob: a knob name everywhere, parsed by --knobs, checked by its own check
from hf_posext.evaluation.shared.grid import knob_names
assert "toy_power" in knob_names()
import contextlib, io
from hf_posext import cli
listed = io.StringIO()
with contextlib.redirect_stdout(listed):   # `hf-posext methods toy`: what --knobs takes
    cli.main(["methods", "toy"])
assert "toy_power (default" in listed.getvalue() and "toy: positions are divided by factor^toy_power" in listed.getvalue()
assert parse_knobs("toy:toy_power=3", ["toy"]) == {"toy": {"toy_power": 3.0}}
for bad in ("toy:toy_power=-1", "toy:toy_power=0"):
    try:
        parse_knobs(bad, ["toy"])
        raise AssertionError(f"{bad} was accepted")
    except ConfigError as err:
        assert "toy_power must be > 0" in str(err), err
try:
    hf_posext.RopeExtensionConfig("toy", 2.0, 64, toy_power=-1.0)
    raise AssertionError("toy_power=-1 was accepted")
except ValueError as err:
    assert "toy_power must be > 0" in str(err), err
try:
    hf_posext.RopeExtensionConfig("yarn", 2.0, 64, toy_power=3.0)   # another method: refused
    raise AssertionError("yarn took toy_power")
except ValueError as err:
    assert "does not use 'toy_power'" in str(err) and "'toy'" in str(err), err
spec = hf_posext.RopeExtensionConfig("toy", 2.0, 64, toy_power=3)
assert spec.toy_power == 3.0 and spec.knobs == {"toy_power": 3.0}
assert hf_posext.RopeExtensionConfig.from_dict(spec.to_dict()) == spec
assert hf_posext.RopeExtensionConfig("toy", 2.0, 64).toy_power == 2.0   # its default

torch.manual_seed(0)
cfg_args = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
model = LlamaForCausalLM(LlamaConfig(**cfg_args)).eval()
d, b = 16, 10000.0
hf_posext.patch(model, "toy", 2.0)
# the toy formula, written out independently in float64: b^(-2i/d) / s^p (p = 2 by default)
want = torch.tensor([b ** (-2 * i / d) / 4.0 for i in range(d // 2)], dtype=torch.float64)
got = model.model.rotary_emb.inv_freq.double()
assert torch.allclose(got, want, rtol=1e-6), (got, want)
hf_posext.unpatch(model)
hf_posext.patch(model, "toy", 2.0, toy_power=3)                # the new knob through patch()
got = model.model.rotary_emb.inv_freq.double()
assert torch.allclose(got, want / 2.0, rtol=1e-6), (got, want / 2.0)
ids = torch.randint(0, 64, (1, 100))
with torch.no_grad():
    logits = model(ids).logits
with tempfile.TemporaryDirectory() as tmp:
    model.save_pretrained(tmp)
    saved = json.loads((pathlib.Path(tmp) / "config.json").read_text())
    rope = saved.get("rope_parameters") or saved.get("rope_scaling")
    assert rope["rope_type"] == "toy" and rope["toy_power"] == 3.0, rope
    again = AutoModelForCausalLM.from_pretrained(tmp).eval()   # the registered type loads
    with torch.no_grad():
        assert torch.equal(again(ids).logits, logits)
    report = hf_posext.check(tmp)                              # check reads it, names it
    assert "toy" in str(report), report
    # export reads the saved form, knob included (vLLM knows no rope type "toy": refused, naming it)
    try:
        hf_posext.export(tmp, pathlib.Path(sys.argv[1]) / "toy-vllm", target="vllm")
        raise AssertionError("vLLM was said to run the toy rope type")
    except ValueError as err:
        assert "toy (factor 2, toy_power=3)" in str(err), err
from hf_posext import cli
import contextlib, io
def serve(*knobs):
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        try:
            code = cli.main(["serve", tmp, "--engine", "vllm", "--method", "toy", "--factor", "2", *knobs])
        except SystemExit as stop:
            code = stop.code
    return code, said.getvalue()
with tempfile.TemporaryDirectory() as tmp:                     # serve extends a base checkpoint
    LlamaForCausalLM(LlamaConfig(**cfg_args)).save_pretrained(tmp)
    code, said = serve("--knobs", "toy_power=-1")              # serve's --knobs: the knob's own check
    assert code == 2 and "toy_power must be > 0" in said, said
    code, said = serve("--knobs", "toy_power=3")               # vLLM knows no rope type "toy"
    assert code == 2 and "Unknown RoPE scaling type toy" in said, said
# the recipe's model section takes the knob, checked by its spec
import dataclasses
from hf_posext.training.recipe_config import ModelConfig, RecipeConfig, validate
recipe = RecipeConfig()
validate(dataclasses.replace(recipe, model=ModelConfig(method="toy", knobs={"toy_power": 3.0})))
try:
    validate(dataclasses.replace(recipe, model=ModelConfig(method="toy", knobs={"toy_power": -1.0})))
    raise AssertionError("the recipe took toy_power=-1")
except ValueError as err:
    assert "toy_power must be > 0" in str(err), err
spec = hf_posext.RopeExtensionConfig("toy", 2.0, 64, toy_power=3)
form = longrope_form(spec, d, b)                               # its exact longrope form
assert form["rope_type"] == "longrope" and abs(form["short_factor"][3] - 8.0) < 1e-5
print("toy ok")
'''


@pytest.mark.slow
def test_a_toy_method_is_one_edit_of_units_py(tmp_path):
    _run_toy(tmp_path, Path("rope/units.py"), "ALL_UNITS: dict[str, RopeMethod] = ", TOY_UNIT,
             ("LLAMA3, LONGROPE)}", "LLAMA3, LONGROPE, TOY)}"), TOY_CHECKS)


def _run_toy(tmp_path, source: Path, anchor: str, unit: str, listing: tuple[str, str], checks: str):
    """Copy the package, add `unit` before `anchor` in `source` and list it; check that this is
    the only file changed, then run `checks` against the copy in a fresh interpreter."""
    copy = tmp_path / "hf_posext"
    shutil.copytree(ROOT / "hf_posext", copy, ignore=shutil.ignore_patterns("__pycache__"))
    text = (copy / source).read_text()
    assert anchor in text and listing[0] in text
    (copy / source).write_text(text.replace(anchor, unit.lstrip("\n") + anchor).replace(*listing))
    changed = [p.relative_to(copy) for p in copy.rglob("*") if p.is_file()
               and p.read_bytes() != (ROOT / "hf_posext" / p.relative_to(copy)).read_bytes()]
    assert changed == [source]
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(checks), str(tmp_path)],
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path / "hf"),
                                            "HF_HUB_OFFLINE": "1"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "toy ok" in run.stdout, run.stderr[-3000:]


# An attention-level toy: ReRoPE under a NEW knob `span` (default L/4, a positive number of
# tokens; "auto": T/16, its own fit of the target length T), as one unit with its knob.
TOY_ATTENTION_UNIT = '''
SPAN = Knob("span", int, lambda L: L // 4, lambda v, L: tokens("span", v), "toy_window: ReRoPE's window",
            auto=lambda spec, L, T: T // 16)
TOY_WINDOW = AttentionMethod(
    "toy_window", (SPAN,), logn=True,
    plan=lambda spec: WindowPlan(spec.fitted("span"), partial(P.rerope_far_query, window=spec.fitted("span"),
                                                              leak=None), partial(P.rerope_far_key, leak=None)))

'''

TOY_ATTENTION_CHECKS = '''
import json, pathlib, sys, tempfile
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
import hf_posext
from hf_posext.evaluation.shared.inputs import parse_knobs, parse_methods

assert hf_posext.__file__.startswith(sys.argv[1]), hf_posext.__file__
assert "toy_window" in hf_posext.METHODS and "toy_window" in hf_posext.ATTENTION_METHODS
assert parse_methods("toy_window") == ["toy_window"]
from hf_posext.errors import ConfigError
from hf_posext.evaluation.shared.grid import knob_names
assert "span" in knob_names()
import contextlib, io
from hf_posext import cli
listed = io.StringIO()
with contextlib.redirect_stdout(listed):   # `hf-posext methods toy_window`: what --knobs takes
    cli.main(["methods", "toy_window"])
assert "span (default" in listed.getvalue() and "toy_window: ReRoPE's window" in listed.getvalue()
assert parse_knobs("toy_window:span=8", ["toy_window"]) == {"toy_window": {"span": 8}}
for bad in ("toy_window:span=0", "toy_window:span=2.5", "rerope:span=8"):
    try:
        parse_knobs(bad, ["toy_window", "rerope"])
        raise AssertionError(f"{bad} was accepted")
    except ConfigError as err:
        assert "span" in str(err), err
try:
    hf_posext.AttentionExtensionConfig("toy_window", 64, span=-2)
    raise AssertionError("span=-2 was accepted")
except ValueError as err:
    assert "span must be a positive integer" in str(err), err
assert hf_posext.AttentionExtensionConfig("toy_window", 64).span == 16
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
base = LlamaForCausalLM(cfg).eval()
ids = torch.randint(0, 64, (1, 150))
with torch.no_grad():
    plain = base(ids).logits
    hf_posext.patch(base, "rerope", 2.0, window=16)      # the same rule, spelled as ReRoPE
    want = base(ids).logits
    hf_posext.unpatch(base)
    hf_posext.patch(base, "toy_window", 2.0)             # window L/4 = 16 by default
    got = base(ids).logits
    hf_posext.unpatch(base)
    hf_posext.patch(base, "rerope", 2.0, window=8)
    want8 = base(ids).logits
    hf_posext.unpatch(base)
    hf_posext.patch(base, "toy_window", 2.0, span=8)      # the new knob through patch()
    got8 = base(ids).logits
assert torch.equal(got, want) and not torch.allclose(got, plain)
assert torch.equal(got8, want8) and not torch.allclose(got8, got)
with tempfile.TemporaryDirectory() as tmp:
    base.save_pretrained(tmp)
    again = hf_posext.from_pretrained(tmp).eval()       # the knob is saved and read back
    with torch.no_grad():
        assert torch.equal(again(ids).logits, got8)
# "auto": fitted by the toy unit's own function, T // 16 (T = s·L = 128 at s = 2: span 8)
assert parse_knobs("toy_window:span=auto", ["toy_window"]) == {"toy_window": {"span": "auto"}}
assert hf_posext.AttentionExtensionConfig("toy_window", 64, span="auto", target_length=320).fitted("span") == 20
try:
    hf_posext.AttentionExtensionConfig("toy_window", 64, span="auto")
    raise AssertionError("span='auto' without a target length was accepted")
except ValueError as err:
    assert "span='auto' fits the knob to the target length" in str(err), err
try:
    hf_posext.AttentionExtensionConfig("rerope", 64, window="auto", target_length=128)   # no fit
    raise AssertionError("window='auto' was accepted")
except ValueError as err:
    assert "window must be a positive integer" in str(err), err
hf_posext.unpatch(base)
hf_posext.patch(base, "toy_window", 2.0, span="auto")
with torch.no_grad():
    gotauto = base(ids).logits
assert torch.equal(gotauto, want8)
with tempfile.TemporaryDirectory() as tmp:
    base.save_pretrained(tmp)
    entry = json.loads((pathlib.Path(tmp) / "config.json").read_text())[hf_posext.attention.CONFIG_KEY]
    assert entry["span"] == "auto" and entry["target_length"] == 128, entry
    again = hf_posext.from_pretrained(tmp).eval()       # "auto" and T saved: fitted again on reload
    with torch.no_grad():
        assert torch.equal(again(ids).logits, want8)
print("toy ok")
'''


@pytest.mark.slow
def test_a_toy_attention_method_is_one_edit_of_attention_units_py(tmp_path):
    _run_toy(tmp_path, Path("attention/units.py"), "UNITS: dict[str, AttentionMethod] = ",
             TOY_ATTENTION_UNIT, ("DUAL_CHUNK, STRING, DPE, LOGN)}", "DUAL_CHUNK, STRING, DPE, LOGN, TOY_WINDOW)}"),
             TOY_ATTENTION_CHECKS)


def _table_rows(text: str, heading: str) -> dict[str, str]:
    """method -> its saved-form cell, from the first markdown table after `heading`."""
    section = text[text.index(heading):]
    rows: dict[str, str] = {}
    for line in section.splitlines()[1:]:
        if line.startswith("## ") or (rows and not line.startswith("|")):   # the first table only
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.match(r"`(\w+)`", cells[0]) if line.startswith("|") else None
        if match:
            rows[match.group(1)] = cells[1]
    return rows


@pytest.mark.parametrize("doc, heading", [("docs/methods.md", "# Methods"),
                                          ("docs/portability.md", "## 1. The saved form")])
def test_saved_form_tables_agree_with_the_units(doc, heading):
    rows = _table_rows((ROOT / doc).read_text(), heading)
    assert set(rows) == set(UNITS), f"{doc}: rows {sorted(rows)} vs units {sorted(UNITS)}"
    for name in UNITS:
        spec = RopeExtensionConfig(name, 4.0, 4096)
        saved = saved_rope(spec, {"rope_type": "default", "rope_theta": 10000.0}, 128)
        kind = "plain RoPE" if saved["rope_type"] == "default" else saved["rope_type"]
        assert kind in rows[name], f"{doc}: {name} is saved as {kind!r}, the table says {rows[name]!r}"
        if saved.get("attention_factor") == 1.0:  # NTK-by-parts: yarn without the temperature
            assert "attention_factor: 1.0" in rows[name]


def test_units_name_their_knobs_and_types_once():
    for name, unit in UNITS.items():
        spec = RopeExtensionConfig(name, 2.0, 4096)
        assert set(spec.knobs) <= {k.name for k in unit.knobs}, name
        assert hf_posext.rope.config.rope_type_of(name) == unit.rope_type
    assert len({u.rope_type for u in UNITS.values()}) == len(UNITS)


@pytest.mark.parametrize("doc, wing", [("docs/methods.md", "rope"), ("docs/attention.md", "attention")])
def test_the_docs_knob_tables_are_the_specs(doc, wing):
    """The knob table a page shows is the one the units' knob specs give (catalog.knob_table)."""
    from hf_posext.catalog import knob_table

    text = (ROOT / doc).read_text()
    shown = text.split(f"<!-- knob-table: {wing} -->\n")[1].split("\n<!-- /knob-table -->")[0]
    assert shown == knob_table(wing), f"{doc}: regenerate with hf_posext.catalog.knob_table({wing!r})"

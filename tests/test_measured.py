"""hf_posext/portability/measured_engines.json (written by `make engine-table` from the real engines) and what
`hf-posext check` shows for the measured releases.

The engines themselves run in tests/engines (make test-engines); here, without them: every
committed cell is what `check` prints in that release's column for the same method and form,
built again on other dims (check's table model: head dim 128, L 4096, not the measured 64 / 256),
so the lookup by method and config form holds beyond the model it was measured on.
"""

import json

import families_tiny
import pytest

import hf_posext
from hf_posext.portability import measured, readers
from hf_posext.commands.check import _tiny_checkpoint
from hf_posext.errors import BeyondReach
from hf_posext.portability.exporting import export
from hf_posext.portability.verdicts import check, load_config
from hf_posext.rope.compat import IS_V5

DATA = measured.load()
CELLS = [c for c in DATA["cells"] if c.get("signature") and c.get("mode") != "compiled"]
LLAMA_CELLS = [c for c in CELLS if measured.family_of(c) == measured.LLAMA]
FAMILY_CELLS = [c for c in CELLS if measured.family_of(c) != measured.LLAMA]


def test_the_committed_measurement_covers_three_engine_releases():
    ran = {e["reader"]: e["release"] for e in DATA["engines"]}
    assert set(ran) == {readers.VLLM_07B12F1.id, readers.VLLM_0CD5784.id, readers.LLAMACPP.id}
    assert len(DATA["engines"]) == 3 and measured.releases() == ran
    for reader in ran:  # the plain-RoPE control ran, within the threshold
        assert DATA["noise"][reader] <= DATA["threshold"][readers.get(reader).target]
    assert {(c["reader"], c["release"]) for c in DATA["cells"]} == set(ran.items())
    assert all("engine" not in c for c in DATA["cells"])   # keyed by reader id only


def _measured_checkpoint(folder, method, knobs):
    """The checkpoint as tests/engines/measure.py saved it: at s = 4, or for a method refusing a
    4·L target (STRING, errors.BeyondReach) without one and max_position_embeddings 4·L."""
    try:
        return _tiny_checkpoint(folder, method, knobs)
    except BeyondReach:
        path = _tiny_checkpoint(folder, method, knobs, factor=1.0)
        cfg = json.loads((path / "config.json").read_text())
        cfg["max_position_embeddings"] = 4 * cfg["max_position_embeddings"]
        (path / "config.json").write_text(json.dumps(cfg))
        return path


@pytest.mark.parametrize("case", sorted({c["case"] for c in LLAMA_CELLS if c["method"]}))
def test_check_shows_the_committed_measurement(tmp_path, case):
    cells = [c for c in LLAMA_CELLS if c["case"] == case]
    path = _measured_checkpoint(tmp_path / "saved", cells[0]["method"], cells[0]["knobs"])
    forms = {"saved": path}
    wrong = []
    for cell in cells:
        form = cell["form"]
        if form not in forms:
            forms[form] = tmp_path / form.replace(":", "-")
            export(path, forms[form], form.split(":", 1)[1])
        cfg = load_config(forms[form])
        shown = {v.reader: v for v in measured.overlay(cfg, check(forms[form]))}
        got = shown[cell["reader"]]
        if not (got.status == cell["verdict"] and got.measured):
            wrong.append((cell["reader"], cell["release"], form, cell["verdict"], got.cell()))
    assert not wrong, json.dumps(wrong, ensure_ascii=False)


def test_forms_not_measured_say_so(tmp_path):
    """A form no engine ran (here: yarn with only beta_fast changed) keeps the re-derivation,
    labelled; SGLang and TGI are never run here."""
    path = _tiny_checkpoint(tmp_path / "b", "yarn", {"beta_fast": 64})
    shown = measured.overlay(load_config(path), check(path))
    columns = [v for v in shown if isinstance(v, measured.Measured)]
    assert len(columns) == 3
    for v in columns:
        assert not v.measured and "form not measured" in v.cell()
    not_run = {"SGLang (re-derived, not run)", "TGI (re-derived, not run)"}
    assert {v.name for v in shown} >= not_run
    assert {v.reader for v in shown if isinstance(v, measured.NotRun)} == {readers.SGLANG.id, readers.TGI.id}


def test_families_were_measured_on_their_own_models():
    """The engines tier measures a MoE, a per-layer-rope and a partial-rotary family beside the
    Llama (tests/engines/engine_families.py), each in every measured release."""
    kinds = {DATA["families"][f]["kind"] for f in DATA["families"]}
    assert {"MoE", "per-layer rope", "partial rotary"} <= kinds
    releases = set(measured.releases())
    for family in DATA["families"]:
        ran = {c["reader"] for c in FAMILY_CELLS if c["family"] == family}
        assert ran == releases, (family, ran)


@pytest.mark.skipif(not IS_V5, reason="the families' rope dicts (per layer type): transformers 5.x")
@pytest.mark.parametrize("case", sorted({c["case"] for c in FAMILY_CELLS}))
def test_check_shows_each_familys_own_measurement(tmp_path, case):
    """A checkpoint of a measured family (built again on families_tiny's dims, not the measured
    ones), plain or YaRN at s = 4 as `patch` saves it, gets in each measured release's column
    the verdict measured on that family's own model, not the Llama's."""
    cells = [c for c in FAMILY_CELLS if c["case"] == case]
    family, method = cells[0]["family"], cells[0]["method"]
    model = families_tiny.build(family, families_tiny.plain_rope(family))
    if method is not None:
        hf_posext.patch(model, method, 4.0)
    model.save_pretrained(tmp_path)   # as a user saves it: `architectures` included
    shown = {v.reader: v for v in measured.overlay(load_config(tmp_path), check(tmp_path))}
    wrong = []
    for cell in cells:
        got = shown[cell["reader"]]
        if not (got.status == cell["verdict"] and got.measured and not got.stand_in):
            wrong.append((cell["reader"], cell["release"], cell["verdict"], got.line()))
    assert not wrong, json.dumps(wrong, ensure_ascii=False)


@pytest.mark.skipif(not IS_V5, reason="families_tiny's configs: transformers 5.x")
def test_other_families_say_the_llama_stood_in(tmp_path):
    """A family not measured on its own model (Mistral) shows the tiny Llama's cell for the same
    config form, saying so."""
    path = tmp_path / "mistral"
    model = families_tiny.build("mistral", {"rope_type": "default", "rope_theta": 10_000.0})
    hf_posext.patch(model, "yarn", 4.0)
    model.save_pretrained(path)
    shown = [v for v in measured.overlay(load_config(path), check(path))
             if isinstance(v, measured.Measured)]
    assert shown and all(v.measured and v.stand_in == "mistral" for v in shown)
    assert all("measured on the tiny Llama" in v.line() for v in shown)


@pytest.mark.skipif(not IS_V5, reason="the families' rope dicts (per layer type): transformers 5.x")
@pytest.mark.parametrize("case", sorted({c["case"] for c in FAMILY_CELLS if c["method"]}))
def test_re_derivations_agree_with_each_familys_measurement(tmp_path, case):
    """`check`'s re-derived verdict of each measured release's reader (what `export` and the
    doctor go by) is what that engine did with the family's own checkpoint (e.g. llama.cpp's Phi
    converter writes no rope scaling: ignored)."""
    cells = [c for c in FAMILY_CELLS if c["case"] == case and c["form"] == "saved"]
    model = families_tiny.build(cells[0]["family"], families_tiny.plain_rope(cells[0]["family"]))
    hf_posext.patch(model, cells[0]["method"], 4.0)
    model.save_pretrained(tmp_path)   # as a user saves it: `architectures` included
    derived = {v.reader: v.status for v in check(tmp_path)}
    got = {c["reader"]: derived[c["reader"]] for c in cells}
    assert got == {c["reader"]: c["verdict"] for c in cells}

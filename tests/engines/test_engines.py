"""The real engines (vLLM, llama.cpp) run every method's checkpoint: `make test-engines`.

One measurement (measure.py) per session: every distinct checkpoint form once per engine
release. Skipped without the engine venvs (`make engine-venvs`), except in CI (CI=true), where a
missing venv fails. The references are transformers + hf_posext (what the checkpoint means) and
the unpatched model (plain RoPE); the engines' own numbers decide each verdict.
"""

import json
import os
from pathlib import Path

import engine_families
import measure
import pytest

from hf_posext import ROPE_METHODS
from hf_posext.portability import measured, readers
from hf_posext.portability.verdicts import check, load_config

pytestmark = pytest.mark.engines
KEY = ("reader", "release", "mode", "case", "form")


@pytest.fixture(scope="session")
def fresh(tmp_path_factory):
    missing = measure.missing_venvs()
    if missing and os.environ.get("CI") == "true":
        pytest.fail(f"engine venvs missing in CI: {', '.join(missing)} (make engine-venvs)")
    if missing:
        pytest.skip(f"engine venvs missing: {', '.join(missing)} (make engine-venvs)")
    data = measure.measure(tmp_path_factory.mktemp("engines"))
    if os.environ.get("HF_POSEXT_WRITE_MEASURED") == "1":  # make engine-table
        measure.write(data)
        measured.load.cache_clear()
    return data


def all_cases() -> list[tuple[str, str | None, dict]]:
    """The tiny Llama's cases, then each family's (engine_families.py)."""
    return measure.cases() + [c for f in engine_families.FAMILIES for c in engine_families.cases(f)]


def test_every_engine_ran_every_case(fresh):
    """Every case of the Llama and of each family has a verdict (as saved) in every release; a
    family an engine cannot load here is there as refused, with the engine's own error."""
    ran = {(c["reader"], c["release"]) for c in fresh["cells"]}
    assert len(ran) == len(measure.ENGINES), ran
    for reader, release in ran:
        cases = {c["case"] for c in fresh["cells"]
                 if (c["reader"], c["release"]) == (reader, release) and c["form"] == "saved"}
        assert {label for label, *_ in all_cases()} <= cases, (reader, release)
    for cell in fresh["cells"]:
        if cell["verdict"] == "refused":
            assert cell["detail"].split(": ", 1)[-1], cell   # the engine's error, not empty


def test_noise_and_effects_leave_a_margin(fresh):
    """The threshold sits well above each engine's noise on plain RoPE and well below the
    smallest change any rope method makes to this model's logprobs (so exact means exact)."""
    noises = [("llama", reader, noise) for reader, noise in fresh["noise"].items()]
    noises += [(family, reader, noise) for family, by in fresh["family_noise"].items()
               for reader, noise in by.items()]   # the families' controls each engine ran exactly
    for family, reader, noise in noises:
        threshold = fresh["threshold"][readers.get(reader).target]
        assert noise <= threshold / 5, (family, reader, noise, threshold)
    rope = [label for label, method, _ in all_cases()
            if method in ROPE_METHODS]
    smallest = min(fresh["effect_vs_plain"][label] for label in rope)
    assert smallest >= 100 * max(fresh["threshold"].values()), fresh["effect_vs_plain"]


def test_committed_measurements_are_current(fresh):
    """hf_posext/portability/measured_engines.json (what `check` and the README use) is this measurement;
    else run `make engine-table` and commit it."""
    committed = {tuple(c[k] for k in KEY): c["verdict"] for c in measured.load()["cells"]}
    now = {tuple(c[k] for k in KEY): c["verdict"] for c in fresh["cells"]}
    assert committed == now


def test_check_says_what_the_engines_did(fresh):
    """`hf-posext check` on each measured checkpoint gives, in the measured release's column,
    the verdict just measured."""
    wrong = []
    for cell in fresh["cells"]:
        path = cell.get("path")
        if cell["mode"] == "compiled" or path is None or not (Path(path) / "config.json").exists():
            continue
        cfg = load_config(path)
        shown = {v.reader: v for v in measured.overlay(cfg, check(path))}
        release = f"{cell['reader']} {cell['release']}"
        got = shown.get(cell["reader"])
        if got is None or got.status != cell["verdict"] or not getattr(got, "measured", False):
            wrong.append((release, cell["case"], cell["form"], cell["verdict"],
                          got and got.cell()))
    assert not wrong, json.dumps(wrong, indent=1, ensure_ascii=False)

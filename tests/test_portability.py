"""`hf_posext.check` / `export` against independent references.

- transformers' reader (engines.transformers_v5 / _v4) against the rotary module transformers
  itself builds from the saved checkpoint, in the running version;
- vLLM's, SGLang's, TGI's and llama.cpp's readers against their formulas written here from
  their source (docs/portability.md), never against engines.py itself;
- what a checkpoint means: hf_posext.rope.methods.
"""

import json
import math
import re

import pytest
import torch
from conftest import TRAINED, tiny_model
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.portability import engines
from hf_posext.rope import methods
from hf_posext.portability.verdicts import check, load_config
from hf_posext.rope.compat import IS_V5
from hf_posext.portability.exporting import export

pytestmark = pytest.mark.usefixtures("one_thread")
D, BASE, S = 16, 10_000.0, 4.0  # the tiny models' head dim and theta; the scale used below
MISTRAL = {"beta_fast": 128, "beta_slow": 2, "mscale_coefficient": 0.07}


def saved(tmp_path, method, name="ck", **knobs):
    model = hf_posext.patch(tiny_model("llama"), method, factor=S, **knobs)
    model.save_pretrained(tmp_path / name)
    return tmp_path / name, model


def verdicts(path):
    return {v.reader: v for v in check(path)}


def logits(model, n=3 * TRAINED):
    tokens = torch.arange(n).remainder(100)[None]
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn"])
def test_transformers_reader_matches_the_rotary_module_transformers_builds(tmp_path, method):
    path, _ = saved(tmp_path, method, **(MISTRAL if method == "yarn" else {}))
    reader = engines.transformers_v5 if IS_V5 else engines.transformers_v4
    plain = AutoModelForCausalLM.from_pretrained(path)  # hf_posext's types are not involved
    rotary = plain.model.rotary_emb
    for length in (TRAINED, 3 * TRAINED):
        x = torch.zeros(1, length, D)
        rotary(x, torch.arange(length)[None])  # dynamic types update inv_freq for this length
        inv, scale = reader(load_config(path)).freqs(length)
        torch.testing.assert_close(rotary.inv_freq.double(), inv, rtol=1e-6, atol=0)
        assert rotary.attention_scaling == pytest.approx(scale, rel=1e-7)


def test_static_methods_exact_in_both_transformers_versions(tmp_path):
    for method in ("linear", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn"):
        got = verdicts(saved(tmp_path, method, name=method)[0])
        assert got["transformers-5"].status == got["transformers-4"].status == "exact", method


def test_vllm_reads_an_old_ntk_checkpoint_with_its_own_formula(tmp_path):
    """Before portable saving, `ntk` was saved as rope_type ntk, which vLLM has too: written here
    from ntk_scaling_rope.py, inv_freq_i = (b·s)^(-2i/d) / s^(2/d)."""
    path, model = saved(tmp_path, "ntk")
    cfg = json.loads((path / "config.json").read_text())
    old = {"rope_type": "ntk", "factor": S, "original_max_position_embeddings": TRAINED}
    cfg.update(rope_parameters={**old, "rope_theta": BASE}, rope_scaling=old, rope_theta=BASE)
    del cfg["hf_posext"]
    (path / "config.json").write_text(json.dumps(cfg))
    vllm = [(BASE * S) ** (-2 * i / D) / S ** (2 / D) for i in range(D // 2)]
    ours = [(BASE * S ** (D / (D - 2))) ** (-2 * i / D) for i in range(D // 2)]
    expected = max(abs(v - o) / o for v, o in zip(vllm, ours))
    for reader in ("vllm-07b12f1", "vllm-0cd5784"):
        got = verdicts(path)[reader]
        assert got.status == "different" and got.freq_error == pytest.approx(expected, rel=1e-6)
    assert expected > 0.1  # 1 − 4^(−1/8) at d = 16: far from float noise
    # the old type still loads (registered for reading) with the same logits as before
    reloaded = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    torch.testing.assert_close(logits(reloaded), logits(model), rtol=0, atol=0)


def test_an_old_ntk_by_parts_checkpoint_still_loads(tmp_path):
    """Saved before portable forms: rope_type ntk_by_parts (registered for reading), no entry."""
    path, model = saved(tmp_path, "ntk_by_parts")
    cfg = json.loads((path / "config.json").read_text())
    old = {"rope_type": "ntk_by_parts", "factor": S, "original_max_position_embeddings": TRAINED,
           "beta_fast": 32.0, "beta_slow": 1.0}
    cfg.update(rope_parameters={**old, "rope_theta": BASE}, rope_scaling=old, rope_theta=BASE)
    del cfg["hf_posext"]
    (path / "config.json").write_text(json.dumps(cfg))
    reloaded = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    torch.testing.assert_close(logits(reloaded), logits(model), rtol=1e-6, atol=1e-6)
    assert hf_posext.trained_length(reloaded) == TRAINED
    assert verdicts(path)["transformers-4"].status == "refused"  # without hf_posext


def test_dynamic_ntk_in_static_readers(tmp_path):
    """vLLM builds `dynamic` once, with max_position_embeddings (= L, which transformers' dynamic
    reads as the trained length) rows, but accepts L·s tokens: measured NaN / index-out-of-bounds
    past L (vLLM 0.29.0 and 0.32.0, docs/portability.md). SGLang builds it once with
    b·(s·(s·L)/L − (s−1))^(d/(d−2)): static NTK at s² − s + 1, equal to the dynamic rule only at
    s·L. llama.cpp's converter writes no scaling for `dynamic`."""
    path, _ = saved(tmp_path, "dynamic_ntk")
    got = verdicts(path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["max_position_embeddings"] == TRAINED  # what transformers' dynamic needs ...
    for reader in ("vllm-07b12f1", "vllm-0cd5784"):  # ... and what vLLM sizes its table with
        assert got[reader].status == "broken", got[reader]
        assert f"{TRAINED} rows" in got[reader].detail and f"{int(S * TRAINED)} tokens" in got[reader].detail
    assert got["llamacpp"].status == "ignored"
    sglang_base = BASE * (S * S - (S - 1)) ** (D / (D - 2))
    at_L = methods.default_inv_freq(D, BASE).double()
    sglang = methods.default_inv_freq(D, sglang_base).double()
    expected = ((sglang - at_L).abs() / at_L).max().item()  # worst at l = L, where ours is plain
    assert got["sglang"].status == "different"
    assert got["sglang"].freq_error == pytest.approx(expected, rel=1e-5)
    assert got["tgi"].status == "exact"  # TGI recomputes transformers' rule at the length


@pytest.mark.parametrize("method, knobs, temperature", [
    ("ntk_by_parts", {}, 1.0),
    ("yarn", MISTRAL, 0.07 * math.log(S) + 1)])
def test_yarn_temperature_per_reader(tmp_path, method, knobs, temperature):
    """Older vLLM and SGLang scale cos/sin by attn_factor × (0.1·ln s + 1) and read no
    `attention_factor`; current vLLM reads it as transformers does; llama.cpp's runtime reads
    neither the converter's yarn_attn_factor nor its betas (src/llama-model.cpp): it runs
    0.1·ln s + 1 and betas 32/1 (measured)."""
    path, _ = saved(tmp_path, method, **knobs)
    got = verdicts(path)
    own = 0.1 * math.log(S) + 1
    assert got["vllm-0cd5784"].status == "exact"
    for reader in ("vllm-07b12f1", "sglang"):
        assert got[reader].scale_error == pytest.approx(abs(own - temperature) / temperature)
    assert got["llamacpp"].scale_error == pytest.approx(abs(own - temperature) / temperature)
    ref, _ = methods.ntk_by_parts(D, BASE, S, TRAINED, knobs.get("beta_fast", 32),
                                  knobs.get("beta_slow", 1))
    cpp, _ = methods.ntk_by_parts(D, BASE, S, TRAINED, 32, 1)
    expected = ((cpp.double() - ref.double()).abs() / ref.double()).max().item()
    assert got["llamacpp"].freq_error == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_tgi_ignores_linear_and_fixes_betas(tmp_path):
    """TGI's PositionRotaryEmbedding.static leaves scaling_factor None for linear; yarn there
    always uses beta_fast=32, beta_slow=1."""
    assert verdicts(saved(tmp_path, "linear", name="a")[0])["tgi"].status == "ignored"
    got = verdicts(saved(tmp_path, "yarn", name="b", **MISTRAL)[0])["tgi"]
    ref, _ = methods.ntk_by_parts(D, BASE, S, TRAINED, 128, 2)
    tgi, _ = methods.ntk_by_parts(D, BASE, S, TRAINED, 32, 1)
    expected = ((tgi.double() - ref.double()).abs() / ref.double()).max().item()
    assert got.status == "different" and got.freq_error == pytest.approx(expected, rel=1e-4)


def test_dynamic_yarn_is_refused_loudly(tmp_path):
    got = verdicts(saved(tmp_path, "dynamic_yarn")[0])
    readers = ("transformers-5", "transformers-4", "vllm-07b12f1", "vllm-0cd5784", "sglang", "tgi")
    assert {got[r].status for r in readers} == {"refused"}
    assert got["llamacpp"].status == "ignored"


@pytest.mark.parametrize("method, knobs, target", [
    ("ntk_by_parts", {}, "vllm"), ("ntk_by_parts", {}, "sglang"), ("ntk_by_parts", {}, "tgi"),
    ("yarn", MISTRAL, "vllm"), ("yarn", MISTRAL, "sglang")])
def test_export_is_exact_for_its_target_and_for_transformers(tmp_path, method, knobs, target):
    path, model = saved(tmp_path, method, **knobs)
    got = {v.reader: v.status for v in export(path, tmp_path / "out", target)}
    readers = {"vllm": ("vllm-07b12f1", "vllm-0cd5784"), "sglang": ("sglang",),
               "tgi": ("tgi",)}[target] + ("transformers-5", "transformers-4")
    assert {got[r] for r in readers} == {"exact"}, got
    # the weights are untouched and transformers still runs the same model
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager")
    torch.testing.assert_close(logits(reloaded), logits(model), rtol=1e-6, atol=1e-6)  # attn scale
    # hf_posext still reads the method from it: trained length, and re-patching replaces
    assert hf_posext.trained_length(reloaded) == TRAINED
    hf_posext.patch(reloaded, "ntk", factor=2.0)
    fresh = hf_posext.patch(tiny_model("llama"), "ntk", factor=2.0)
    torch.testing.assert_close(logits(reloaded), logits(fresh), rtol=0, atol=0)


@pytest.mark.parametrize("method, knobs, target, reason", [
    ("dynamic_ntk", {}, "vllm", "vLLM 07b12f1 broken"), ("dynamic_ntk", {}, "llama.cpp", "plain RoPE"),
    ("ntk_by_parts", {}, "llama.cpp", "--target gguf"), ("yarn", MISTRAL, "llama.cpp", "--target gguf"),
    ("dynamic_ntk", {}, "sglang", "SGLang different"), ("linear", {}, "tgi", "ignores linear"),
    ("yarn", MISTRAL, "tgi", "beta_fast=32"), ("dynamic_yarn", {}, "vllm", "Unknown RoPE")])
def test_export_refuses_with_the_reason(tmp_path, method, knobs, target, reason):
    path, _ = saved(tmp_path, method, **knobs)
    with pytest.raises(ValueError, match="export refused") as err:
        export(path, tmp_path / "out", target)
    assert reason in str(err.value)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_reloaded_and_resaved_keeps_both_layouts(tmp_path):
    """hf_posext.from_pretrained of a portable checkpoint, saved again: both layouts again."""
    path, _ = saved(tmp_path, "ntk_by_parts")
    hf_posext.from_pretrained(path).save_pretrained(tmp_path / "again")
    first = json.loads((path / "config.json").read_text())
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    for key in ("rope_parameters", "rope_scaling", "rope_theta", "hf_posext"):
        assert again[key] == first[key], key


def test_method_spec_sees_through_the_portable_form(tmp_path):
    """What the recipe reads from a loaded model: `ntk`, though config.json says plain RoPE."""
    path, _ = saved(tmp_path, "ntk")
    config = AutoModelForCausalLM.from_pretrained(path).config
    spec = hf_posext.portability.portable.method_spec(config)
    assert (spec.method, spec.factor, spec.trained_length) == ("ntk", S, TRAINED)
    assert hf_posext.portability.portable.method_spec(tiny_model("llama").config) is None


def _statuses(path) -> dict[str, set]:
    """{"transformers": statuses of the transformers readers, "engines": the others'}."""
    found = {"transformers": set(), "engines": set()}
    for v in check(path):
        found["transformers" if v.reader.startswith("transformers") else "engines"].add(v.status)
    return found


def test_check_is_not_applicable_to_transformers_own_types(tmp_path):
    """llama3 / longrope: transformers reads its own types exactly; nothing to re-derive an engine
    against (n/a), unless the engine was measured (measured.overlay). DeepSeek's yarn (mscale /
    mscale_all_dim) is hf_posext's yarn with those knobs: each engine is judged against it."""
    model = hf_posext.patch(tiny_model("llama"), "llama3", factor=8.0, low_freq_factor=1.0,
                            high_freq_factor=4.0)
    model.config.save_pretrained(tmp_path / "l3")
    assert _statuses(tmp_path / "l3") == {"transformers": {"exact"}, "engines": {"n/a"}}
    cfg = json.loads((tmp_path / "l3" / "config.json").read_text())
    deepseek = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAINED,
                "mscale": 0.707, "mscale_all_dim": 0.707}
    cfg.update(rope_parameters={**deepseek, "rope_theta": BASE}, rope_scaling=deepseek)
    (tmp_path / "l3" / "config.json").write_text(json.dumps(cfg))
    assert _statuses(tmp_path / "l3")["transformers"] == {"exact"}
    verdicts = {v.reader: v.status for v in check(tmp_path / "l3")}
    # vLLM's older yarn passes neither mscale key (its scale is 0.1·ln s + 1), the newer one both
    assert verdicts["vllm-0cd5784"] == "exact" and verdicts["vllm-07b12f1"] == "different"


def test_export_bad_input(tmp_path):
    path, model = saved(tmp_path, "yarn")
    with pytest.raises(ValueError, match="Unknown export target"):
        export(path, tmp_path / "out", "ollama")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(FileExistsError, match="not empty"):
        export(path, tmp_path / "full", "vllm")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        export(tmp_path / "missing", tmp_path / "out", "vllm")
    # a model in memory works too
    got = {v.reader: v.status for v in export(model, tmp_path / "from_model", "vllm")}
    assert got["vllm-07b12f1"] == got["vllm-0cd5784"] == "exact"


def test_cli_check_and_export(tmp_path, run_cli):
    path, _ = saved(tmp_path, "ntk_by_parts")
    code, out, err = run_cli(["check", path])
    assert code == 0, err
    assert "ntk_by_parts (factor 4" in out and "vLLM" in out
    assert "different (scale 13.86%)" in out
    code, out, err = run_cli(["export", path, tmp_path / "v", "--target", "vllm"])
    assert code == 0 and re.search(r"vLLM 07b12f1\s+exact", out), out + err
    lin, _ = saved(tmp_path, "linear", name="lin")
    code, out, err = run_cli(["export", lin, tmp_path / "t", "--target", "tgi"])
    assert code != 0 and "export refused" in err


def test_check_page_table_is_what_check_prints():
    """The method × reader table of docs/check.md is the output of `hf-posext check --table`."""
    from pathlib import Path

    from hf_posext.commands.check import method_reader_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "check.md").read_text()
    block = page.split("<!-- portability-table")[1].split("<!-- /portability-table -->")[0]
    assert method_reader_table() == block.split("-->", 1)[1].strip()


def test_longrope_export_for_vllm_writes_the_scale_vllm_reads(tmp_path):
    """vLLM's longrope ignores attention_factor and reads short_mscale / long_mscale (its
    `get_rope`; measured different otherwise, tests/engines): `export --target vllm` writes both
    equal to attention_factor, and transformers still computes the same logits from it."""
    from hf_posext.rope.longrope import longrope_knobs
    spec = hf_posext.RopeExtensionConfig("yarn", 4.0, TRAINED)
    model = hf_posext.patch(tiny_model("llama"), "longrope", 4.0, **longrope_knobs(spec, 16, 10_000.0))
    model.save_pretrained(tmp_path / "saved")
    export(tmp_path / "saved", tmp_path / "vllm", "vllm")
    cfg = load_config(tmp_path / "vllm")
    rope = engines.v5_rope(cfg)
    assert rope["short_mscale"] == rope["long_mscale"] == rope["attention_factor"] == \
        pytest.approx(0.1 * math.log(4.0) + 1)
    ids = (torch.arange(3 * TRAINED)[None] * 7) % 128
    with torch.no_grad():
        want = model(ids).logits
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "vllm").eval()(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for target in ("transformers", "sglang", "llama.cpp"):
        with pytest.raises(ValueError, match="--target vllm"):
            export(tmp_path / "saved", tmp_path / target, target)
    del cfg["rope_parameters"]["attention_factor"], cfg["rope_scaling"]["attention_factor"]
    (tmp_path / "saved" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no attention_factor"):
        export(tmp_path / "saved", tmp_path / "vllm2", "vllm")

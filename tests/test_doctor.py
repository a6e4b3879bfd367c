"""`hf-posext check`'s doctor on real configs (tests/fixtures/rope_configs, SOURCES.md there) and
the broken variants users report.

References: transformers itself (what it loads from each config, in the running version), the
engines' length and YaRN-scale formulas written here from their source (vLLM
`_get_and_verify_max_len` and `YaRNScalingRotaryEmbedding`, SGLang `get_context_length`), the
YaRN paper's temperature 0.1·ln s + 1, and GGUF files written with the `gguf` package."""

import json
import math
import re
from pathlib import Path

import pytest
from conftest import tiny_model
from transformers import AutoConfig

import hf_posext
from hf_posext.portability import doctor
from hf_posext.rope.compat import IS_V5, get_rope_parameters

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent
FIXTURES = ROOT / "fixtures" / "rope_configs"

# every fixture and exactly the findings it gets
EXPECTED = {
    "llama-3.1-8b": [], "llama-3.2-1b": [], "mistral-7b-v0.3": [], "ministral-8b-2410": [],
    "phi-3-mini-128k-instruct": [], "deepseek-v3": [], "smollm3-3b": [], "qwen2.5-7b-instruct": [],
    "qwen2.5-7b-instruct-yarn": ["factor-length", "static-short"],
    "qwen3-8b-yarn": ["factor-length", "static-short"],
    "ministral-3-3b": ["v5-only", "yarn-attention-keys"],
    "gemma-3-12b-it-text": ["engine-length"] + ["sliding-releases"] * 2,
    "gemma-3-4b-it": ["engine-length"] + ["sliding-releases"] * 2,
    "gpt-oss-20b": ["yarn-frequencies"] + ["truncate-releases"] * 3,
    "broken-synthesized-linear": ["theta-dropped", "layouts-disagree", "engine-length"],
    "broken-theta-missing": ["theta-missing", "v5-only"],
    "broken-double-factor": ["engine-length"],
    "broken-missing-original": ["engine-length", "original-missing"],
    "broken-conflicting-blocks": ["layouts-disagree", "factor-length", "static-short"],
    "broken-mscale-confusion": ["yarn-attention-keys"],
    "broken-nested-rope": ["engine-length", "nested-rope"] + ["sliding-releases"] * 2,
    "qwen2.5-vl-7b-instruct": [], "broken-nested-yarn-top-level": ["nested-rope"],
}


def fixture(name: str) -> Path:
    return FIXTURES / f"{name}.json"


def found(name_or_raw) -> dict[str, doctor.Finding]:
    raw = doctor.raw_config(fixture(name_or_raw)) if isinstance(name_or_raw, str) else name_or_raw
    return {f.code: f for f in doctor.diagnose(raw)}


def as_checkpoint(tmp_path, raw: dict) -> Path:
    """A folder transformers' AutoConfig reads (config.json only)."""
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def test_every_fixture_has_its_expected_findings():
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(EXPECTED)
    for name, codes in EXPECTED.items():
        assert [f.code for f in doctor.diagnose(doctor.raw_config(fixture(name)))] == codes, name


@pytest.mark.parametrize("name, code", [("llama-3.1-8b", 0), ("broken-double-factor", 1)])
def test_strict_exit_status(run_cli, name, code):
    got, out, err = run_cli(["check", fixture(name), "--strict"])
    assert got == code, err
    assert ("doctor: no findings" in out) == (code == 0)
    assert run_cli(["check", fixture(name)])[0] == 0   # without --strict: a report, status 0


def vllm_max_model_len(cfg):
    """vllm/config/model.py `_get_and_verify_max_len`, written from its source (Gemma 3 skipped)."""
    keys = ["max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
            "model_max_length", "max_sequence_length", "max_seq_length", "seq_len"]
    length = min(cfg[k] for k in keys if k in cfg)
    rope = cfg.get("rope_scaling")
    if rope and "gemma3" not in cfg["model_type"]:
        kind = rope.get("rope_type", rope.get("type"))
        if kind not in ("su", "longrope", "llama3"):
            if kind == "yarn":
                length = rope.get("original_max_position_embeddings", length)
            length *= rope.get("factor", 1.0)
    return int(length)


def sglang_context_length(cfg):
    """sglang hf_transformers_utils.get_context_length, written from its source."""
    rope, factor = cfg.get("rope_scaling"), 1
    if rope:
        factor = 1 if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3" \
            else rope.get("factor", 1)
    for key in ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                "max_position_embeddings"):
        if key in cfg:
            return int(factor * cfg[key])


def test_factor_length_says_what_each_engine_derives_and_the_fix_removes_it():
    """Qwen2.5 with its model card's YaRN entry: vLLM derives s·L, SGLang and llama.cpp stop at
    max_position_embeddings; the fix (max_position_embeddings = s·L) makes them agree."""
    raw = doctor.raw_config(fixture("qwen2.5-7b-instruct-yarn"))
    finding = found(raw)["factor-length"]
    assert f"vLLM (max_model_len) {vllm_max_model_len(raw)}" in finding.off
    assert f"SGLang (context_length) {sglang_context_length(raw)}" in finding.off
    assert vllm_max_model_len(raw) == 131072 and sglang_context_length(raw) == 32768
    assert finding.engines == ("SGLang", "llama.cpp")
    fixed = {**raw, "max_position_embeddings": 131072}
    assert "\"max_position_embeddings\": 131072" in finding.fix
    assert "factor-length" not in found(fixed)
    assert vllm_max_model_len(fixed) == sglang_context_length(fixed) == 131072


def test_double_scaled_lengths_match_the_engines_formulas():
    """vllm #56446: yarn factor 40 on an extended max_position_embeddings, no original length:
    vLLM and SGLang derive 131072·40 = 5,242,880."""
    for name in ("broken-missing-original", "broken-double-factor", "broken-synthesized-linear"):
        raw = doctor.raw_config(fixture(name))
        text = found(raw)["engine-length"].message
        assert f"vLLM (max_model_len) derives {vllm_max_model_len(raw)}" in text, name
        assert f"SGLang (context_length) derives {sglang_context_length(raw)}" in text, name
    assert vllm_max_model_len(doctor.raw_config(fixture("broken-missing-original"))) == 5_242_880


def test_theta_dropped_is_what_transformers_itself_loads(tmp_path):
    """unsloth #7028: a synthesized {"type": "linear"} rope_scaling beside rope_parameters holding
    θ: transformers (the running version) reads rope_scaling and runs θ 10000."""
    raw = doctor.raw_config(fixture("broken-synthesized-linear"))
    loaded = get_rope_parameters(AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw)))
    assert loaded["rope_theta"] == 10000.0 and loaded["factor"] == 2.0
    finding = found(raw)["theta-dropped"]
    assert "transformers 5.x, vLLM, SGLang (rope_scaling first) run θ 10000" in finding.off
    # the lowest rotary frequency at d = 128: (500000 / 10000)^(126/128) ≈ 47× too fast
    assert f"{(500000 / 10000) ** (126 / 128):.3g}× too fast" in finding.off
    assert "add \"rope_theta\": 500000 to the top level and to rope_scaling" in finding.fix
    fixed = {**raw, "rope_theta": 500000.0, "rope_scaling": {**raw["rope_scaling"], "rope_theta": 500000.0}}
    assert "theta-dropped" not in found(fixed)


def test_theta_missing_but_a_family_default_is_not_a_finding(tmp_path):
    """Gemma 3's released text_config states no θ: transformers' Gemma3 class carries 1e6 (so
    no finding, and check fills it in as transformers does); Llama's class default is 10000."""
    raw = doctor.raw_config(fixture("gemma-3-4b-it"))
    config = AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw)).text_config
    assert get_rope_parameters(config)["rope_theta"] == 1e6
    assert "theta-missing" not in found(raw)
    from hf_posext.portability.verdicts import load_config
    assert load_config(fixture("gemma-3-4b-it"))["max_position_embeddings"] == config.max_position_embeddings
    assert "theta-missing" in found("broken-theta-missing")


def test_yarn_attention_keys_match_the_engines_formulas(tmp_path):
    """A real Qwen3 config carrying YaRN's temperature as attn_factor: transformers ignores it
    (its own ROPE_INIT_FUNCTIONS, running version), vLLM <= 0.29 and SGLang multiply their
    0.1·ln s + 1 by it (yarn_scaling_rope.py; sglang yarn.py)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = doctor.raw_config(fixture("broken-mscale-confusion"))
    _, hf_scale = ROPE_INIT_FUNCTIONS["yarn"](AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw)), "cpu")
    engine = (0.1 * math.log(4.0) + 1) * raw["rope_scaling"]["attn_factor"]
    finding = found(raw)["yarn-attention-keys"]
    assert hf_scale == pytest.approx(0.1 * math.log(4.0) + 1)
    assert f"transformers applies {hf_scale:.6g}" in finding.message
    assert finding.off.count(f" {engine:.6g} ({abs(engine - hf_scale) / hf_scale:.1%} off)") == 2
    assert set(finding.engines) == {"vLLM 07b12f1 (vLLM 0.29.0)", "SGLang"}
    # the fix it names: attn_factor 1 makes vLLM <= 0.29 and SGLang run transformers' scale
    assert "set \"attn_factor\": 1" in finding.fix
    assert "yarn-attention-keys" not in found({**raw, "rope_scaling": {**raw["rope_scaling"], "attn_factor": 1.0}})


def test_explicit_attention_factor_ignored_by_older_vllm():
    """vllm #46280: poolside/Laguna-XS.2 sets factor 64 and attention_factor 1.0; vLLM's YaRN (before
    the fix) drops the key and runs 0.1·ln 64 + 1 = 1.4158883 (the PR's own number)."""
    raw = {**doctor.raw_config(fixture("qwen3-8b-yarn")), "max_position_embeddings": 64 * 4096,
           "rope_scaling": {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                            "attention_factor": 1.0}}
    finding = found(raw)["yarn-attention-keys"]
    assert "transformers applies 1," in finding.message
    assert "vLLM 07b12f1 (vLLM 0.29.0) 1.41589 (41.6% off)" in finding.off
    assert "vLLM 0cd5784" not in finding.off   # 0.30 on read attention_factor
    # the edit named for vLLM <= 0.29 keeps every reader that was right, right
    edit = re.search(r"vLLM 0.29.0\): set \"attn_factor\": ([0-9.]+)", finding.fix).group(1)
    assert float(edit) == pytest.approx(1 / (0.1 * math.log(64) + 1), rel=1e-5)


def test_ministral3_mscale_pair_in_older_vllm():
    """vllm #48621: Ministral 3 (factor 16, mscale = mscale_all_dim = 1): transformers runs 1.0,
    vLLM's generic YaRN before the fix 0.1·ln 16 + 1 = 1.2773 (the number vllm #48621 gives)."""
    finding = found("ministral-3-3b")["yarn-attention-keys"]
    assert "1.27726 (27.7% off)" in finding.off and round(0.1 * math.log(16) + 1, 4) == 1.2773
    assert "copy of the checkpoint" in finding.fix   # SGLang also multiplies attn_factor in


def test_original_missing_is_what_transformers_runs(tmp_path):
    """yarn without original_max_position_embeddings: transformers (running version) takes
    L = max_position_embeddings; the doctor says how far that is from L = max/s."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hf_posext.rope import methods

    raw = doctor.raw_config(fixture("broken-missing-original"))
    inv, _ = ROPE_INIT_FUNCTIONS["yarn"](AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw)), "cpu")
    d, s, M = 128, 40.0, 131072
    as_is, _ = methods.ntk_by_parts(d, 1e6, s, M, 32, 1)
    meant, _ = methods.ntk_by_parts(d, 1e6, s, round(M / s), 32, 1)
    assert inv.double() == pytest.approx(as_is.double(), rel=1e-5)
    err = ((as_is.double() - meant.double()).abs() / meant.double()).max().item()
    finding = found(raw)["original-missing"]
    assert f"differs by up to {err:.0%} in inv_freq" in finding.off
    assert {"vLLM 07b12f1", "vLLM 0cd5784", "TGI", "llama.cpp"} <= set(finding.engines)   # KeyError


def test_nested_rope_is_ignored_by_transformers(tmp_path):
    """A linear factor put at the top level of Gemma 3's multimodal config: transformers builds
    the decoder from text_config (factor 8), not the top-level 16."""
    raw = doctor.raw_config(fixture("broken-nested-rope"))
    config = AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw)).text_config
    assert get_rope_parameters(config)["factor"] == 8.0
    finding = found(raw)["nested-rope"]
    assert "decoder runs {\"factor\": 8.0" in finding.off and "move rope_scaling into text_config" in finding.fix


def test_qwen_vl_yarn_at_the_top_level_never_reaches_the_decoder(tmp_path):
    """Qwen2.5-VL saved with its text_config, the card's YaRN entry added at the top level: the
    running transformers either refuses the wrapper (5.24 validates the entry against a
    max_position_embeddings only text_config has) or builds the decoder without it."""
    raw = doctor.raw_config(fixture("broken-nested-yarn-top-level"))
    try:
        decoder = get_rope_parameters(AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw)).text_config)
    except AttributeError as err:
        assert "max_position_embeddings" in str(err)
    else:
        assert decoder["rope_type"] == "default"
    assert "move rope_scaling into text_config" in found(raw)["nested-rope"].fix
    moved = {**{k: v for k, v in raw.items() if k != "rope_scaling"},
             "text_config": {**raw["text_config"], "rope_scaling": raw["rope_scaling"]}}
    assert "nested-rope" not in found(moved)


@pytest.mark.skipif(not IS_V5, reason="rope_parameters per layer type is transformers 5's layout")
def test_per_layer_type_rope_parameters_are_one_layout(tmp_path):
    """Gemma 3 as transformers 5 saves it (rope_parameters per layer type): the global
    (full-attention) rope is what every reader's layout holds, as transformers itself loads it."""
    raw = doctor.raw_config(fixture("gemma-3-12b-it-text"))
    five = {k: v for k, v in raw.items() if k not in ("rope_scaling", "rope_theta", "rope_local_base_freq")}
    five["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    loaded = get_rope_parameters(AutoConfig.from_pretrained(as_checkpoint(tmp_path, five)))
    assert (loaded["rope_type"], loaded["factor"], loaded["rope_theta"]) == ("linear", 8.0, 1e6)
    assert "layouts-disagree" not in found(five) and "v5-only" in found(five)


def test_static_scaling_is_named_only_where_it_was_added():
    """Qwen's card entry (max_position_embeddings < s·L) and hf_posext's own extensions; not
    configs trained with the scaling (gpt-oss, DeepSeek-V3: max_position_embeddings = s·L)."""
    assert "static-short" in found("qwen3-8b-yarn")
    for name in ("gpt-oss-20b", "deepseek-v3", "llama-3.1-8b"):
        assert "static-short" not in found(name), name


def test_hf_posext_checkpoints(tmp_path):
    """A saved extension: static YaRN is the one finding; NTK (plain RoPE on a raised base) none;
    linear (max_position_embeddings raised to s·L) is double-scaled by vLLM and SGLang."""
    expect = {"yarn": ["static-short"], "ntk": [], "linear": ["engine-length", "static-short"]}
    for method, codes in expect.items():
        hf_posext.patch(tiny_model("llama"), method, factor=4.0).config.save_pretrained(tmp_path / method)
        assert [f.code for f in doctor.diagnose(doctor.raw_config(tmp_path / method))] == codes, method


def write_gguf(path: Path, meta: dict) -> Path:
    import gguf

    writer = gguf.GGUFWriter(path, meta["general.architecture"])
    for key, value in meta.items():
        if key == "general.architecture":
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_float32(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


def test_gguf_with_yarn_baked_in(tmp_path, run_cli):
    """llama.cpp #13331: a GGUF converted while the YaRN entry was in config.json keeps it. Read
    from a GGUF file (written here with the gguf package) and from gguf-dump --json output."""
    from hf_posext.portability.gguf_doctor import read_metadata

    dumped = FIXTURES / "gguf" / "qwen2.5-7b-instruct-yarn-baked.json"
    meta = read_metadata(dumped)
    file = write_gguf(tmp_path / "baked.gguf", meta)
    back = read_metadata(file)   # also the GGUF.* header fields
    assert {k: back[k] for k in meta} == pytest.approx(meta)
    code, out, err = run_cli(["check", fixture("qwen2.5-7b-instruct"), "--gguf", file, "--strict"])
    assert code == 1, err
    assert "[gguf-mismatch]" in out and "rope.scaling.type: GGUF 'yarn', config 'none'" in out
    assert "--rope-scaling none" in out
    # the config it came from (with the YaRN entry) matches the GGUF: no GGUF finding
    code, out, _ = run_cli(["check", fixture("qwen2.5-7b-instruct-yarn"), "--gguf", dumped])
    assert code == 0 and "gguf-mismatch" not in out
    # a θ the GGUF does not carry: --rope-freq-base with the config's value
    file = write_gguf(tmp_path / "theta.gguf", {**meta, "qwen2.rope.freq_base": 10000.0})
    code, out, _ = run_cli(["check", fixture("qwen2.5-7b-instruct-yarn"), "--gguf", file, "--strict"])
    assert code == 1 and "--rope-freq-base 1000000" in out


def test_gguf_bad_input(tmp_path, run_cli):
    code, _, err = run_cli(["check", fixture("llama-3.1-8b"), fixture("qwen3-8b-yarn"), "--gguf", "x.gguf"])
    assert code == 2 and "exactly one PATH" in err
    code, _, err = run_cli(["check", fixture("llama-3.1-8b"), "--gguf", tmp_path / "missing.gguf"])
    assert code != 0 and len(err.strip().splitlines()) == 1 and "no such file" in err
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    code, _, err = run_cli(["check", fixture("llama-3.1-8b"), "--gguf", tmp_path / "junk.gguf"])
    assert code != 0 and "not a readable GGUF" in err


DOC = (ROOT.parent / "docs" / "check.md").read_text()


def doc_examples() -> list[tuple[str, str, int]]:
    """(command, output, exit status) of each example in docs/check.md's Doctor section."""
    found_ = re.findall(r"<!-- doctor-example -->\s*```\n\$ (hf-posext [^\n]*)\n(.*?)```\n\(exit status (\d)\)",
                        DOC, re.S)
    return [(cmd, out.rstrip("\n"), int(code)) for cmd, out, code in found_]


def test_docs_doctor_examples_are_what_check_prints(run_cli, monkeypatch):
    """docs/check.md shows the doctor on two real configs: each command, run here, prints exactly
    the output shown, with the exit status shown."""
    import shlex

    examples = doc_examples()
    assert len(examples) == 2
    monkeypatch.chdir(ROOT.parent)
    for command, output, status in examples:
        code, out, err = run_cli(shlex.split(command)[1:])
        assert (code, out.rstrip("\n")) == (status, output), command + err


def test_fixture_sources_are_cited():
    sources = (FIXTURES / "SOURCES.md").read_text()
    for name in EXPECTED:
        assert f"`{name}.json`" in sources, name

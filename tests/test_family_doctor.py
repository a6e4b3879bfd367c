"""The doctor's family findings (hf_posext/portability/family_doctor.py) on published-style configs:
Gemma 3 and OLMo 3 (per-layer rope), DeepSeek-V3 (MLA YaRN), gpt-oss (`truncate: false`), a
Phi-2-shaped LongRoPE config, SmolLM3 (NoPE layers).

References: transformers itself (what the running version loads and builds from each config:
its rope init functions, its config classes' per-layer conversion and NoPE lists), and the
engines' formulas written here from their source (vLLM / SGLang DeepseekScalingRotaryEmbedding:
get_mscale(s, mscale = 1) / get_mscale(s, mscale_all_dim = 0) × attn_factor; llama.cpp's fixed
NoPE step (il + 1) % 4 == 0)."""

import copy
import json
import math
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from hf_posext.portability import doctor, family_doctor
from hf_posext.rope.compat import IS_V5

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parent
FIXTURES = ROOT / "fixtures" / "rope_configs"
FAMILY_CODES = {"sliding-scaled", "per-layer-flat", "sliding-releases", "mla-yarn-scale",
                "truncate-releases", "longrope-factors", "nope-layers"}
needs_v5 = pytest.mark.skipif(not IS_V5, reason="rope_parameters per layer type is transformers 5's")

# OLMo 3 7B's long-context rope as its release writes it (4.x layout): YaRN factor 8 over 8192,
# attention_factor = 0.1·ln 8 + 1, θ 500000, every 4th layer full attention, window 4096
OLMO3 = {"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "hidden_size": 4096,
         "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
         "max_position_embeddings": 65536, "sliding_window": 4096, "rope_theta": 500000,
         "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                          "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1}}
# Phi-2's shape (head 80, partial_rotary_factor 0.4: 32 rotary dims) with a LongRoPE entry whose
# lists were sized to head_dim / 2 = 40 instead of 32 / 2 = 16 (apache/tvm #18102's mix-up)
PHI2_LONGROPE = {"architectures": ["PhiForCausalLM"], "model_type": "phi", "hidden_size": 2560,
                 "num_attention_heads": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
                 "max_position_embeddings": 8192, "rope_theta": 10000.0,
                 # top level too, as Phi-3's releases write it: transformers 4.x reads it there
                 "original_max_position_embeddings": 2048,
                 "rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 2048,
                                  "long_factor": [2.0] * 40, "short_factor": [1.0] * 40}}


def fixture(name: str) -> dict:
    return doctor.raw_config(FIXTURES / f"{name}.json")


def family(raw: dict) -> list[doctor.Finding]:
    return [f for f in doctor.diagnose(raw) if f.code in FAMILY_CODES]


def as_checkpoint(tmp_path, raw: dict, name: str = "ckpt") -> Path:
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(raw))
    return tmp_path / name


def test_clean_configs_get_no_family_finding():
    """Released configs whose rope every reader runs as meant (Phi-3 with its full 48-value
    LongRoPE lists, DeepSeek-V3's equal mscale pair, SmolLM3's every-4th NoPE)."""
    for name in ("llama-3.1-8b", "qwen2.5-7b-instruct-yarn", "mistral-7b-v0.3", "phi-3-mini-128k-instruct",
                 "deepseek-v3", "smollm3-3b", "ministral-3-3b", "qwen2.5-vl-7b-instruct"):
        assert family(fixture(name)) == [], name
    smol_128k = {**fixture("smollm3-3b"), "num_hidden_layers": 36, "max_position_embeddings": 131072,
                 "rope_scaling": {"factor": 2.0, "original_max_position_embeddings": 65536, "type": "yarn"}}
    assert family(smol_128k) == []   # the card's YaRN entry: a scaling entry on NoPE layers is fine


def test_gemma3_sliding_releases(tmp_path):
    """Gemma 3's released config (linear 8, 4.x layout): the running transformers keeps the
    sliding layers plain; the vLLM and SGLang releases before their fixes scaled them 8×."""
    raw = fixture("gemma-3-12b-it-text")
    found = [f for f in family(raw) if f.code == "sliding-releases"]
    assert [f.engines for f in found] == [("vLLM before the fix of #29111",), ("SGLang before the fix of #21537",)]
    config = AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw))
    if IS_V5:
        assert config.rope_parameters["sliding_attention"]["rope_type"] == "default"
        inv_full, _ = ROPE_INIT_FUNCTIONS["linear"](config, "cpu", layer_type="full_attention")
        slower = (1 / 1e6 ** (torch.arange(0, 256, 2).double() / 256) / inv_full.double()).max().item()
        assert slower == pytest.approx(8.0)
    assert all("up to 8× slower than trained" in f.off and "1024-token window" in f.off for f in found)
    assert "54 % to 72 %" in found[1].off and found[0].fix == "run vLLM with the fix of #29111 or later"


@needs_v5
def test_gemma3_sliding_entry_scaled(tmp_path):
    """A Gemma 3 config keyed by layer type whose sliding entry carries the linear factor:
    transformers (running version) runs it on the sliding layers; the fix restores plain RoPE."""
    raw = {k: v for k, v in fixture("gemma-3-12b-it-text").items() if k not in ("rope_scaling", "rope_theta")}
    raw["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e4}}
    config = AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw))
    assert config.rope_parameters["sliding_attention"]["factor"] == 8.0
    finding, = [f for f in family(raw)]
    assert (finding.code, finding.engines) == ("sliding-scaled", ("transformers 5.x", "vLLM"))
    assert "up to 8× slower" in finding.off and "SGLang's gemma3_causal.py" in finding.off
    entry = json.loads(re.search(r"\"sliding_attention\": (\{.*?\})", finding.fix).group(1))
    assert entry == {"rope_type": "default", "rope_theta": 10000.0}
    fixed = copy.deepcopy(raw)
    fixed["rope_parameters"]["sliding_attention"] = entry
    assert family(fixed) == []


def test_olmo3_long_context(tmp_path):
    """OLMo 3's YaRN entry (4.x layout): transformers (running version) runs the sliding layers
    plain; pre-fix transformers 5 and vLLM ran them at YaRN factor 8, cos/sin × 0.1·ln 8 + 1."""
    found = family(OLMO3)
    assert [f.engines for f in found] == [("transformers 5 before the fix of #41934, #45945",),
                                          ("vLLM before the fix of #29111",)]
    assert all(f"cos/sin × {0.1 * math.log(8) + 1:.4g}" in f.off and "4096-token window" in f.off for f in found)
    if IS_V5:
        config = AutoConfig.from_pretrained(as_checkpoint(tmp_path, OLMO3))
        assert config.rope_parameters["sliding_attention"]["rope_type"] == "default"
        assert config.rope_parameters["full_attention"]["rope_type"] == "yarn"


@needs_v5
def test_olmo3_flat_rope_parameters_lose_the_extension(tmp_path):
    """One flat rope_parameters entry (what a transformers 5 release without the per-layer
    conversion saves): the running transformers fills both layer types with plain RoPE; the
    fix (the entry keyed by layer type) loads as YaRN on the full-attention layers only."""
    flat = {k: v for k, v in OLMO3.items() if k not in ("rope_scaling", "rope_theta")}
    flat["rope_parameters"] = {**OLMO3["rope_scaling"], "rope_theta": 500000}
    loaded = AutoConfig.from_pretrained(as_checkpoint(tmp_path, flat, "flat")).rope_parameters
    assert loaded["full_attention"]["rope_type"] == "default"
    finding, = [f for f in family(flat)]
    assert finding.code == "per-layer-flat" and finding.engines == ("transformers 5.x", "vLLM", "SGLang")
    nested = json.loads(finding.fix.split("\"rope_parameters\": ", 1)[1])
    fixed = {**flat, "rope_parameters": nested}
    loaded = AutoConfig.from_pretrained(as_checkpoint(tmp_path, fixed, "fixed")).rope_parameters
    assert (loaded["full_attention"]["rope_type"], loaded["full_attention"]["factor"]) == ("yarn", 8.0)
    assert loaded["sliding_attention"]["rope_type"] == "default"
    assert family(fixed) == []
    # the 4.x entry kept beside the flat one: transformers refuses the config outright
    both = {**flat, "rope_scaling": OLMO3["rope_scaling"]}
    with pytest.raises(KeyError, match="full_attention"):
        AutoConfig.from_pretrained(as_checkpoint(tmp_path, both, "both"))
    assert "KeyError 'full_attention'" in [f for f in family(both) if f.code == "per-layer-flat"][0].off


def deepseek_yarn_scale(rope: dict, s: float) -> float:
    """vLLM / SGLang DeepseekScalingRotaryEmbedding, written from their source."""
    def get_mscale(scale, m):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    return get_mscale(s, float(rope.get("mscale", 1))) / get_mscale(s, float(rope.get("mscale_all_dim", 0))) \
        * float(rope.get("attn_factor", 1))


def test_deepseek_v3_without_mscale(tmp_path):
    """DeepSeek-V3's YaRN entry with `mscale` left out: transformers (running version) falls back
    to 0.1·ln 40 + 1 on cos/sin, vLLM and SGLang's deepseek_yarn run the pair with mscale = 1."""
    raw = fixture("deepseek-v3")
    del raw["rope_scaling"]["mscale"]
    config = AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw))
    _, hf_scale = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    engine = deepseek_yarn_scale(raw["rope_scaling"], 40.0)
    assert hf_scale == pytest.approx(0.1 * math.log(40) + 1) and engine == 1.0
    found = family(raw)
    assert [f.code for f in found] == ["mla-yarn-scale"] * 3
    assert found[0].engines == ("vLLM 07b12f1 (vLLM 0.29.0)", "vLLM 0cd5784 (vLLM 0.32.0)")
    assert [f.engines for f in found[1:]] == [("SGLang",), ("llama.cpp (main's llama-context.cpp)",)]
    assert f"transformers scales cos/sin by {hf_scale:.6g}" in found[0].message
    assert f"({abs(engine - hf_scale) / hf_scale:.1%} off" in found[0].off
    # the edit named for vLLM keeps transformers' scale and makes vLLM / SGLang run it
    edit = json.loads("{" + re.search(r"set (\"mscale\": [0-9.]+)", found[0].fix).group(1) + "}")
    edited = {**raw, "rope_scaling": {**raw["rope_scaling"], **edit}}
    assert deepseek_yarn_scale(edited["rope_scaling"], 40.0) == pytest.approx(hf_scale, rel=1e-5)
    assert [f.engines for f in family(edited)] == [("llama.cpp (main's llama-context.cpp)",)]
    # DeepSeek's reference reading: state the missing key; every reader then runs 1
    assert "add \"mscale\": 1" in found[0].fix
    assert family(fixture("deepseek-v3")) == []


def test_gpt_oss_truncate_releases(tmp_path):
    """gpt-oss's `truncate: false`: releases that floor/ceil the correction range anyway run the
    ramp the running transformers runs with truncate true (its own yarn init, both ways)."""
    raw = fixture("gpt-oss-20b")
    found = family(raw)
    assert [f.engines for f in found] == [("transformers before #42189",), ("vLLM before #28244",),
                                          ("SGLang before #14270",)]
    config = AutoConfig.from_pretrained(as_checkpoint(tmp_path, raw))
    unrounded, _ = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    rounded_cfg = {**raw, "rope_scaling": {**raw["rope_scaling"], "truncate": True}}
    rounded, _ = ROPE_INIT_FUNCTIONS["yarn"](AutoConfig.from_pretrained(as_checkpoint(tmp_path, rounded_cfg, "r")), "cpu")
    err = ((rounded.double() - unrounded.double()).abs() / unrounded.double()).max().item()
    assert err > 0.5 and all(f"inv_freq up to {err:.1%} off" in f.off for f in found)
    tgi = doctor.diagnose(raw)[0]
    assert tgi.code == "yarn-frequencies" and f"TGI inv_freq up to {err:.1%} off" in tgi.off


def test_phi2_longrope_lists_sized_to_the_head(tmp_path):
    """transformers (running version) builds 16 frequencies for Phi-2's 32 rotary dims and fails
    on 40-value lists; the doctor says so, and a 16-value list is clean."""
    finding, = family(PHI2_LONGROPE)
    assert finding.code == "longrope-factors" and finding.engines == ("every reader",)
    assert "rotary dim is 32 (head dim 80 × partial_rotary_factor 0.4)" in finding.message
    assert "apache/tvm #18102" in finding.message and "give long_factor and short_factor 16 values" in finding.fix
    with pytest.raises(RuntimeError):
        ROPE_INIT_FUNCTIONS["longrope"](AutoConfig.from_pretrained(as_checkpoint(tmp_path, PHI2_LONGROPE)), "cpu")
    fixed = copy.deepcopy(PHI2_LONGROPE)
    fixed["rope_scaling"].update(long_factor=[2.0] * 16, short_factor=[1.0] * 16)
    inv, _ = ROPE_INIT_FUNCTIONS["longrope"](AutoConfig.from_pretrained(as_checkpoint(tmp_path, fixed, "ok")), "cpu")
    assert inv.shape == (16,) and family(fixed) == []


def test_phi3_released_lists_build(tmp_path):
    """The Phi-3 fixture's 48-value lists are what transformers builds its 96-dim rope from."""
    inv, _ = ROPE_INIT_FUNCTIONS["longrope"](
        AutoConfig.from_pretrained(as_checkpoint(tmp_path, fixture("phi-3-mini-128k-instruct"))), "cpu")
    assert inv.shape == (48,)


def test_smollm3_nope_layers_llama_cpp_ignores():
    """SmolLM3 with NoPE on every 3rd layer: transformers' own config keeps the list; llama.cpp's
    fixed step (il + 1) % 4 == 0 rotates the wrong layers; the YaRN entry leaves NoPE layers alone."""
    from transformers import SmolLM3Config

    listed = [int((i + 1) % 3 != 0) for i in range(36)]
    assert SmolLM3Config(num_hidden_layers=36, no_rope_layers=listed).no_rope_layers == listed
    default = SmolLM3Config(num_hidden_layers=36).no_rope_layers   # interval 4: llama.cpp's step
    assert [i for i, r in enumerate(default) if not r] == [i for i in range(36) if (i + 1) % 4 == 0]
    raw = {**fixture("smollm3-3b"), "num_hidden_layers": 36, "no_rope_layers": listed,
           "rope_scaling": {"factor": 2.0, "original_max_position_embeddings": 65536, "type": "yarn"}}
    finding, = family(raw)
    assert finding.code == "nope-layers" and finding.engines == ("llama.cpp (llama-cpp-python 0.3.36)",)
    assert "NoPE layers per config.json are 2, 5, 8, 11" in finding.message
    assert "scales only the rope layers, not these NoPE layers" in finding.message
    assert "rotates NoPE layers 2, 5, 8, 14" in finding.off and "leaves rope layers 3, 7, 15" in finding.off
    assert family({**raw, "no_rope_layers": default}) == []


def test_docs_name_every_finding_code():
    """docs/check.md's Doctor table has one row per finding code the doctor can print, no more."""
    source = "".join((ROOT.parent / "hf_posext" / "portability" / f).read_text()
                     for f in ("doctor.py", "family_doctor.py", "gguf_doctor.py"))
    codes = set(re.findall(r"Finding\(\s*\"([a-z0-9-]+)\"", source))
    doc = (ROOT.parent / "docs" / "check.md").read_text()
    table = set(re.findall(r"^\| `([a-z0-9-]+)` \|", doc.split("## Doctor", 1)[1], re.M))
    assert FAMILY_CODES <= codes and codes == table
    assert set(family_doctor.PER_LAYER.values()) == set(family_doctor.SLIDING_RELEASES)

"""`hf-posext serve`: the command per engine and method, refusals, shell quoting, the override
route; `check`'s max-length line; `export --target sglang` with Dual Chunk Attention.

The references are independent of serving.py: transformers' own rope (a config with the printed
overrides applied the way vLLM applies them, `config.update`) against `hf_posext.patch`; the
YaRN paper's temperature 0.1·ln s + 1 for llama.cpp's attention factor; SGLang's
DualChunkRotaryEmbedding key names and defaults (chunk_size 8192, local_size 1024) as read from
its source (hf_posext/portability/dual_chunk.py). The engines themselves run the printed commands
in tests/engines/test_serve_engines.py.
"""

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch
import transformers
from transformers import LlamaConfig, Qwen2Config, Qwen2ForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import hf_posext
from conftest import TRAINED, tiny_model
from hf_posext import cli
from hf_posext.portability.serving import ServeRefused, command
from hf_posext.portability.verdicts import check, check_report

S = 4.0
T = int(S * TRAINED)
LLAMA_SERVER_FLAGS = {"-m", "-c", "--rope-scaling", "--rope-scale", "--rope-freq-base",
                      "--yarn-orig-ctx", "--yarn-attn-factor", "--yarn-beta-fast", "--yarn-beta-slow"}


def saved(tmp_path, method, arch="llama", **knobs):
    model = tiny_model(arch) if arch != "qwen2" else qwen2()
    if method:
        hf_posext.patch(model, method, S, **knobs)
    path = tmp_path / f"{arch}-{method}"
    model.config.save_pretrained(path)
    return path


def qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                        max_position_embeddings=TRAINED)).eval()


def flags(argv):
    return {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("-") and i + 1 < len(argv)}


def rope_of(config_dict):
    """(inv_freq, attention scale) transformers computes for a config dict."""
    config = LlamaConfig.from_dict(config_dict)
    rope = config.rope_parameters
    init = ROPE_INIT_FUNCTIONS[rope["rope_type"]] if rope["rope_type"] != "default" else None
    if init is None:
        d = config.hidden_size // config.num_attention_heads
        return 1.0 / rope["rope_theta"] ** (torch.arange(0, d, 2).double() / d), 1.0
    inv, scale = init(config, "cpu")
    return inv.double(), float(scale)


@pytest.mark.parametrize("method", ["linear", "ntk", "yarn", "ntk_by_parts"])
def test_vllm_saved_checkpoint_and_quoting(tmp_path, method):
    path = saved(tmp_path, method)
    line = command(path, "vllm").line()
    argv = shlex.split(line)   # the shell reads back exactly the arguments
    assert argv[:3] == ["vllm", "serve", str(path)]
    assert flags(argv)["--max-model-len"] == str(T)
    if "--hf-overrides" in argv:
        overrides = json.loads(flags(argv)["--hf-overrides"])
        # only NTK-by-parts needs one: vLLM 0.28-0.29 read YaRN's scale as attn_factor·(0.1·ln s + 1)
        assert method == "ntk_by_parts" and set(overrides) == {"rope_parameters"}
        rope = overrides["rope_parameters"]
        assert math.isclose(rope["attn_factor"] * (0.1 * math.log(S) + 1), 1.0)
    else:
        assert method != "ntk_by_parts"


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                    reason="the overrides are rope_parameters, read by transformers 5, the major the "
                           "measured vLLM releases run; 4.x reads rope_scaling")
@pytest.mark.parametrize("method", ["linear", "ntk", "yarn", "ntk_by_parts"])
def test_vllm_override_route_is_what_patch_saves(tmp_path, method):
    """The base checkpoint + --hf-overrides, applied as vLLM does (config.update), gives
    transformers the rope `hf_posext.patch` gives the model."""
    base = saved(tmp_path, None)
    serving = command(base, "vllm", method, S)
    argv = shlex.split(serving.line())
    overrides = json.loads(flags(argv)["--hf-overrides"])
    assert overrides["max_position_embeddings"] == T    # what patch saves for a static method
    cfg = json.loads((base / "config.json").read_text())
    cfg.pop("rope_scaling", None)
    cfg.update(overrides)
    got = rope_of(cfg)
    patched = hf_posext.patch(tiny_model(), method, S).config.to_dict()
    want = rope_of(patched)
    assert torch.allclose(got[0], want[0], rtol=1e-12) and math.isclose(got[1], want[1])
    assert not (tmp_path / "llama-None" / "model.safetensors").exists()  # nothing written


def test_override_route_refuses_an_extended_checkpoint(tmp_path):
    with pytest.raises(ServeRefused, match="already extended"):
        command(saved(tmp_path, "yarn"), "vllm", "yarn", S)


@pytest.mark.parametrize("engine,method,why", [
    ("vllm", "dynamic_ntk", "broken"),           # vLLM's dynamic table has L rows
    ("llama.cpp", "dynamic_ntk", "one rope table"),
    ("tgi", "linear", "ignored"),                  # TGI's static() ignores linear's factor
    ("vllm", "dual_chunk", "plain attention"),
    ("sglang", "dual_chunk", "'llama' model file"),
])
def test_refusals(tmp_path, engine, method, why):
    with pytest.raises(ServeRefused, match=why):
        command(saved(tmp_path, method), engine)


def test_refusal_is_one_line_exit_2(tmp_path, capsys):
    path = saved(tmp_path, "dynamic_ntk")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", str(path), "--engine", "vllm"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vllm cannot serve it exactly" in err


def test_llama_cpp_flags_fill_what_the_gguf_lacks(tmp_path):
    # NTK-by-parts: the converter's GGUF runs YaRN's temperature 0.1·ln s + 1, and llama.cpp
    # takes another only from the GGUF key (llama-context.cpp overwrites --yarn-attn-factor)
    path = saved(tmp_path, "ntk_by_parts")
    with pytest.raises(ServeRefused, match="--target gguf"):
        command(path, "llama.cpp")
    # ... which export --target gguf writes (t/(0.1·ln s + 1) = 1/(0.1·ln s + 1)): no flag then
    pytest.importorskip("gguf")
    from test_export_safety import converter_like_gguf
    cfg = json.loads((path / "config.json").read_text())
    converter_like_gguf(tmp_path / "conv.gguf", cfg, cfg["rope_parameters"])
    hf_posext.export(path, tmp_path / "out.gguf", "gguf", gguf=tmp_path / "conv.gguf")
    argv = shlex.split(command(path, "llama.cpp", gguf=str(tmp_path / "out.gguf")).line())
    assert argv == ["llama-server", "-m", str(tmp_path / "out.gguf"), "-c", str(T)]
    # the base checkpoint extended at serve time: every YaRN key from flags
    base = shlex.split(command(saved(tmp_path, None), "llama.cpp", "yarn", S).line())
    assert flags(base)["--rope-scaling"] == "yarn" and float(flags(base)["--rope-scale"]) == S
    assert flags(base)["--yarn-orig-ctx"] == str(TRAINED) and "--yarn-attn-factor" not in base
    # static NTK is plain RoPE on b·s^(d/(d−2)) (bloc97): only the base changes
    d = 16
    ntk = shlex.split(command(saved(tmp_path, None), "llama.cpp", "ntk", S).line())
    assert math.isclose(float(flags(ntk)["--rope-freq-base"]), 1e4 * S ** (d / (d - 2)), rel_tol=1e-9)
    assert "--rope-scaling" not in ntk


def test_sglang_and_tgi(tmp_path):
    argv = shlex.split(command(saved(tmp_path, "yarn"), "sglang").line())
    assert argv[:3] == ["python", "-m", "sglang.launch_server"] and flags(argv)["--context-length"] == str(T)
    base = shlex.split(command(saved(tmp_path, None), "sglang", "yarn", S).line())
    override = json.loads(flags(base)["--json-model-override-args"])
    assert override["rope_scaling"]["rope_type"] == "yarn" and override["max_position_embeddings"] == T
    tgi = shlex.split(command(saved(tmp_path, "yarn"), "tgi").line())
    assert flags(tgi)["--max-total-tokens"] == str(T) and flags(tgi)["--max-input-tokens"] == str(T - 1)
    dyn = shlex.split(command(saved(tmp_path, None), "tgi", "dynamic_ntk", S).line())
    assert flags(dyn)["--rope-scaling"] == "dynamic" and float(flags(dyn)["--rope-factor"]) == S
    with pytest.raises(ServeRefused, match="only --rope-scaling linear|dynamic"):
        command(saved(tmp_path, None), "tgi", "yarn", S)


def test_cli_prints_the_command(tmp_path, capsys):
    path = saved(tmp_path, "yarn")
    assert cli.main(["serve", str(path), "--engine", "vllm"]) == 0
    out = capsys.readouterr().out.strip()
    assert shlex.split(out) == ["vllm", "serve", str(path), "--max-model-len", str(T)]
    # the override route with a knob: the Mistral betas are run-time flags in llama.cpp
    base = saved(tmp_path, None)
    assert cli.main(["serve", str(base), "--engine", "llama.cpp", "--method", "yarn", "--factor",
                     "4", "--knobs", "beta_fast=128,beta_slow=2"]) == 0
    got = flags(shlex.split(capsys.readouterr().out.strip()))
    assert (got["--yarn-beta-fast"], got["--yarn-beta-slow"]) == ("128", "2")


def test_check_names_each_engines_length_flag(tmp_path):
    line = next(x for x in check_report(saved(tmp_path, "linear")).splitlines() if "context length" in x)
    for flag in ("--max-model-len", "--context-length", "-c", "--max-total-tokens"):
        assert f"{flag} {T}" in line
    assert "accept prompts past the target" in line   # vLLM, SGLang derive s²·L for linear


def test_export_sglang_writes_dual_chunk(tmp_path):
    path = saved(tmp_path, "dual_chunk", arch="qwen2")
    out = tmp_path / "dca"
    verdicts = {v.reader: v for v in hf_posext.export(path, out, target="sglang")}
    entry = json.loads((out / "config.json").read_text())["dual_chunk_attention_config"]
    # ChunkLlama's defaults (hf_posext: chunk 3L/4, local L/16) under SGLang's key names
    assert entry == {"chunk_size": 3 * TRAINED // 4, "local_size": TRAINED // 16,
                     "original_max_position_embeddings": T}
    assert verdicts["sglang"].status == "exact"
    assert verdicts["vllm-0cd5784"].status == "lost"
    line = shlex.split(command(path, "sglang").line())
    assert json.loads(flags(line)["--json-model-override-args"]) == {"dual_chunk_attention_config": entry}


def test_sglang_dual_chunk_cells(tmp_path):
    path = saved(tmp_path, "dual_chunk", arch="qwen2")
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for given, status in (({"chunk_size": 3 * TRAINED // 4, "local_size": TRAINED // 16}, "broken"),
                          ({"chunk_size": 8192, "local_size": 1024,     # SGLang's defaults
                            "original_max_position_embeddings": T}, "different"),
                          ({"chunk_size": 3 * TRAINED // 4, "local_size": TRAINED // 16,
                            "original_max_position_embeddings": TRAINED}, "different")):
        cfg_path.write_text(json.dumps({**cfg, "dual_chunk_attention_config": given}))
        assert {v.reader: v for v in check(path)}["sglang"].status == status, given


@pytest.mark.parametrize("arch,method,knobs,why", [
    ("llama", "dual_chunk", {}, "'llama' model file"),
])
def test_export_sglang_dual_chunk_refusals(tmp_path, arch, method, knobs, why):
    with pytest.raises(ValueError, match=why):
        hf_posext.export(saved(tmp_path, method, arch, **knobs), tmp_path / "out", target="sglang")


def test_dual_chunk_over_a_rope_method_is_refused(tmp_path):
    model = hf_posext.patch(qwen2(), "yarn", S)
    path = tmp_path / "q"
    model.config.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["hf_posext_attention"] = {"method": "dual_chunk", "trained_length": TRAINED,
                                  "chunk_size": 48, "local_window": 4, "logn": False}
    cfg["attn_implementation"] = "hf_posext"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="reads no rope_scaling"):
        hf_posext.export(path, tmp_path / "out", target="sglang")


def test_docs_commands(tmp_path, monkeypatch, capsys):
    """Every `hf-posext serve` line of docs/serving.md ("The command per engine") prints, on
    the checkpoints it names, the command shown under it."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    block = re.search(r"<!-- serve-commands -->\s*```\n(.*?)```", doc, re.S).group(1).splitlines()
    monkeypatch.chdir(tmp_path)
    tiny_model().config.save_pretrained("llama-base")
    hf_posext.patch(tiny_model(), "yarn", S).config.save_pretrained("llama-yarn")
    hf_posext.patch(tiny_model(), "ntk_by_parts", S).config.save_pretrained("llama-ntk-by-parts")
    hf_posext.patch(qwen2(), "dual_chunk", S).config.save_pretrained("qwen2-dual-chunk")
    pairs = list(zip(block[::2], block[1::2]))
    assert len(pairs) >= 8 and {shlex.split(c)[shlex.split(c).index("--engine") + 1]
                                for c, _ in pairs} == {"vllm", "sglang", "llama.cpp", "tgi"}
    for shown, output in pairs:
        assert shown.startswith("$ hf-posext serve ")
        assert cli.main(shlex.split(shown)[2:]) == 0
        assert capsys.readouterr().out.strip() == output, shown


def test_sglang_dual_chunk_at_serve_time(tmp_path):
    """A Qwen2 base checkpoint served with DCA by overrides alone: the entry ChunkLlama's defaults
    give (chunk 3L/4, local L/16) and the extended max_position_embeddings (SGLang's key table
    has that many rows)."""
    argv = shlex.split(command(saved(tmp_path, None, arch="qwen2"), "sglang", "dual_chunk", S).line())
    override = json.loads(flags(argv)["--json-model-override-args"])
    assert override == {"max_position_embeddings": T, "dual_chunk_attention_config": {
        "chunk_size": 3 * TRAINED // 4, "local_size": TRAINED // 16,
        "original_max_position_embeddings": T}}
    with pytest.raises(ServeRefused, match="plain attention"):
        command(saved(tmp_path, None, arch="qwen2"), "vllm", "dual_chunk", S)


def test_vllm_longrope_as_search_saves_it(tmp_path):
    """`hf-posext search`'s longrope checkpoint: vLLM scales cos/sin by short_mscale /
    long_mscale (default sqrt(1 + ln(max_position / L) / ln L)), transformers by
    attention_factor; the override sets both to attention_factor (measured exact, §6)."""
    from hf_posext.rope.config import RopeExtensionConfig
    from hf_posext.rope.longrope import LONGROPE_SEED, longrope_knobs
    knobs = longrope_knobs(RopeExtensionConfig(LONGROPE_SEED, S, TRAINED), 16, 10_000.0)
    path = saved(tmp_path, "longrope", **knobs)
    cfg = json.loads((path / "config.json").read_text())
    argv = shlex.split(command(path, "vllm").line())
    rope = json.loads(flags(argv)["--hf-overrides"])["rope_parameters"]
    scale = cfg["rope_parameters"]["attention_factor"]
    assert rope["short_mscale"] == rope["long_mscale"] == scale
    assert flags(argv)["--max-model-len"] == str(T)   # patch saves max_position_embeddings = s·L
    with pytest.raises(ServeRefused, match="transformers' own"):
        command(path, "llama.cpp")

"""`hf-posext check` reads the whole config.json: attention-level
methods are "lost" where they are, contradictions between the layouts / the entry / non-finite
values are reported, and the context length and RoPE-base warnings follow their sources.

References: transformers itself (what it loads, in a process without hf_posext), the engines'
length formulas written here from their source, arXiv 2405.14591's bound."""

import json
import math
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import TRAINED, tiny_model
from transformers import AutoConfig

import hf_posext
from hf_posext.portability import measured
from hf_posext.portability.exporting import export
from hf_posext.portability.verdicts import check, check_report
from hf_posext.rope.compat import IS_V5, get_rope_parameters

pytestmark = pytest.mark.usefixtures("one_thread")
S = 4.0
ENGINES = ("vllm-07b12f1", "vllm-0cd5784", "sglang", "tgi", "llamacpp")


def saved(tmp_path, method, name="ck", weights=False, **knobs):
    model = hf_posext.patch(tiny_model("llama"), method, factor=S, **knobs)
    (model.save_pretrained if weights else model.config.save_pretrained)(tmp_path / name)
    return tmp_path / name


def edit(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        elif isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))  # json writes NaN as NaN, as Python does
    return path


@pytest.mark.parametrize("method, knobs", [
    ("rerope", {}), ("leaky_rerope", {}), ("self_extend", {}), ("dual_chunk", {}), ("logn", {}),
    ("yarn", {"logn": True})])
def test_attention_methods_are_lost_in_every_engine(tmp_path, method, knobs):
    path = saved(tmp_path, method, **knobs)
    got = {v.reader: v for v in check(path)}
    for reader in ENGINES + ("transformers-4",):
        assert got[reader].status == "lost", got[reader]
    assert got["transformers-5"].status == "refused"
    assert "attention method" in check_report(path)
    for target in ("vllm", "sglang", "tgi", "llama.cpp", "transformers", "gguf"):
        with pytest.raises(ValueError, match="export refused: .*attention-level method"):
            export(path, tmp_path / f"out-{target}", target)
        assert not (tmp_path / f"out-{target}").exists()


PLAIN_LOAD = textwrap.dedent("""
    import sys
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
    except ValueError as err:
        print("refused", err)
    else:
        print("loaded", model.config._attn_implementation)
""")


@pytest.mark.slow
def test_transformers_without_hf_posext_does_what_check_says(tmp_path):
    """The running transformers, in a process that never imports hf_posext: 5.x refuses the
    saved attn_implementation, 4.57 loads plain attention (method lost) without a word."""
    path = saved(tmp_path, "rerope", weights=True)
    out = subprocess.run([sys.executable, "-c", PLAIN_LOAD, str(path)], capture_output=True,
                         text=True, timeout=300)
    reader = "transformers-5" if IS_V5 else "transformers-4"
    status = {v.reader: v.status for v in check(path)}[reader]
    if out.stdout.startswith("refused"):
        assert status == "refused" and 'attn_implementation="hf_posext"' in out.stdout
    else:
        assert out.stdout.split() == ["loaded", "sdpa"] and status == "lost", out.stdout + out.stderr


def test_layouts_that_disagree_are_reported_per_reader(tmp_path):
    """factor 8 in rope_parameters, 2 in rope_scaling, no entry: transformers 5.x reads
    rope_scaling (asked of transformers itself), llama.cpp's converter rope_parameters."""
    path = edit(saved(tmp_path, "linear"), hf_posext=None,
                rope_parameters={"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
                rope_scaling={"rope_type": "linear", "factor": 2.0})
    text = check_report(path)
    assert "error: the rope layouts disagree" in text and "factor 8" in text and "factor 2" in text
    assert get_rope_parameters(AutoConfig.from_pretrained(path))["factor"] == 2.0  # 5.x and 4.x
    got = {v.reader: v for v in check(path)}
    assert got["transformers-5" if IS_V5 else "transformers-4"].status == "exact"  # factor 2
    assert got["llamacpp"].status == "different"  # runs factor 8: inv_freq off by 8/2
    assert got["llamacpp"].freq_error == pytest.approx(1 - 2 / 8)


def test_a_longrope_whose_versions_switch_sets_at_different_lengths_is_an_error(tmp_path):
    """Two factor sets: patch writes L at the top level too, so both majors switch at L; without
    it, transformers 4.x switches at max_position_embeddings (s·L), asked of the running
    transformers' own longrope init at L + 1 tokens."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    short, long = [1.0] * 8, [1.0 + 0.5 * i for i in range(8)]
    path = saved(tmp_path, "longrope", short_factor=short, long_factor=long, attention_factor=1.0)
    assert json.loads((path / "config.json").read_text())["original_max_position_embeddings"] == TRAINED
    assert "longrope switches" not in check_report(path)
    edit(path, original_max_position_embeddings=None)
    text = check_report(path)
    assert (f"switches from short_factor to long_factor above {TRAINED} tokens in transformers 5.x"
            in text and f"but above {int(S * TRAINED)} in 4.x" in text)
    config = AutoConfig.from_pretrained(path)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=TRAINED + 1)
    used = (1.0 / (inv_freq.double() * 10_000.0 ** (torch.arange(0, 16, 2).double() / 16))).tolist()
    assert used == pytest.approx(long if IS_V5 else short, rel=1e-5)
    edit(path, original_max_position_embeddings=TRAINED)
    text = check_report(path, view=measured.overlay)   # as `hf-posext check` prints it
    # vLLM runs long_factor below L too (benchmarks/results/engine_short_factors.md): the one-set
    # measurement is not shown for two sets, and the warning says what differs
    assert "warning: two longrope factor sets" in text and "(measured)" in text
    assert "exact" not in text.split("vLLM 0.32.0 (measured)")[1].splitlines()[0]
    edit(path, rope_parameters={"short_factor": long}, rope_scaling={"short_factor": long})
    text = check_report(path)
    assert "longrope switches" not in text and "two longrope factor sets" not in text  # one set


def test_an_entry_edited_against_the_rope_config_is_an_error(tmp_path):
    """check reports what hf_posext's own loader refuses (the entry says 4, the rope 2)."""
    path = edit(saved(tmp_path, "yarn", weights=True), rope_scaling={"factor": 2.0},
                rope_parameters={"factor": 2.0})
    text = check_report(path)
    assert "error: for" in text and "config.hf_posext describes 'yarn' (factor 4)" in text
    with pytest.raises(ValueError, match=r"config.hf_posext describes 'yarn' \(factor 4\)"):
        hf_posext.from_pretrained(path)


def test_a_nan_factor_is_an_error_not_a_verdict(tmp_path, run_cli):
    path = edit(saved(tmp_path, "linear"), hf_posext=None,
                rope_parameters={"factor": float("nan")}, rope_scaling={"factor": float("nan")})
    with pytest.raises(ValueError, match="non-finite values in config.json: rope_parameters.factor"):
        check_report(path)
    code, _, err = run_cli(["check", path])
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "non-finite" in err


def vllm_max_model_len(cfg):
    """vllm/config/model.py `_get_and_verify_max_len`, written from its source."""
    keys = ["max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
            "model_max_length", "max_sequence_length", "max_seq_length", "seq_len"]
    length = min(cfg[k] for k in keys if k in cfg)
    rope = cfg.get("rope_scaling")
    if rope and rope["rope_type"] not in ("su", "longrope", "llama3"):
        if rope["rope_type"] == "yarn":
            length = rope["original_max_position_embeddings"]
        length *= rope.get("factor", 1.0)
    return int(length)


@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic_ntk", "yarn"])
def test_context_length_each_engine_derives(tmp_path, method):
    path = saved(tmp_path, method)
    cfg = json.loads((path / "config.json").read_text())
    line = next(line for line in check_report(path).splitlines() if "context length" in line)
    target = int(S * TRAINED)
    assert f"targets {target} tokens" in line
    assert f"vLLM (max_model_len) {vllm_max_model_len(cfg)}" in line
    # linear: the patcher raised max_position_embeddings to s·L, and vLLM multiplies it by s again
    assert (vllm_max_model_len(cfg) != target) == (method == "linear")
    # linear: vLLM and SGLang derive s²·L; dynamic NTK: llama.cpp's n_ctx_train is L
    assert ("not the target" in line) == (method in ("linear", "dynamic_ntk"))


def test_rope_base_bound_warning(tmp_path):
    """arXiv 2405.14591: base >= 0.0424·T^1.628. T = 4·2048 = 8192 needs ~1.0e5; static NTK
    raises 10000 to 10000·4^(16/14) ≈ 48,700: still below; from 1e6 it is far above. YaRN
    interpolates instead of changing the base: not compared."""
    bound = 0.0424 * 8192 ** 1.628
    for method, base, warned in (("ntk", 10_000.0, True), ("ntk", 1e6, False),
                                 ("yarn", 10_000.0, False)):
        model = hf_posext.patch(tiny_model("llama", max_position_embeddings=2048, rope_theta=base),
                                method, factor=S)
        model.config.save_pretrained(tmp_path / f"{method}{base}")
        text = check_report(tmp_path / f"{method}{base}")
        assert ("arXiv 2405.14591" in text) == warned, text
        if warned:
            raised = base * S ** (16 / 14)
            assert f"RoPE base {raised:.4g} is below" in text
            assert f"{bound:.3g}" in text and "T = 8192" in text
    assert math.isclose(bound, 1.0e5, rel_tol=0.01)


MARKER = "import pathlib; pathlib.Path({!r}).write_text('ran')"


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (MARKER.format(self.marker),))


def test_check_and_export_never_unpickle_or_import_the_checkpoint(tmp_path):


    path = saved(tmp_path, "yarn")
    marker = tmp_path / "ran"
    (path / "pytorch_model.bin").write_bytes(pickle.dumps(Evil(str(marker))))
    edit(path, auto_map={"AutoModelForCausalLM": "evil.Model"})
    (path / "evil.py").write_text(MARKER.format(str(marker)))
    text = check_report(path)
    assert "pytorch_model.bin are pickles" in text and "auto_map" in text
    export(path, tmp_path / "out", "vllm")
    assert not marker.exists()
    assert (tmp_path / "out" / "pytorch_model.bin").read_bytes() == (path / "pytorch_model.bin").read_bytes()

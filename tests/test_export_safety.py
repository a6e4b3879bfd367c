"""`export` writes atomically and refuses bad outputs in one line, and
`--target gguf` writes the keys llama.cpp's runtime reads.

The GGUF references: llama.cpp's runtime formula (src/llama-context.cpp: the YaRN cos/sin scale is
ggml's 1 + 0.1·ln s times `{arch}.rope.scaling.attn_factor`; src/llama-model.cpp reads no
yarn_* key for Llama) written here, and the converter's key set (conversion/base.py
`set_gguf_parameters`) reproduced with gguf's own writer."""

import errno
import json
import math
import shutil

import numpy as np
import pytest
from conftest import TRAINED, tiny_model

import hf_posext
from hf_posext.portability import atomic, exporting
from hf_posext.portability.exporting import export

pytestmark = pytest.mark.usefixtures("one_thread")
S = 4.0
MISTRAL = {"beta_fast": 128, "beta_slow": 2, "mscale_coefficient": 0.07}


def saved(tmp_path, method="yarn", name="ck", **knobs):
    model = hf_posext.patch(tiny_model("llama"), method, factor=S, **knobs)
    model.save_pretrained(tmp_path / name)
    return tmp_path / name


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_failure_mid_write_leaves_nothing(tmp_path, monkeypatch):
    path = saved(tmp_path)

    def copy_then_fill_the_disk(src, dst, **kwargs):
        dst.mkdir(parents=True)
        (dst / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(exporting.shutil, "copytree", copy_then_fill_the_disk)
    with pytest.raises(OSError, match="cannot write .*out: no space left on the device; nothing was written"):
        export(path, tmp_path / "out", "vllm")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    monkeypatch.undo()
    export(path, tmp_path / "out", "vllm")  # the rerun is not blocked
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (path / "model.safetensors").read_bytes()


def test_a_failure_in_the_config_rewrite_leaves_nothing(tmp_path, monkeypatch):
    path = saved(tmp_path, "ntk_by_parts")
    monkeypatch.setattr(exporting.json, "dumps", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        export(path, tmp_path / "out", "vllm")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_read_only_place_is_one_line(tmp_path, monkeypatch):
    path = saved(tmp_path)

    def refuse(*args, **kwargs):  # the tests may run as root, for whom chmod does not refuse
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(atomic.tempfile, "mkdtemp", refuse)
    with pytest.raises(OSError, match="permission denied; nothing was written") as err:
        export(path, tmp_path / "out", "vllm")
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_bad_outputs_are_refused_before_writing(tmp_path):
    path = saved(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        export(path, tmp_path / "file", "vllm")
    with pytest.raises(ValueError, match="inside the checkpoint"):
        export(path, path / "sub", "vllm")
    with pytest.raises(ValueError, match="inside the checkpoint"):
        export(path, path, "vllm")
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "generation_config.json",
                                                      "model.safetensors"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export(path, tmp_path / "no" / "such" / "out", "vllm")
    (tmp_path / "empty").mkdir()  # an empty folder is a fine output
    export(path, tmp_path / "empty", "vllm")
    assert (tmp_path / "empty" / "config.json").exists()


def test_cli_export_errors_are_one_line(tmp_path, run_cli):
    path = saved(tmp_path)
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", path / "inside"):
        code, _, err = run_cli(["export", path, out, "--target", "vllm"])
        assert code != 0 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("hf-posext export: error:")


# ---- --target gguf -------------------------------------------------------------------------

gguf = pytest.importorskip("gguf")


def converter_like_gguf(path, cfg, rope):
    """What llama.cpp's converter writes for a Llama yarn config (conversion/base.py): the
    yarn_* keys, which the runtime does not read for Llama; two tensors stand for the weights."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if "attention_factor" in rope:
        w.add_rope_scaling_yarn_attn_factor(rope["attention_factor"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "<s>"])
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": rng.standard_normal((3, 8), dtype=np.float32),
               "blk.0.attn_q.weight": rng.standard_normal((8, 8), dtype=np.float32)}
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def fields(path):
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items()}, {t.name: np.array(t.data) for t in reader.tensors}


@pytest.mark.parametrize("method, knobs, temperature, flags", [
    ("ntk_by_parts", {}, 1.0, {}),
    ("yarn", MISTRAL, 0.07 * math.log(S) + 1, {"yarn_beta_fast": 128, "yarn_beta_slow": 2}),
    ("yarn", {}, 0.1 * math.log(S) + 1, {})])
def test_gguf_carries_the_keys_the_runtime_reads(tmp_path, method, knobs, temperature, flags):
    path = saved(tmp_path, method, **knobs)
    cfg = json.loads((path / "config.json").read_text())
    tensors = converter_like_gguf(tmp_path / "conv.gguf", cfg, cfg["rope_parameters"])
    got_flags = export(path, tmp_path / "out.gguf", "gguf", gguf=tmp_path / "conv.gguf")
    keys, written = fields(tmp_path / "out.gguf")
    # llama-context.cpp: scale = (1 + 0.1·ln s) · attn_factor must be the method's temperature
    assert (1 + 0.1 * math.log(S)) * keys["llama.rope.scaling.attn_factor"] == pytest.approx(temperature, rel=1e-6)
    assert keys["llama.rope.scaling.type"] == "yarn" and keys["llama.rope.scaling.factor"] == S
    assert keys["llama.rope.scaling.original_context_length"] == TRAINED
    assert not [k for k in keys if "yarn_" in k]  # what the runtime ignores is not left to mislead
    assert got_flags == flags
    assert keys["tokenizer.ggml.tokens"] == ["a", "b", "<s>"]  # everything else copied
    assert set(written) == set(tensors)
    for name, data in tensors.items():
        np.testing.assert_array_equal(written[name].reshape(data.shape), data)


def test_gguf_refusals(tmp_path):
    path = saved(tmp_path, "dynamic_ntk")
    with pytest.raises(ValueError, match="length-dependent method"):
        export(path, tmp_path / "out.gguf", "gguf", gguf=tmp_path / "missing.gguf")
    path = saved(tmp_path, "yarn", name="y")
    with pytest.raises(ValueError, match="pass it with --gguf"):
        export(path, tmp_path / "out.gguf", "gguf")
    other = dict(json.loads((path / "config.json").read_text()), num_hidden_layers=7)
    converter_like_gguf(tmp_path / "other.gguf", other, other["rope_parameters"])
    with pytest.raises(ValueError, match="not converted from this checkpoint: llama.block_count = 7"):
        export(path, tmp_path / "out.gguf", "gguf", gguf=tmp_path / "other.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        export(path, tmp_path / "out.gguf", "gguf", gguf=tmp_path / "junk.gguf")
    assert not (tmp_path / "out.gguf").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_cli_gguf_prints_the_run_time_flags(tmp_path, run_cli):
    path = saved(tmp_path, "yarn", **MISTRAL)
    cfg = json.loads((path / "config.json").read_text())
    converter_like_gguf(tmp_path / "conv.gguf", cfg, cfg["rope_parameters"])
    code, out, err = run_cli(["export", path, tmp_path / "out.gguf", "--target", "gguf",
                              "--gguf", tmp_path / "conv.gguf"])
    assert code == 0, err
    assert "--yarn-beta-fast 128 --yarn-beta-slow 2" in out
    assert "yarn_beta_fast=128, yarn_beta_slow=2" in out
    shutil.rmtree(path)

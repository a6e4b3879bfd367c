"""`--dtype auto` (hf_posext/commands/auto_dtype.py): no probe without bf16 CPU flags, the probe's
verdict followed with them (10 % faster or float32), a GGUF kept packed exactly where
transformers keeps it (its `kernels` check and GGUF_ARCHS) and dequantised otherwise, and the
probe's shapes read from a GGUF's own metadata (written by the gguf package)."""

import pytest
import transformers

from _evalkit import no_probe, probe
from hf_posext.commands import auto_dtype
from hf_posext.commands.auto_dtype import fast_dtype


def test_auto_dtype_without_bf16_flags_measures_nothing(tmp_path, monkeypatch):
    cpu = tmp_path / "cpuinfo"
    cpu.write_text("flags\t\t: fpu sse2 avx2 avx512f\n")
    monkeypatch.setattr(auto_dtype, "probe_times", no_probe)
    assert fast_dtype("cpu", str(cpu)) == "float32"
    assert fast_dtype("cpu", str(tmp_path / "none")) == "float32"      # no /proc/cpuinfo
    cpu.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    assert fast_dtype("cuda:0", str(cpu)) == "bfloat16"                # a GPU: no probe either
    assert fast_dtype("mps", str(cpu)) == "float32"                    # nor elsewhere


@pytest.mark.parametrize("float32, bfloat16, chosen", [
    (1.0, 0.5, "bfloat16"),      # 2x faster
    (1.0, 1 / 1.2, "bfloat16"),  # 20 % faster
    (1.0, 1 / 1.05, "float32"),  # 5 % faster: under the 10 % the rule asks
    (1.0, 1.45, "float32"),      # slower (a Xeon with avx512_bf16, no AMX)
])
def test_auto_dtype_with_bf16_flags_follows_the_probe(float32, bfloat16, chosen, tmp_path, monkeypatch,
                                                       capsys):
    cpu = tmp_path / "cpuinfo"
    cpu.write_text("flags\t\t: fpu avx512f amx_bf16\n")
    monkeypatch.setattr(auto_dtype, "probe_times", probe(float32, bfloat16))
    assert fast_dtype("cpu", str(cpu)) == chosen
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"--dtype auto: {chosen} (") and f"{bfloat16 * 1e3:.1f} ms" in line, line


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                    reason="transformers 4.x has no packed GGUF path (see the 4.x test below)")
@pytest.mark.parametrize("kernels, kernel, packed", [
    (True, object(), True),    # `kernels` installed and a GGUF kernel published: kept packed
    (True, False, False),      # installed, no kernel for this machine: dequantised
    (False, None, False),      # not installed: dequantised, and the Hub is not asked
])
def test_auto_dtype_gguf_packed_follows_transformers(kernels, kernel, packed, tmp_path, monkeypatch):
    import transformers.integrations.gguf.kernels as gguf_kernels
    import transformers.utils.import_utils as import_utils
    cpu = tmp_path / "cpuinfo"
    cpu.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    monkeypatch.setattr(import_utils, "is_kernels_available", lambda: kernels)
    monkeypatch.setattr(gguf_kernels, "get_gguf_kernel",
                        (lambda: kernel) if kernel is not None else (lambda: pytest.fail("Hub asked")))
    monkeypatch.setattr(auto_dtype, "probe_times", no_probe if packed else probe(1.0, 0.5))
    assert fast_dtype("cpu", str(cpu), gguf=True) == ("float32" if packed else "bfloat16")


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) >= 5, reason="transformers 4.x only")
def test_auto_dtype_gguf_is_dequantised_on_transformers_4(tmp_path, monkeypatch):
    cpu = tmp_path / "cpuinfo"
    cpu.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    monkeypatch.setattr(auto_dtype, "probe_times", probe(1.0, 0.5))
    assert fast_dtype("cpu", str(cpu), gguf=True) == "bfloat16"


def write_gguf(path, arch: str, quantized: bool):
    """A GGUF under llama.cpp's keys (written by the gguf package, not by transformers): hidden
    64, MLP 96, 4 heads, no key_length; one tensor, Q8_0 blocks or float32."""
    gguf = pytest.importorskip("gguf")
    import numpy as np
    w = gguf.GGUFWriter(str(path), arch)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    data = np.ones((4, 64), dtype=np.float32)
    if quantized:
        q8 = gguf.GGMLQuantizationType.Q8_0
        w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(data, q8), raw_dtype=q8)
    else:
        w.add_tensor("blk.0.attn_q.weight", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                    reason="transformers 4.x has no GGUF metadata reader (its GGUFs get the defaults)")
def test_auto_inputs_of_a_gguf_read_its_metadata(tmp_path, monkeypatch):
    write_gguf(tmp_path / "m.gguf", "llama", quantized=True)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: pytest.fail("read"))
    assert auto_dtype.auto_inputs(str(tmp_path), "m.gguf") == {
        "gguf": True, "gguf_path": str(tmp_path / "m.gguf"),
        "shapes": auto_dtype.ProbeShapes(64, 96, 4, 64 // 4)}


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 5 only")
def test_auto_dtype_gguf_packed_needs_transformers_packed_path(tmp_path, monkeypatch):
    """With `kernels` and a kernel at hand, a GGUF stays packed only for an architecture of
    transformers' packed path (its GGUF_ARCHS) whose file holds quantized tensors."""
    import transformers.integrations.gguf.kernels as gguf_kernels
    import transformers.utils.import_utils as import_utils
    from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    monkeypatch.setattr(import_utils, "is_kernels_available", lambda: True)
    monkeypatch.setattr(gguf_kernels, "get_gguf_kernel", lambda: object())
    packed_arch = next(iter(GGUF_ARCHS))
    assert auto_dtype.gguf_kept_packed(str(write_gguf(tmp_path / "a.gguf", packed_arch, True)))
    assert not auto_dtype.gguf_kept_packed(str(write_gguf(tmp_path / "b.gguf", packed_arch, False)))
    assert not auto_dtype.gguf_kept_packed(str(write_gguf(tmp_path / "c.gguf", "no-such-arch", True)))


@pytest.mark.slow
@pytest.mark.skipif(transformers.__version__.startswith("4."), reason="transformers 4.x has no packed GGUF path")
def test_bfloat16_gguf_load_prints_no_float32_advice_when_dequantised(caplog):
    """The embedded GGUF in bfloat16 on a machine without a GGUF kernel: transformers dequantises
    it (the model computes in bfloat16) but first advises float32 (quantizer_gguf.py warns in
    `update_dtype`, before `validate_environment` decides to dequantise). The advice would
    contradict `--dtype auto`'s measured choice, so the command's loader drops it; a plain
    transformers load still shows it (the filter is scoped to our load)."""
    import logging

    import torch

    from hf_posext.commands.model_args import ModelSpec, load_model_from
    from hf_posext.data.embedded import DEFAULT_MODEL, load_model
    if auto_dtype.gguf_kept_packed(None):
        pytest.skip("a GGUF kernel exists here: the weights stay packed and the advice is true")
    advice = "is fastest in float32"
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            model = load_model_from(ModelSpec(DEFAULT_MODEL, dtype="bfloat16"))
        assert next(model.parameters()).dtype == torch.bfloat16
        assert advice not in caplog.text
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            load_model(name=DEFAULT_MODEL, dtype=torch.bfloat16)
        assert advice in caplog.text   # transformers' own load: unchanged
    finally:
        transformers.logging.disable_propagation()

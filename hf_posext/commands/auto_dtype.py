"""`--dtype auto`: bfloat16 where it is the faster dtype, measured on the machine.

A CPU's bf16 flags say only that oneDNN *can* run bf16 matmuls natively, not that they are faster:
on a Xeon with avx512_bf16 and no AMX the embedded SmolLM2-135M runs a 2,048-token forward in
6.4 s in bfloat16 against 4.4 s in float32, while a Zen 4 runs it 1.7x faster in bfloat16. So on
a CPU with the flags the choice comes from a short probe of the kernels a decoder forward spends
its time in, at the model's shapes (`benchmarks/archive/dtype_speed.py` compares it with a full forward).
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.embedded import resolve_model

# bfloat16 must beat float32 by this much to be chosen: a smaller lead is within the probe's
# noise on a loaded machine, and float32 is the more exact of the two.
MIN_SPEEDUP = 1.10
PROBE_ROWS = 512       # tokens through the linear (a prefill chunk)
PROBE_TOKENS = 1024    # the causal attention's length
PROBE_REPS = 3         # best of, after one warm-up call (oneDNN builds its kernel on the first)


@dataclass(frozen=True)
class ProbeShapes:
    """The decoder sizes the probe runs at; the defaults are the embedded SmolLM2-135M's
    (hidden 576, MLP 1536, 9 heads of 64), used where the sizes are not read before the weights
    (a GGUF under transformers 4.x, a GGUF key missing)."""
    hidden: int = 576
    intermediate: int = 1536
    heads: int = 9
    head_dim: int = 64

    @classmethod
    def of(cls, config) -> ProbeShapes:
        """From a (text) config: Llama-style names; a missing MLP size is taken as 4x hidden
        (GPT-2's ratio), a missing head_dim as hidden / heads (transformers' own default)."""
        hidden, heads = config.hidden_size, config.num_attention_heads
        return cls(hidden, getattr(config, "intermediate_size", None) or 4 * hidden, heads,
                   getattr(config, "head_dim", None) or hidden // heads)


def auto_inputs(model: str, gguf_file: str | None = None, revision: str | None = None) -> dict:
    """`fast_dtype`'s keywords for a model, read without its weights: the sizes from config.json,
    or for a GGUF from its metadata (transformers 5's reader, tens of ms; `AutoConfig` on the
    embedded GGUF takes seconds) under llama.cpp's keys (`{arch}.embedding_length`, ...), and
    the GGUF's path. transformers 4.x has no such reader: its GGUFs get the default sizes."""
    path, gguf = resolve_model(model, gguf_file)
    hub = {"revision": revision} if revision else {}
    if not gguf:
        from transformers import AutoConfig

        from ..rope.compat import text_config
        return {"shapes": ProbeShapes.of(text_config(AutoConfig.from_pretrained(path, **hub)))}
    local = Path(path) / gguf
    if not local.is_file():   # a Hub id: the file `check_model_arg` already fetched
        from transformers.utils import cached_file
        local = Path(cached_file(path, gguf, **hub))
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata
    except ImportError:
        return {"gguf": True, "gguf_path": str(local)}
    meta = read_gguf_metadata(str(local))[0]
    arch, d = meta["general.architecture"], ProbeShapes()

    def key(name: str, default: int) -> int:
        value = meta.get(f"{arch}.{name}", default)
        return int(max(value) if isinstance(value, (list, tuple)) else value)   # per-layer lists
    hidden, heads = key("embedding_length", d.hidden), key("attention.head_count", d.heads)
    shapes = ProbeShapes(hidden, key("feed_forward_length", 4 * hidden), heads,
                         key("attention.key_length", hidden // heads))
    return {"gguf": True, "gguf_path": str(local), "shapes": shapes}


def bf16_matmul_cpu(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU flags name bfloat16 matrix instructions (AVX512-BF16 or AMX-BF16);
    without them bf16 is emulated and slower than float32, so there is nothing to measure."""
    try:
        with open(cpuinfo) as f:
            flags = {w for line in f if line.startswith("flags") for w in line.split()}
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def gguf_kept_packed(gguf_path: str | None = None) -> bool:
    """Whether transformers will keep a GGUF's weights packed (its kernels then compute in
    float32, so bfloat16 only adds casts: quantizer_gguf.py `update_dtype`). The conditions of
    quantizer_gguf.py `read_header` / `validate_environment`, through its own functions: an
    architecture its packed path handles (`is_gguf_arch_supported`; the others go to the legacy
    loader, which dequantises), quantized tensors in the file, `kernels` importable in a
    supported version and a GGUF kernel published for the machine (`get_gguf_kernel`, cached
    there, so the load does not ask again). Without the file's path only the kernel condition is
    checked (a GGUF then counts as packed when a kernel exists: the float32 side). transformers
    4.x has no packed path (no integrations/gguf/): a GGUF is always dequantised at load."""
    try:
        from transformers.integrations.gguf.kernels import get_gguf_kernel
        from transformers.integrations.gguf.reader import GgufHeader
        from transformers.integrations.gguf.utils import is_gguf_arch_supported
        from transformers.utils.import_utils import is_kernels_available
    except ImportError:
        return False
    if gguf_path is not None:
        header = GgufHeader.from_file(gguf_path)
        if not (is_gguf_arch_supported(header.architecture) and header.has_quantized_weights):
            return False
    # is_kernels_available first: get_gguf_kernel asks the Hub for the kernel
    return bool(is_kernels_available() and get_gguf_kernel())


def _decoder_kernels(dtype: torch.dtype, shapes: ProbeShapes):
    """A call running an MLP-sized linear ([PROBE_ROWS, hidden] x [hidden, intermediate]) and a
    causal SDPA of PROBE_TOKENS over the model's heads: most of a CPU forward's time."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, shapes.hidden, generator=gen).to(dtype)
    w = torch.randn(shapes.intermediate, shapes.hidden, generator=gen).to(dtype)
    q, k, v = (torch.randn(1, shapes.heads, PROBE_TOKENS, shapes.head_dim, generator=gen).to(dtype)
               for _ in range(3))

    def call() -> None:
        F.linear(x, w)
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return call


@functools.cache
def probe_times(shapes: ProbeShapes) -> dict[str, float]:
    """Best-of-PROBE_REPS seconds of the decoder kernels per dtype, once per process and shapes;
    the dtypes alternate so that a change in the machine's load falls on both."""
    calls = {name: _decoder_kernels(getattr(torch, name), shapes) for name in ("float32", "bfloat16")}
    best = dict.fromkeys(calls, float("inf"))
    with torch.no_grad():
        for call in calls.values():
            call()
        for _ in range(PROBE_REPS):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def choose_dtype(device: str, cpuinfo: str = "/proc/cpuinfo", gguf: bool = False,
                 shapes: ProbeShapes = ProbeShapes(), gguf_path: str | None = None) -> tuple[str, str]:
    """(dtype, why) of `--dtype auto`: see `fast_dtype`."""
    if gguf and gguf_kept_packed(gguf_path):
        return "float32", "GGUF weights kept packed: transformers' kernels compute in float32"
    if device.startswith(("cuda", "xpu")):
        return "bfloat16", "GPU"
    if device != "cpu":
        return "float32", f"{device} is neither a CUDA / XPU GPU nor the CPU"
    if not bf16_matmul_cpu(cpuinfo):
        return "float32", "no bf16 matmul instructions (avx512_bf16 / amx_bf16)"
    t = probe_times(shapes)
    f32, bf16 = t["float32"] * 1e3, t["bfloat16"] * 1e3
    probe = f"{bf16:.1f} ms vs {f32:.1f} ms probe"
    if f32 >= MIN_SPEEDUP * bf16:
        return "bfloat16", f"bfloat16 {f32 / bf16:.2f}x faster on this CPU: {probe}"
    if bf16 >= f32:
        return "float32", f"bfloat16 {bf16 / f32:.2f}x slower on this CPU: {probe}"
    return "float32", (f"bfloat16 only {f32 / bf16:.2f}x faster on this CPU, under "
                       f"{MIN_SPEEDUP:.2f}x: {probe}")


def fast_dtype(device: str, cpuinfo: str = "/proc/cpuinfo", gguf: bool = False,
               shapes: ProbeShapes = ProbeShapes(), gguf_path: str | None = None) -> str:
    """`--dtype auto`: float32 for a GGUF transformers keeps packed (`gguf_kept_packed`);
    bfloat16 on a GPU; float32 on a CPU without bf16 matmul instructions (nothing measured);
    on a CPU with them, bfloat16 only if the probe (`probe_times`, ~0.5 s for the embedded
    model, once per process) runs it at least MIN_SPEEDUP faster. Prints what it chose and why.
    `auto_inputs(model, gguf_file)` gives the keywords after `device` for a model."""
    dtype, why = choose_dtype(device, cpuinfo, gguf, shapes, gguf_path)
    print(f"--dtype auto: {dtype} ({why})", file=sys.stderr)
    return dtype

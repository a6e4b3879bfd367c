"""One unit per attention-level method: its knobs (`rope.knobs.Knob` specs: type, the authors'
default as a function of the trained length L (docs/attention_methods.md), check, help and, for
a knob that also takes "auto", its fit to the target length), whether log-n query scaling is on by default, its
plan (which key parts a query chunk attends to, plans.py), whether its positions depend on a
token's absolute index (then left padding must be undone), and any check of its own.
`AttentionExtensionConfig` (its knob fields and checks), the kernel's plan and the padding rule
read them from here; adding a method, with new knobs, is one entry (its position maps are plain
functions of positions.py; tests/test_units.py adds a toy method and its knob that way).
"""

from __future__ import annotations

import math

import torch
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable

from ..errors import BeyondReach, plain_number
from ..rope.knobs import Knob, flag, tokens
from . import positions as P
from .plans import DualChunkPlan, WindowPlan


def _count(name: str, value: Any) -> int:
    """A number of tokens, 0 allowed (no local window / no restart offset)."""
    return 0 if value == 0 and not isinstance(value, bool) else tokens(name, value)


def _within(name: str, authors: str, share: Callable[[int], int]) -> Callable[[Any, int | None], int]:
    """A positive number of tokens at most L (positions past L were never trained)."""
    def check(value: Any, L: int | None) -> int:
        value = tokens(name, value)
        if L is not None and value > L:
            raise ValueError(f"{name}={value} exceeds the trained length {L}; the authors use "
                             f"{authors} = {share(L)}.")
        return value
    return check


def _window(value: Any, L: int | None) -> int:
    value = tokens("window", value)
    if L is not None and value > L:
        raise ValueError(f"window={value} exceeds the trained length {L}: relative positions up "
                         f"to the window must have been trained. Use <= {L}.")
    return value


def _leak(value: Any, L: int | None) -> float:
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 1:
        raise ValueError(f"leak (leaky ReRoPE's k) must be a number > 1 (k = 1 is plain RoPE; the "
                         f"authors use 16), got {value!r}")
    return float(value)


# "auto" (the knob's `auto` fit): fitted to the target length T = s·L so that the farthest relative
# position a T-token input produces stays trained (<= L − 1). `spec`: the validated config.
def _fit_leak(spec, L: int, T: int) -> float:
    """Leaky ReRoPE: w + (T − 1 − w)/k <= L − 1, so k = (T − 1 − w)/(L − 1 − w), at least 1 (up
    to L nothing is compressed)."""
    w = spec.window
    return max(1.0, (T - 1 - w) / (L - 1 - w)) if w < L - 1 else 1.0


def _fit_group(spec, L: int, T: int) -> int:
    """Self-Extend: the smallest integer G >= 1 with ⌊(T − 1)/G⌋ + W − W/G <= L − 1 (the farthest
    grouped position stays trained; LongLM's README advises a margin, W + (T − W)/G below
    L/2 … 2L/3: give G yourself for that)."""
    W = spec.window
    # ⌊x⌋ > x − 1, so any G meeting the bound has G > (T − 1 − W)/(L − W): start there (the loop
    # then runs about T/L² <= MAX_FACTOR/L steps, not T/L: config.py bounds T by MAX_FACTOR·L).
    G = max(1, (T - 1 - W) // (L - W)) if L > W else 1
    while (T - 1) // G + W - W / G > L - 1:
        G += 1
    return G


# The knobs, each declared once (a unit may give one its own default with `replace`).
WINDOW = Knob("window", int, lambda L: L // 8, _window,
              "rerope / leaky_rerope: relative positions below it are exact; self_extend: the "
              "neighbour window W. At most L")
LEAK = Knob("leak", float, 16.0, lambda v, L: _leak(v, L),
            "leaky_rerope's k > 1: beyond the window, relative positions grow with slope 1/k; "
            "auto: fitted to the target length", auto=_fit_leak)
GROUP_SIZE = Knob("group_size", int, 8, lambda v, L: tokens("group_size", v),
                  "self_extend's G >= 1: distant positions are floor(p / G); auto: fitted to the "
                  "target length", auto=_fit_group)
# log-n query scaling, every attention method's and, on top, any rope method's (`logn=True`);
# a unit gives its own default (AttentionMethod.logn), a rope method's is off.
LOGN_SCALING = flag("logn", "scale each query by max(1, log n / log L) (n = its position + 1)")


def _group_scales(value: Any, L: int | None) -> tuple[int, ...]:
    """DPE's scale of each dimension group: integers >= 1 (the reference floor-divides positions
    by them, `query_position // i`), one per group, groups in rotary-frequency order."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"group_scales must be a non-empty list of integers >= 1, one per "
                         f"dimension group (e.g. [2, 8, 2, 8, 32, 32, 32, 4]; hf-posext dpe-detect "
                         f"finds them), got {value!r}")
    return tuple(tokens(f"group_scales[{g}]", s) for g, s in enumerate(value))


def _key_dims(value: Any, L: int | None) -> tuple | None:
    """DPE's key dimensions: per layer, per query head, the rotary components (0 .. d/2 − 1)
    whose positions are scaled; None: every component (the reference's default)."""
    if value is None:
        return None
    def seq(v, what):
        if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
            raise ValueError(f"key_dims must be a list per layer of a list per head of rotary "
                             f"component indices (hf-posext dpe-detect --top-dims writes it), "
                             f"but {what} is {v!r}")
        return v
    return tuple(tuple(tuple(_count(f"key_dims[{li}][{h}]", c) for c in seq(head, f"key_dims[{li}][{h}]"))
                       for h, head in enumerate(seq(layer, f"key_dims[{li}]")))
                 for li, layer in enumerate(seq(value, "key_dims")))


GROUP_SCALES = Knob("group_scales", list, (8,), _group_scales,
                    "dpe: one position scale per dimension group (rotary frequencies split evenly, "
                    "highest first); beyond the window a group reads ⌊p/s⌋ (one group: Self-Extend)")
KEY_DIMS = Knob("key_dims", list, None, _key_dims,
                "dpe: per layer and head, the rotary components scaled (by q·k 2-norm "
                "contribution; hf-posext dpe-detect --top-dims); none: every component")


def _chunk(L: int) -> int:
    return 3 * L // 4


def _offset(L: int) -> int:
    return int(0.33 * L)


CHUNK_SIZE = Knob("chunk_size", int, _chunk, _within("chunk_size", "3L/4", _chunk),
                  "dual_chunk's chunk s <= L")
LOCAL_WINDOW = Knob("local_window", int, lambda L: L // 16, lambda v, L: _count("local_window", v),
                    "dual_chunk's local window l < s")
SHIFTED_OFFSET = Knob("shifted_offset", int, _offset, _within("shifted_offset", "0.33·L", _offset),
                      "string's S <= L: distances from S on are shifted")
LOCAL_VALUE = Knob("local_value", int, lambda L: min(128, _offset(L)),
                   lambda v, L: _count("local_value", v),
                   "string's W <= S: shifted distances restart at it (d − S + W; W = S is plain RoPE)")


@dataclass(frozen=True)
class AttentionMethod:
    name: str
    knobs: tuple[Knob, ...]                     # its knobs, with their defaults (functions of L)
    logn: bool                                  # log-n query scaling on by default
    # spec -> plan (layered: (spec, layer, rotary half) -> plan); None: queries scaled only (logn)
    plan: Callable[..., Any] | None = None
    absolute: bool = False                      # positions of index i, not only of i − j
    check: Callable[[Any, dict[str, Any]], None] | None = None  # (spec, knobs given) -> raise
    reach: Callable[[Any, int], None] | None = None  # (spec, target length T) -> raise if T unfit
    layered: bool = False   # its plan also needs the layer index and the rotary half (DPE)
    # (spec, layers, query heads, rotary half) -> raise: knobs that must fit the model's shape
    fits: Callable[[Any, int, int, int], None] | None = None

    def knob_names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)


def _auto_fits(spec, given: dict[str, Any]) -> None:
    """An "auto" knob fits the far positions between the window and L: with the window at L − 1
    there is no room (the fits: `_fit_leak`, `_fit_group`)."""
    L = spec.trained_length
    auto = [k for k, v in given.items() if v == "auto"]
    if auto and spec.target_length > L and spec.window >= L - 1:
        raise ValueError(f"{auto[0]}='auto' cannot fit {spec.target_length} tokens with window="
                         f"{spec.window}: the window alone fills the trained length {L}. Use a "
                         f"window below {L - 1}.")


def _chunk_check(spec, given: dict[str, Any]) -> None:
    if spec.local_window >= spec.chunk_size:
        raise ValueError(f"local_window={spec.local_window} must be smaller than chunk_size="
                         f"{spec.chunk_size}; the authors use L/16 = {spec.trained_length // 16}.")


def _rerope_plan(spec, leaky: bool):
    leak = spec.fitted("leak") if leaky else None
    return WindowPlan(spec.window, partial(P.rerope_far_query, window=spec.window, leak=leak),
                      partial(P.rerope_far_key, leak=leak))


def _self_extend_plan(window: int, group_size: int) -> WindowPlan:
    return WindowPlan(window, partial(P.self_extend_far_query, group_size=group_size, window=window),
                      partial(P.self_extend_far_key, group_size=group_size))


def _string_check(spec, given: dict[str, Any]) -> None:
    """W <= S; and W = S maps d − S + W back to d: STRING would be plain attention, silently."""
    L = spec.trained_length
    if spec.local_value > spec.shifted_offset:
        raise ValueError(f"local_value={spec.local_value} must be at most shifted_offset="
                         f"{spec.shifted_offset} (shifted distances restart at it); the authors use 128.")
    if spec.local_value >= spec.shifted_offset and (given.get("local_value") is None
                                                    or given.get("shifted_offset") is None):
        raise ValueError(
            f"string at trained length {L}: the defaults (shifted_offset S = 0.33·L = "
            f"{int(0.33 * L)}, local_value W = 128 capped at S) give W = S, which shifts "
            f"nothing (d − S + W = d). The authors' W = 128 assumes L well above 388; pass "
            f"both knobs, e.g. shifted_offset={int(0.33 * L)}, "
            f"local_value={max(0, int(0.33 * L) // 8)}.")


def string_reach(spec) -> int:
    """The longest input STRING keeps inside the trained length: distances d >= S become
    d − S + W, so the farthest, T − 1 − S + W, must stay <= L − 1: T <= L + S − W."""
    return spec.trained_length + spec.shifted_offset - spec.local_value


def _string_reach(spec, T: int) -> None:
    """STRING reuses trained distances inside L (An et al. 2024 apply it within the trained
    length); a target past L + S − W meets distances the model never saw, silently (README:
    perplexity ratio 1.28 at 2L, 12.5 at 4L on SmolLM2). Refused, naming the S that would fit."""
    L, S, W = spec.trained_length, spec.shifted_offset, spec.local_value
    if T <= string_reach(spec):
        return
    need = T - L + W   # the smallest S with T − 1 − S + W <= L − 1
    fix = (f"pass shifted_offset >= {need}" if need <= L else
           f"no shifted_offset <= L can (it would need S >= T − L + W = {need}); STRING is for "
           f"inputs within the trained length: use a factor <= {string_reach(spec) / L:.4g} "
           f"(T <= L + S − W = {string_reach(spec)}), or a method made for extension (yarn, "
           "self_extend, leaky_rerope)")
    raise BeyondReach(f"string cannot keep a {T}-token target inside the trained length {L}: its "
                     f"shifted distances reach T − 1 − S + W = {T - 1 - S + W} > {L - 1} (S = "
                     f"shifted_offset {S}, W = local_value {W}); {fix}.")


# bojone/rerope: window L/8 (512 at L = 4096), leak k = 16, log-n on (both patches scale queries
# by max(1, log n / log L)).
REROPE = AttentionMethod("rerope", (WINDOW,), logn=True, plan=partial(_rerope_plan, leaky=False))
LEAKY_REROPE = AttentionMethod("leaky_rerope", (WINDOW, LEAK), logn=True, check=_auto_fits,
                               plan=partial(_rerope_plan, leaky=True))
# datamllab/LongLM: G = 8, neighbour window W = 1024 (L/2 for models trained on fewer than 2,048
# tokens, where 1024 would not fit), log-n off (`scale_base = -1`).
SELF_EXTEND = AttentionMethod(
    "self_extend", (replace(WINDOW, default=lambda L: min(1024, L // 2)), GROUP_SIZE), logn=False,
    absolute=True, check=_auto_fits,
    plan=lambda spec: _self_extend_plan(spec.window, spec.fitted("group_size")))
# HKUNLP/ChunkLlama: chunk_size 3L/4, local_window L/16.
DUAL_CHUNK = AttentionMethod(
    "dual_chunk", (CHUNK_SIZE, LOCAL_WINDOW), logn=False, absolute=True, check=_chunk_check, plan=lambda spec: DualChunkPlan(spec.chunk_size, spec.local_window))
# STRING (An et al. 2024, arXiv 2410.18745; HKUNLP/STRING string_for_llama.py): relative distance
# d kept below shifted_offset S, d − S + W from S on; S = int(0.33·L) (`shifted_ratio`), W =
# `small_local_value` 128 (at most S).
STRING = AttentionMethod(
    "string", (SHIFTED_OFFSET, LOCAL_VALUE), logn=False, check=_string_check, reach=_string_reach,
    plan=lambda spec: WindowPlan(spec.shifted_offset, partial(
        P.string_far_query, shifted_offset=spec.shifted_offset, local_value=spec.local_value), None))


def _dpe_plan(spec, layer: int | None, half: int) -> WindowPlan:
    """DPE's plan: Self-Extend's window parts (dpe_for_llama.py `atten_merge_forward`, lines
    141-221: the band of the last w keys at plain RoPE, older keys at the grouped positions,
    merged by log-sum-exp), its far positions per component (positions.dpe_*)."""
    scales = P.dpe_component_scales(spec.group_scales, half)
    keep = None
    if spec.key_dims is not None:
        if layer is None or not 0 <= layer < len(spec.key_dims):
            raise ValueError(f"dpe: key_dims holds {len(spec.key_dims)} layers, but layer {layer} "
                             "attends; run hf-posext dpe-detect on this model.")
        heads = spec.key_dims[layer]
        keep = torch.zeros(len(heads), half, dtype=torch.bool)
        for h, comps in enumerate(heads):
            if comps and max(comps) >= half:
                raise ValueError(f"dpe: key_dims[{layer}][{h}] names component {max(comps)}, but "
                                 f"the rotary dim has {half} (0 .. {half - 1}).")
            keep[h, list(comps)] = True
    w = spec.window
    return WindowPlan(w, partial(P.dpe_far_query, scales=scales, window=w, keep=keep),
                      partial(P.dpe_far_key, scales=scales, keep=keep), per_head=keep is not None)


def _dpe_fits(spec, layers: int, heads: int, half: int) -> None:
    """Before any forward (patch, and a checkpoint before its weights load): the groups split
    the rotary frequencies evenly, key_dims has one row per layer and query head."""
    P.dpe_component_scales(spec.group_scales, half)
    if spec.key_dims is None:
        return
    shape = {len(layer) for layer in spec.key_dims}
    if len(spec.key_dims) != layers or shape != {heads}:
        raise ValueError(f"dpe: key_dims holds {len(spec.key_dims)} layers × {sorted(shape)} heads, "
                         f"but the model has {layers} layers × {heads} query heads; run "
                         "hf-posext dpe-detect --top-dims on this model.")
    for layer in range(layers):
        _dpe_plan(spec, layer, half)


# LuLuLuyi/DPE config/dpe_config.yaml: local_window_size 1024 for every model (L = 8k); eight
# groups; key dimensions off in the README's quick start (`select_topk_dim = False`).
DPE = AttentionMethod("dpe", (replace(WINDOW, default=lambda L: min(1024, L // 2)), GROUP_SCALES,
                              KEY_DIMS), logn=False, absolute=True, plan=_dpe_plan, layered=True,
                      fits=_dpe_fits)
# plain RoPE, only the log-n query scaling (also combines with any rope method: logn=True)
LOGN = AttentionMethod("logn", (), logn=True)

UNITS: dict[str, AttentionMethod] = {u.name: u for u in (REROPE, LEAKY_REROPE, SELF_EXTEND,
                                                          DUAL_CHUNK, STRING, DPE, LOGN)}
ATTENTION_METHODS: tuple[str, ...] = tuple(UNITS)


def plan_for(spec, layer: int | None = None, half: int | None = None):
    """The kernel's plan of a validated `AttentionExtensionConfig` (kernel.attend); `layer` (the
    module's layer_idx) and `half` (rotary dim / 2) for the methods whose plan needs them."""
    unit = UNITS[spec.method]
    if unit.plan is None:
        raise ValueError(f"{spec.method!r} has no attention plan (it only scales queries)")
    return unit.plan(spec, layer, half) if unit.layered else unit.plan(spec)

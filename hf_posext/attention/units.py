"""One unit per attention-level method: its knobs with the authors' defaults (functions of the
trained length L, docs/attention_methods.md), whether log-n query scaling is on by default, its
plan (which key parts a query chunk attends to, plans.py), whether its positions depend on a
token's absolute index (then left padding must be undone), and any check of its own.
`AttentionExtensionConfig`, the kernel's plan and the padding rule read them from here; adding a
method is one entry (its position maps are plain functions of positions.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from ..errors import BeyondReach
from . import positions as P
from .plans import DualChunkPlan, WindowPlan


@dataclass(frozen=True)
class AttentionMethod:
    name: str
    defaults: Callable[[int], dict[str, Any]]   # L -> {knob: default}; its keys are the knobs
    logn: bool                                  # log-n query scaling on by default
    plan: Callable[[Any], Any] | None = None    # spec -> plan; None: queries scaled only (logn)
    absolute: bool = False                      # positions of index i, not only of i − j
    check: Callable[[Any, dict[str, Any]], None] | None = None  # (spec, knobs given) -> raise
    reach: Callable[[Any, int], None] | None = None  # (spec, target length T) -> raise if T unfit

    def knobs(self) -> tuple[str, ...]:
        return tuple(self.defaults(4096))


def _rerope_plan(spec, leaky: bool):
    leak = spec.leak_value if leaky else None
    return WindowPlan(spec.window, partial(P.rerope_far_query, window=spec.window, leak=leak),
                      partial(P.rerope_far_key, leak=leak))


def _string_check(spec, given: dict[str, Any]) -> None:
    """W = S maps d − S + W back to d: STRING would be plain attention, silently."""
    L = spec.trained_length
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
REROPE = AttentionMethod("rerope", lambda L: {"window": L // 8}, logn=True,
                         plan=partial(_rerope_plan, leaky=False))
LEAKY_REROPE = AttentionMethod("leaky_rerope", lambda L: {"window": L // 8, "leak": 16.0}, logn=True,
                               plan=partial(_rerope_plan, leaky=True))
# datamllab/LongLM: G = 8, neighbour window W = 1024 (L/2 for models trained on fewer than 2,048
# tokens, where 1024 would not fit), log-n off (`scale_base = -1`).
SELF_EXTEND = AttentionMethod(
    "self_extend", lambda L: {"window": min(1024, L // 2), "group_size": 8}, logn=False,
    absolute=True,
    plan=lambda spec: WindowPlan(
        spec.window, partial(P.self_extend_far_query, group_size=spec.group_value, window=spec.window),
        partial(P.self_extend_far_key, group_size=spec.group_value)))
# HKUNLP/ChunkLlama: chunk_size 3L/4, local_window L/16.
DUAL_CHUNK = AttentionMethod(
    "dual_chunk", lambda L: {"chunk_size": 3 * L // 4, "local_window": L // 16}, logn=False,
    absolute=True, plan=lambda spec: DualChunkPlan(spec.chunk_size, spec.local_window))
# STRING (An et al. 2024, arXiv 2410.18745; HKUNLP/STRING string_for_llama.py): relative distance
# d kept below shifted_offset S, d − S + W from S on; S = int(0.33·L) (`shifted_ratio`), W =
# `small_local_value` 128 (at most S).
STRING = AttentionMethod(
    "string", lambda L: {"shifted_offset": int(0.33 * L), "local_value": min(128, int(0.33 * L))},
    logn=False, check=_string_check, reach=_string_reach,
    plan=lambda spec: WindowPlan(spec.shifted_offset, partial(
        P.string_far_query, shifted_offset=spec.shifted_offset, local_value=spec.local_value), None))
# plain RoPE, only the log-n query scaling (also combines with any rope method: logn=True)
LOGN = AttentionMethod("logn", lambda L: {}, logn=True)

UNITS: dict[str, AttentionMethod] = {u.name: u for u in (REROPE, LEAKY_REROPE, SELF_EXTEND,
                                                          DUAL_CHUNK, STRING, LOGN)}
ATTENTION_METHODS: tuple[str, ...] = tuple(UNITS)


def plan_for(spec):
    """The kernel's plan of a validated `AttentionExtensionConfig` (kernel.attend)."""
    unit = UNITS[spec.method]
    if unit.plan is None:
        raise ValueError(f"{spec.method!r} has no attention plan (it only scales queries)")
    return unit.plan(spec)

"""Causal-LM negative log-likelihood without the full `[tokens × vocab]` logits, and peak memory.

At long lengths the logits dominate memory: 32k tokens × 49,152 vocab in float32 is 6.4 GB, and
the plain `model(input_ids, labels=...)` loss path allocates a log-softmax copy of the same size
(docs/evaluation.md, "Memory"). So we run the decoder to hidden states once, then apply the LM
head (as the family's forward does: ../lm_head.py) and the cross-entropy to chunks of scored
positions, in float32.
"""

from __future__ import annotations

import os
import threading

import torch
import torch.nn.functional as F

from ..lm_head import IGNORE_INDEX, check_lm_head, decoder_and_head


def _layer_progress(decoder: torch.nn.Module, bar):
    """Forward hooks that tick `bar` once per decoder layer: a long forward shows progress."""
    layers = getattr(decoder, "layers", None)
    if bar is None or layers is None:
        return []

    def tick(*_):
        bar.update(1)  # returns None on purpose: a forward hook's return value replaces the output

    return [layer.register_forward_hook(tick) for layer in layers]


@torch.inference_mode()
def token_nll(model: torch.nn.Module, input_ids: torch.Tensor, targets: torch.Tensor,
              chunk_size: int = 1024, progress: bool = False, desc: str = "forward") -> torch.Tensor:
    """-log p(target_t | input_0..t) at every position t, NaN where target_t == -100.

    input_ids: [T] or [1, T] token ids fed to the model.
    targets:   same shape; targets[t] is the token position t predicts (for plain causal LM
               scoring, input_ids shifted left by one), IGNORE_INDEX (-100) where not scored.
    Returns a float64 CPU tensor [T]: the per-position view the evaluation buckets by position
    (evaluation/buckets.py); `chunked_nll` is its sum. Which positions are scored is told by
    `targets`, not by NaN (a broken model's NaN loss stays visible in the sum).
    """
    input_ids = input_ids.reshape(1, -1)                     # [1, T]
    targets = targets.reshape(-1)                            # [T]
    if targets.numel() != input_ids.shape[1]:
        raise ValueError(f"targets has {targets.numel()} entries for {input_ids.shape[1]} input tokens")
    head = check_lm_head(model)        # the family's own logits, or a clear refusal (lm_head.py)
    decoder, _ = decoder_and_head(model)
    device = head.linear.weight.device
    scored = (targets != IGNORE_INDEX).nonzero().squeeze(1)  # [N] positions that are scored
    n_chunks = max(1, -(-scored.numel() // chunk_size))
    bar = None
    if progress:
        from tqdm.auto import tqdm
        n_layers = len(getattr(decoder, "layers", []))
        bar = tqdm(total=n_layers + n_chunks, desc=desc, unit="step", leave=False)
    hooks = _layer_progress(decoder, bar)
    try:
        hidden = decoder(input_ids=input_ids.to(device), use_cache=False).last_hidden_state[0]  # [T, H]
    finally:
        for h in hooks:
            h.remove()
    out = torch.full((targets.numel(),), float("nan"), dtype=torch.float64)   # [T]
    # Usually the scored positions are one contiguous run: slice views instead of gathers.
    contiguous = scored.numel() > 0 and int(scored[-1] - scored[0]) + 1 == scored.numel()
    for i in range(0, scored.numel(), chunk_size):
        pos = scored[i:i + chunk_size]                        # [c]
        if contiguous:
            a, b = int(pos[0]), int(pos[-1]) + 1
            h, labels = hidden[a:b], targets[a:b]             # [c, H], [c]
        else:
            h, labels = hidden[pos.to(hidden.device)], targets[pos]
        logits = head(h)                                      # [c, V] float32
        labels = labels.to(logits.device)
        out[pos] = F.cross_entropy(logits, labels, reduction="none").double().cpu()   # [c]
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out


def chunked_nll(model: torch.nn.Module, input_ids: torch.Tensor, targets: torch.Tensor,
                chunk_size: int = 1024, progress: bool = False, desc: str = "forward") -> tuple[float, int]:
    """Sum of -log p(target_t | input_0..t) over positions with target_t != -100, and their
    count (arguments as `token_nll`). The sum is accumulated in float64."""
    nll = token_nll(model, input_ids, targets, chunk_size, progress, desc)   # [T]
    scored = targets.reshape(-1).cpu() != IGNORE_INDEX    # not isnan: a broken model's NaN must show
    return float(nll[scored].sum()), int(scored.sum())


def causal_targets(input_ids: torch.Tensor) -> torch.Tensor:
    """Targets for scoring every token after the first: shift left, the last position unscored."""
    ids = input_ids.reshape(-1)
    return torch.cat([ids[1:], ids.new_full((1,), IGNORE_INDEX)])  # [T]


# --- peak memory -------------------------------------------------------------------------------

def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc, else psutil)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        import psutil  # only needed off Linux
        return psutil.Process().memory_info().rss


class PeakMemory:
    """Peak memory over a block. On CUDA: torch's allocator peak. On CPU: the process RSS,
    sampled every `interval` seconds by a thread (the allocator hands large buffers straight
    back to the OS, so RSS falls again after a long forward and the sampler sees the peak).

    After the block: `.peak_mb` (absolute peak) and `.increase_mb` (peak minus the start value).
    """

    def __init__(self, device: str | torch.device = "cpu", interval: float = 0.005):
        self.device = torch.device(device)
        self.interval = interval
        self.peak_mb = self.increase_mb = float("nan")

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            return self
        self._start = self._peak = _rss_bytes()
        self._stop = threading.Event()

        def sample():
            while not self._stop.wait(self.interval):
                self._peak = max(self._peak, _rss_bytes())

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            peak = max(self._peak, _rss_bytes())
        self.peak_mb = peak / 2**20
        self.increase_mb = (peak - self._start) / 2**20
        return False

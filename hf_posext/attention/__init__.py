"""Training-free attention-level context extension: ReRoPE, leaky ReRoPE, Self-Extend, Dual Chunk
Attention, STRING and log-n query scaling, through transformers' `AttentionInterface`.

    positions.py  the position maps (plain functions)
    units.py      one unit per method: knobs and defaults, log-n default, plan, own checks
    config.py     AttentionExtensionConfig (validated, immutable knobs)
    kernel.py     chunked attention over parts merged by log-sum-exp
    backends.py   the block kernels that return the log-sum-exp (CPU flash, CUDA efficient, math)
    plans.py      each method's parts of a query chunk
    interface.py  the registered attention function
    install.py    what `hf_posext.patch` writes into one model's config
    continuation.py  a cached prefix's continuation under plain SDPA: prefix + causal square by log-sum-exp
"""

from .config import ALL_KNOBS, ATTENTION_METHODS, AttentionExtensionConfig
from .install import RAW_KEYS, after_load, check_entry, install, is_attention_method, saved_trained_length, split
from .interface import CONFIG_KEY, IMPLEMENTATION, register

__all__ = ["ALL_KNOBS", "ATTENTION_METHODS", "AttentionExtensionConfig", "CONFIG_KEY", "IMPLEMENTATION", "RAW_KEYS",
           "after_load", "check_entry", "install", "is_attention_method", "register", "saved_trained_length", "split"]

"""hf_posext: extend the context window of Hugging Face RoPE decoders (every transformers family
whose rotary module follows the shared pattern, Llama to DeepSeek-V3: `SUPPORTED_MODEL_TYPES`,
found in transformers' own modules; docs/families.md) through RoPE.

The front door (`__all__`) is the user API and nothing else:

    import hf_posext
    model = hf_posext.from_pretrained("meta-llama/Llama-2-7b-hf", method="yarn", factor=4)
    hf_posext.patch(model, "ntk", factor=2)     # replaces, never compounds
    rows = hf_posext.evaluate_perplexity(model, docs, hf_posext.PerplexityGrid(["yarn"], [8192]))
    rows = hf_posext.evaluate_retrieval(model, tokenizer, hf_posext.RetrievalGrid(["yarn"], [8192]))
    hf_posext.unpatch(model)                    # back to the original

Checkpoints are saved in the form plain transformers (4.x and 5.x) runs exactly, except
`dynamic_yarn`: importing registers hf_posext's rope types (`dynamic_yarn`, and `ntk` /
`ntk_by_parts` for older checkpoints) with transformers. `check(path)` says how transformers,
vLLM, SGLang, TGI and llama.cpp run a checkpoint's rope; `export(model_or_path, out,
target="vllm")` writes the form one of them runs exactly (docs/portability.md). The internals
live in the subpackages (`hf_posext.rope`, `.attention`, `.evaluation`, `.search`, ...; errors in
`hf_posext.errors`), documented in docs/architecture.md.
"""

from . import attention
from ._version import __version__
from .adapters import save_adapter
from .attention import ATTENTION_METHODS, AttentionExtensionConfig
from .catalog import METHODS
from .evaluation import PerplexityGrid, RetrievalGrid, RunInfo, evaluate_perplexity, evaluate_retrieval
from .generation import fixed_rope_scale, generate
from .loading import from_pretrained
from .patcher import is_patched, patch, trained_length, unpatch
from .portability.exporting import export
from .portability.verdicts import check
from .rope.config import ROPE_METHODS, RopeExtensionConfig
from .rope.registry import SUPPORTED_MODEL_TYPES, register
from .search import search_factors

register()
attention.register()
del register

__all__ = [
    # extend a model
    "patch", "unpatch", "is_patched", "from_pretrained", "generate", "fixed_rope_scale",
    "trained_length", "save_adapter",
    # what a method is
    "METHODS", "ROPE_METHODS", "ATTENTION_METHODS", "RopeExtensionConfig",
    "AttentionExtensionConfig", "SUPPORTED_MODEL_TYPES",
    # evaluate it
    "evaluate_perplexity", "evaluate_retrieval", "PerplexityGrid", "RetrievalGrid", "RunInfo",
    # where it runs, and searching a portable config
    "check", "export", "search_factors",
    "__version__",
]

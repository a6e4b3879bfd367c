"""hf_posext: extend the context window of Hugging Face RoPE decoders (Llama, Mistral, Qwen,
Gemma, OLMo 2, Granite, GPT-NeoX, StableLM: `SUPPORTED_MODEL_TYPES`) through RoPE.

    import hf_posext
    model = hf_posext.from_pretrained("meta-llama/Llama-2-7b-hf", method="yarn", factor=4)
    hf_posext.patch(model, "ntk", factor=2)     # replaces, never compounds
    hf_posext.unpatch(model)                    # back to the original

Checkpoints are saved in the form plain transformers (4.x and 5.x) runs exactly, except
`dynamic_yarn`: importing registers hf_posext's rope types (`dynamic_yarn`, and `ntk` /
`ntk_by_parts` for older checkpoints) with transformers. `hf_posext.check(path)` says how
transformers, vLLM, SGLang, TGI and llama.cpp run a checkpoint's rope;
`hf_posext.export(model_or_path, out, target="vllm")` writes the form one of them runs exactly
(docs/portability.md).
"""

from . import attention, errors
from ._version import __version__
from .adapters import save_adapter
from .attention import ATTENTION_METHODS, AttentionExtensionConfig
from .catalog import METHODS
from .data import embedded  # `from hf_posext import embedded` (README)
from .rope import methods
from .rope.config import ROPE_METHODS, RopeExtensionConfig
from .portability.exporting import export
from .search import search  # the function; it shadows the subpackage's name (search/__init__.py)
from .generation import fixed_rope_scale, generate
from .loading import from_pretrained
from .patcher import is_patched, patch, trained_length, unpatch
from .rope.registry import SUPPORTED_MODEL_TYPES, compute, register
from .portability.verdicts import check

register()
attention.register()

__all__ = ["ATTENTION_METHODS", "AttentionExtensionConfig", "METHODS", "ROPE_METHODS",
           "RopeExtensionConfig", "SUPPORTED_MODEL_TYPES", "check", "compute", "export",
           "fixed_rope_scale", "from_pretrained", "generate", "is_patched", "methods", "patch",
           "save_adapter", "search", "errors", "embedded", "__version__",
           "trained_length", "unpatch"]

"""hf_posext: extend the context window of Hugging Face RoPE decoders (Llama, Mistral, Qwen,
Gemma, OLMo 2, Granite, GPT-NeoX, StableLM: `SUPPORTED_MODEL_TYPES`) through RoPE.

    import hf_posext
    model = hf_posext.from_pretrained("meta-llama/Llama-2-7b-hf", method="yarn", factor=4)
    hf_posext.patch(model, "ntk", factor=2)     # replaces, never compounds
    hf_posext.unpatch(model)                    # back to the original

Importing registers hf_posext's rope types (`ntk`, `ntk_by_parts`, `dynamic_yarn`) with
transformers, so checkpoints saved extended reload with `AutoModelForCausalLM.from_pretrained`.
"""

from . import methods
from .adapters import save_adapter
from .config import METHODS, RopeExtensionConfig
from .generation import fixed_rope_scale, generate
from .loading import from_pretrained
from .patcher import is_patched, patch, trained_length, unpatch
from .registry import SUPPORTED_MODEL_TYPES, compute, register

register()

__version__ = "0.1.0"
__all__ = ["METHODS", "RopeExtensionConfig", "SUPPORTED_MODEL_TYPES", "compute", "fixed_rope_scale",
           "from_pretrained", "generate", "is_patched", "methods", "patch", "save_adapter",
           "trained_length", "unpatch"]

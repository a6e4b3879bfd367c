"""hf_posext: extend the context window of Hugging Face Llama / Mistral models through RoPE.

    import hf_posext
    model = hf_posext.from_pretrained("meta-llama/Llama-2-7b-hf", method="yarn", factor=4)
    hf_posext.patch(model, "ntk", factor=2)     # replaces, never compounds
    hf_posext.unpatch(model)                    # back to the original

Importing registers hf_posext's rope types (`ntk`, `ntk_by_parts`, `dynamic_yarn`) with
transformers, so checkpoints saved extended reload with `AutoModelForCausalLM.from_pretrained`.
"""

from . import attention, methods
from .attention import ATTENTION_METHODS, AttentionExtensionConfig
from .config import METHODS, ROPE_METHODS, RopeExtensionConfig
from .generation import fixed_rope_scale, generate
from .loading import from_pretrained
from .patcher import is_patched, patch, trained_length, unpatch
from .registry import SUPPORTED_MODEL_TYPES, compute, register

register()
attention.register()

__version__ = "0.1.0"
__all__ = ["ATTENTION_METHODS", "AttentionExtensionConfig", "METHODS", "ROPE_METHODS", "RopeExtensionConfig", "SUPPORTED_MODEL_TYPES", "compute", "fixed_rope_scale",
           "from_pretrained", "generate", "is_patched", "methods", "patch", "trained_length",
           "unpatch"]

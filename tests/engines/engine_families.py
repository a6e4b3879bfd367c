"""The newer families the engines tier measures beside the tiny Llama (measure.py runs them).

One family per way a family's rope departs from Llama's, each at measure.MODEL's dims where the
family has them (hidden 128, 2 heads of dim 64, 2 layers, L = 256, float32, initializer_range
0.1, untied head, the SmolLM2 tokenizer's vocabulary):

- `qwen3_moe` (MoE): 4 experts, top-2, `norm_topk_prob` on as Qwen3-30B-A3B ships it; rope as
  Llama's, so what is measured is whether the engine's MoE model class reads the rope dict.
- `gemma3_text` (per-layer rope): a sliding layer (window 128, local base 10,000) then a
  full-attention layer (base 1e6), Gemma 3's own bases; `patch` scales the `full_attention` entry
  only, as Gemma 3's long-context configs do, and an engine that scales the sliding layers too
  (vllm-project/vllm#29111) shows here as "different".
- `phi` (partial rotary, phi-2 style): rope on half of each head (`partial_rotary_factor` 0.5), so
  YaRN's correction range is over the 32 rotary dims, not 64.

Per family two cases only (the CI budget, docs/ci.md): plain RoPE (the family's control) and
YaRN at s = 4, `hf_posext.patch(model, "yarn", factor=4)` + `save_pretrained`, the form
practitioners ship; no export targets. Each case is decided by measure.decide against
transformers + hf_posext and against the family's own control.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

LLAMA = "llama"   # the tiny Llama of measure.py: every method, every export target
CONTROL = "plain RoPE (control)"
METHODS = ("yarn",)
# model_type -> what the family's tiny model sets beyond the dims shared with measure.MODEL
FAMILIES: dict[str, dict] = {
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                      rope_parameters={"rope_type": "default", "rope_theta": 10_000.0}),
    # Gemma 3's own layer pattern, five sliding layers then a full one: llama.cpp's converter
    # writes no pattern and its runtime assumes 6 (src/models/gemma3.cpp: load_swa_pattern(ml,
    # 6)), so a shorter pattern would be read wrong there whatever the rope.
    # query_pre_attn_scalar = head_dim: softmax scale 1/sqrt(64), as the Llama's.
    "gemma3_text": dict(num_hidden_layers=6,
                        layer_types=["sliding_attention"] * 5 + ["full_attention"],
                        sliding_window=128, query_pre_attn_scalar=64,
                        rope_parameters={"sliding_attention": {"rope_type": "default",
                                                               "rope_theta": 10_000.0},
                                         "full_attention": {"rope_type": "default",
                                                            "rope_theta": 1_000_000.0}}),
    # phi-2's MLP width, 4·hidden: vLLM 0.29's phi.py (`n_inner` else 4 * hidden_size) and
    # llama.cpp's converter (conversion/phi.py: add_feed_forward_length(4 * n_embd)) assume it
    # and do not read intermediate_size. Phi has one key/value head per query head and
    # head_dim = hidden / heads (64).
    "phi": dict(intermediate_size=512,
                rope_parameters={"rope_type": "default", "rope_theta": 10_000.0,
                                 "partial_rotary_factor": 0.5},
                resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
}
# llama.cpp computes GELU from an fp16 table (ggml/src/ggml-cpu/vec.h: `#define GGML_GELU_FP16`,
# on for every CPU build): at full MLP strength it put 1.2e-3 to 1.5e-3 nats of noise on the
# GELU families' controls here, within 1.5x of llama.cpp's threshold, where an "exact" YaRN
# cell could read "different" on another machine. Their MLP output is scaled to 1/20 (Gemma 3:
# its post-feedforward norm, after which nothing rescales it; Phi: fc2): measured noise 5e-5
# (Gemma 3) and 2.5e-4 (Phi), 8x or more below the threshold; with the MLP zeroed, 1e-5. The
# rope acts in attention, which keeps its weights.
QUIET_MLP = {"gemma3_text": "post_feedforward_layernorm", "phi": "mlp.fc2"}
MLP_SCALE = 0.05
KIND = {"qwen3_moe": "MoE", "gemma3_text": "per-layer rope", "phi": "partial rotary"}
SHARED = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
          "intermediate_size", "num_hidden_layers", "max_position_embeddings",
          "initializer_range", "tie_word_embeddings")


def control_label(family: str) -> str:
    """The control's case label (the Llama's keeps measure.py's first label)."""
    return CONTROL if family == LLAMA else f"{family}: {CONTROL}"


def cases(family: str) -> list[tuple[str, str | None, dict]]:
    """(label, method, knobs) of a family: its control, then YaRN with default knobs."""
    return [(control_label(family), None, {})] + [(f"{family}: {m}", m, {}) for m in METHODS]


def model(family: str, tok, dims: dict) -> torch.nn.Module:
    """The family's tiny random model (seed 0), from its own config class and auto model."""
    config_class = CONFIG_MAPPING[family]
    config = config_class(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id,
                          **{**{k: v for k, v in dims.items() if k in SHARED}, **FAMILIES[family]})
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, module in m.named_modules():
            if name.endswith(QUIET_MLP.get(family, "\0")):
                if family == "gemma3_text":   # Gemma3RMSNorm multiplies by (1 + weight)
                    module.weight.copy_(MLP_SCALE * (1 + module.weight) - 1)
                else:
                    module.weight.mul_(MLP_SCALE)
                    module.bias.mul_(MLP_SCALE)
    return m


def control_of(label: str) -> str:
    """The control case a case is compared with as 'plain RoPE'."""
    family = label.split(": ", 1)[0]
    return control_label(family) if family in FAMILIES else CONTROL


# ---- docs/families.md: its table shows the measured verdicts (family_table reads the file) ----

PAGE = Path(__file__).resolve().parents[2] / "docs" / "families.md"


def write_families_page() -> None:
    """Regenerate the table of docs/families.md (tests/test_family_table.py holds page ==
    family_table(family_verdicts)): its "engines (measured)" column reads measured_engines.json,
    so the page is rewritten whenever the measurement is."""
    import transformers
    from hf_posext.portability.measured import family_verdicts
    from hf_posext.rope.family_table import family_table

    text = PAGE.read_text()
    start = re.search(r"<!-- family-table: transformers \S+ -->\n", text)
    end = text.index("\n<!-- /family-table -->")
    assert start, "docs/families.md lost its table marker"
    PAGE.write_text(text[:start.start()] + f"<!-- family-table: transformers "
                    f"{transformers.__version__} -->\n" + family_table(family_verdicts)
                    + text[end:])
    print(f"wrote {PAGE}")

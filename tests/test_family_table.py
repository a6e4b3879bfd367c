"""The family discovery (hf_posext/rope/families.py): what it reads from transformers' modules for
the families practitioners extend, that it is lazy (not run on `import hf_posext`), and that
docs/families.md shows exactly the table it generates."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import transformers

from hf_posext.portability.measured import family_verdicts
from hf_posext.rope import families
from hf_posext.rope.family_table import family_table
from hf_posext.rope.registry import SUPPORTED_MODEL_TYPES, UNSUPPORTED_MODEL_TYPES

# The families found in transformers' own modules are a 5.x feature: on 4.57 hf_posext supports the
# eleven families tests/test_families.py covers (their rope classes predate the shared pattern there).
from hf_posext.rope.compat import IS_V5 as _IS_V5  # noqa: E402
if not _IS_V5:
    pytest.skip("families found from transformers' modules: transformers 5.x", allow_module_level=True)


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("model_type, facts", [
    ("llama", dict(layout="half-split", per_layer_type=False, nope_layers=False, mla=False)),
    ("qwen3_moe", dict(layout="half-split", mla=False, sinks=False)),
    ("smollm3", dict(nope_layers=True, chunked=False)),
    ("olmo3", dict(per_layer_type=True, nope_layers=False)),
    ("gemma3_text", dict(per_layer_type=True)),
    ("gpt_oss", dict(sinks=True, layout="half-split")),
    ("deepseek_v3", dict(mla=True, softmax_from_rope=True, layout="interleaved (rope_interleave)")),
    ("llama4_text", dict(nope_layers=True, chunked=True, layout="interleaved (complex)")),
    ("glm4", dict(layout="interleaved")),
    ("longcat_flash", dict(layout="interleaved", mla=True)),   # DeepSeek's interleave, no switch
    ("phi", dict(layout="half-split")),
    ("exaone4", dict(rope_if="self.sliding_window is None or self.is_sliding", nope_layers=False)),
    ("deepseek_v3", dict(rope_if=None)),   # its `if rope_interleave` picks a layout, not NoPE
    ("granite_swa", dict(private_rotary=True)),
    ("gemma4_text", dict(heterogeneous=True)),
])
def test_facts_read_from_the_code(model_type, facts):
    fam = families.family(model_type)
    assert fam is not None and fam.shared
    assert {k: getattr(fam, k) for k in facts} == facts


def test_rotary_classes_are_the_ones_built_for_the_config():
    assert families.family("llama4_text").rotary_classes == ("Llama4TextRotaryEmbedding",)
    assert families.family("gemma3_text").rotary_classes == ("Gemma3RotaryEmbedding",)
    assert families.family("gpt2") is None          # no rotary embedding
    assert not families.family("gptj").shared       # its own sin/cos table


def test_supported_and_refused_partition_the_found_families():
    found = {f.model_type for f in families.all_families()}
    assert set(SUPPORTED_MODEL_TYPES) | set(UNSUPPORTED_MODEL_TYPES) == found
    assert not set(SUPPORTED_MODEL_TYPES) & set(UNSUPPORTED_MODEL_TYPES)
    assert "ministral3" in UNSUPPORTED_MODEL_TYPES and "llama_4_scaling_beta" in UNSUPPORTED_MODEL_TYPES["ministral3"]
    assert "qwen3_moe" in SUPPORTED_MODEL_TYPES and "gpt2" not in SUPPORTED_MODEL_TYPES


def test_one_lookup_reads_one_family():
    families.family.cache_clear()
    start = time.perf_counter()
    assert "mixtral" in SUPPORTED_MODEL_TYPES
    assert time.perf_counter() - start < 5.0   # one modeling module, not all of them


@pytest.mark.slow
def test_import_runs_no_discovery():
    """`import hf_posext` imports no family's modeling module; the first lookup does."""
    code = ("import sys, hf_posext\n"
            "from hf_posext.rope import families\n"
            "assert families.all_families.cache_info().currsize == 0\n"
            "assert families.family.cache_info().currsize == 0\n"
            "assert 'transformers.models.deepseek_v3.modeling_deepseek_v3' not in sys.modules\n"
            "assert 'deepseek_v3' in hf_posext.SUPPORTED_MODEL_TYPES\n"
            "assert 'transformers.models.deepseek_v3.modeling_deepseek_v3' in sys.modules\n"
            "print('lazy ok')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "lazy ok" in run.stdout, run.stderr[-2000:]


def test_the_docs_page_is_the_generated_table():
    text = (ROOT / "docs/families.md").read_text()
    marker = re.search(r"<!-- family-table: transformers (\S+) -->\n", text)
    assert marker, "docs/families.md lost its table marker"
    if marker.group(1) != transformers.__version__:
        pytest.skip(f"docs/families.md was generated under transformers {marker.group(1)}")
    shown = text[marker.end():].split("\n<!-- /family-table -->")[0]
    assert shown == family_table(family_verdicts), \
        "regenerate: make engine-table (or tests/engines/engine_families.py write_families_page())"

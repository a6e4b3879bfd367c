"""PEFT round trip: a LoRA adapter trained on an extended model comes back
extended through PEFT's usual one-liners after `hf_posext.save_adapter`."""

import pytest
import torch
from conftest import TRAINED, tiny_model
from transformers import AutoModelForCausalLM

import hf_posext
from hf_posext.rope.compat import get_rope_parameters

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_thread")


def logits(model, n=3 * TRAINED):
    with torch.no_grad():
        return model((torch.arange(n)[None] * 3) % 128).logits


@pytest.fixture
def lora_on_extended(tmp_path, arch):
    """An adapter 'trained' (random, non-zero LoRA and a fully trained embedding, as LongLoRA
    trains embeddings) on a base loaded extended from a local checkpoint."""
    tiny_model(arch).save_pretrained(tmp_path / "base")
    base = hf_posext.from_pretrained(tmp_path / "base", "yarn", 4.0, attn_implementation="eager")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                             modules_to_save=["embed_tokens"], init_lora_weights=False,
                             task_type="CAUSAL_LM")
    torch.manual_seed(1)
    model = peft.get_peft_model(base, config).eval()
    with torch.no_grad():
        model.base_model.model.model.embed_tokens.modules_to_save["default"].weight.mul_(1.5)
    return model, tmp_path


def assert_extended(model):
    rope = get_rope_parameters(model.get_base_model().config)
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0
    assert model.get_base_model().config.max_position_embeddings == 4 * TRAINED


def test_plain_peft_save_reloads_the_unextended_base(lora_on_extended):
    """The problem: peft's own save points at the checkpoint the base was loaded from."""
    model, tmp = lora_on_extended
    model.save_pretrained(tmp / "adapter")
    reloaded = peft.AutoPeftModelForCausalLM.from_pretrained(tmp / "adapter", attn_implementation="eager")
    assert get_rope_parameters(reloaded.get_base_model().config)["rope_type"] == "default"


def test_save_adapter_reloads_extended_with_both_one_liners(lora_on_extended):
    model, tmp = lora_on_extended
    expected = logits(model)
    unadapted = None
    with model.disable_adapter():
        unadapted = logits(model)
    assert (expected - unadapted).abs().max() > 1e-3  # the adapter really matters
    base_dir = hf_posext.save_adapter(model, tmp / "adapter")
    assert base_dir == tmp / "adapter" / "extended_base"

    auto = peft.AutoPeftModelForCausalLM.from_pretrained(tmp / "adapter", attn_implementation="eager").eval()
    assert_extended(auto)
    torch.testing.assert_close(logits(auto), expected, rtol=1e-5, atol=1e-5)

    path = peft.PeftConfig.from_pretrained(tmp / "adapter").base_model_name_or_path
    base = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    two_step = peft.PeftModel.from_pretrained(base, tmp / "adapter").eval()
    assert_extended(two_step)
    torch.testing.assert_close(logits(two_step), expected, rtol=1e-5, atol=1e-5)
    with two_step.disable_adapter():  # the saved base is the base, not base + adapter
        torch.testing.assert_close(logits(two_step), unadapted, rtol=1e-5, atol=1e-5)


def test_save_adapter_errors(tmp_path):
    with pytest.raises(TypeError, match="expects a peft PeftModel"):
        hf_posext.save_adapter(tiny_model("llama"), tmp_path)
    plain = peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="not extended"):
        hf_posext.save_adapter(plain, tmp_path)

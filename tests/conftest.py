"""Shared fixtures: tiny random Llama and Mistral models (hidden 64, 2 layers, trained length 64)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

TRAINED = 64  # max_position_embeddings of the tiny models: "the trained context"
VOCAB = 128

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}


def tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    config_cls, model_cls = ARCHS[arch]
    kwargs = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=TRAINED,
                  rope_theta=10_000.0, attn_implementation="eager")
    if arch == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    torch.manual_seed(seed)
    return model_cls(config_cls(**kwargs)).eval()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread: on a shared 2-core machine more threads spin-wait.
    Use with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def recipe_model_forbidden(monkeypatch):
    """The recipe's model loader fails the test if called: a bad configuration must be refused
    before any model loads."""
    from hf_posext.training import recipe

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the error")

    monkeypatch.setattr(recipe, "load_recipe_model", no_model)


@pytest.fixture(params=list(ARCHS))
def arch(request):
    return request.param


@pytest.fixture
def model(arch):
    return tiny_model(arch)


@pytest.fixture
def tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (2, 3 * TRAINED), generator=g)  # [batch 2, 192 tokens = 3 L]


@pytest.fixture
def run_cli(capsys):
    """`hf-posext ARGS` in this process (`hf_posext.cli.main`, output captured): what
    `python -m hf_posext.cli` runs, without a new interpreter's start-up per call. Returns
    (exit code, stdout, stderr)."""
    from hf_posext import cli

    def run(argv: list[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err
    return run

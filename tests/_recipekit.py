"""Shared pieces of the recipe tests: tiny random Llama and Mistral checkpoints with a local
character-level tokenizer, a folder of random documents, the recipe's argv, and run comparisons.
Nothing touches the Hub."""

from __future__ import annotations

import csv
import importlib.util
import os
import random
import re
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from hf_posext.training.loop import DETERMINISTIC_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
VENV_BIN = Path(sys.executable).parent
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
CHARS = "abcdefghijklmnopqrstuvwxyz .,\n"
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=1,
            eos_token_id=2)


def load_finetune():
    """recipes/finetune.py as a module (it is a script, not part of the package)."""
    if "finetune" not in sys.modules:
        spec = importlib.util.spec_from_file_location("finetune", RECIPES / "finetune.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["finetune"] = module
        spec.loader.exec_module(module)
    return sys.modules["finetune"]


def char_tokenizer(chars: str = CHARS):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")   # one token per character
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def make_assets(root: Path, archs=("llama", "mistral"), n_docs: int = 8) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
    classes = {"llama": (LlamaForCausalLM, LlamaConfig), "mistral": (MistralForCausalLM, MistralConfig)}
    for name in archs:
        cls, cfg = classes[name]
        torch.manual_seed(0)
        cls(cfg(**TINY)).save_pretrained(root / name)
        char_tokenizer().save_pretrained(root / name)
    rng = random.Random(0)
    (root / "docs").mkdir()
    for i in range(n_docs):   # documents of 400 characters = 400 tokens each
        (root / "docs" / f"doc{i}.txt").write_text("".join(rng.choice(CHARS) for _ in range(400)))
    return root


def recipe_argv(assets: Path, out: Path, model: str = "llama", **over) -> list[str]:
    """argv for a 4-step run on the tiny model; `section__key=value` overrides a setting."""
    opts = {"model.name": str(assets / model), "model.method": "yarn", "model.factor": "4",
            "data.source": str(assets / "docs"), "data.eval_documents": "[doc7]",
            "training.seq_len": "32", "training.max_steps": "4", "training.warmup_steps": "2",
            "training.save_every": "2", "training.learning_rate": "1e-3",
            "training.gradient_checkpointing": "false", "pose.enabled": "true",
            "eval.lengths": "[64, 256]", "eval.chunk_size": "16"}
    opts.update({k.replace("__", "."): str(v) for k, v in over.items()})
    argv = ["--output_dir", str(out)]
    for k, v in opts.items():
        argv += [f"--{k}", v]
    return argv


def log_rows(path: Path, columns=DETERMINISTIC_COLUMNS) -> list[dict]:
    with open(path) as fh:
        return [{k: r[k] for k in columns} for r in csv.DictReader(fh)]


def logits(model, n=200):
    ids = torch.arange(n)[None] % 120 + 3
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def final_weights(out: Path) -> dict:
    return load_file(str(out / "final" / "model.safetensors"))


def assert_same_run(a: Path, b: Path, atol: float = 0.0):
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        if atol:
            torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=atol, msg=k)
        else:
            assert torch.equal(wa[k], wb[k]), k
    assert log_rows(a / "train_log.csv") == log_rows(b / "train_log.csv")


def checkpoint_steps(out: Path) -> dict[str, int]:
    """{checkpoint folder name: the optimizer step it holds} (read from the recipe's JSON state;
    the recipe writes no pickle of its own)."""
    import json
    found = {}
    for p in sorted((out / "checkpoints").glob("checkpoint_*")):
        found[p.name] = int(json.loads((p / "recipe_state.json").read_text())["train"]["step"])
    return found


def format_pattern(text: str) -> re.Pattern:
    """A synthetic format's sentence (training/synthetic.py FORMATS) as a regex capturing the key
    and the value; a second {key} must repeat the first."""
    pattern = re.escape(text)
    for name, group in (("key", "[A-Za-z]+"), ("value", r"\w+")):
        field = re.escape("{" + name + "}")
        pattern = pattern.replace(field, f"(?P<{name}>{group})", 1).replace(field, f"(?P={name})")
    return re.compile(pattern)

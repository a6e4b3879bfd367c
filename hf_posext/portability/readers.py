"""The readers `hf-posext check` re-derives, one row each: the id code compares and the
measured file stores, and everything a table or the CLI prints about the reader, derived here.

    id               name               target         engine        measured as
    transformers-5   transformers 5.x   transformers   transformers
    transformers-4   transformers 4.x   transformers   transformers
    vllm-07b12f1     vLLM 07b12f1       vllm           vLLM          vLLM
    vllm-0cd5784     vLLM 0cd5784       vllm           vLLM          vLLM
    sglang           SGLang             sglang         SGLang
    tgi              TGI                tgi            TGI
    llamacpp         llama.cpp          llama.cpp      llama.cpp     llama-cpp-python

`target` is the `hf-posext export --target` (and `serve --engine`) name that writes the form the
reader runs. Which engine release stands for a reader (vLLM 0.29.0 for vllm-07b12f1) is the
measurement's own record: measured_engines.json's `engines`, keyed by these ids
(`measured.release_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import engines


@dataclass(frozen=True)
class Reader:
    id: str            # what code compares and measured_engines.json stores
    name: str          # what `check`, `export`, `serve`, the doctor and the docs tables print
    target: str        # the `export --target` / `serve --engine` name writing the form it runs
    engine: str        # the engine, as a measured release is named ("vLLM 0.32.0")
    read: Callable[[dict[str, Any]], engines.Reading]  # its re-derivation (engines.py)
    layout: Callable[[dict[str, Any]], dict[str, Any]] = engines.v5_rope  # the rope dict it reads
    measured_as: str = ""  # the distribution a measured release is installed as, when not `engine`

    def measured_name(self, release: str) -> str:
        """A measured release of this reader's engine: "vLLM 0.29.0", "llama-cpp-python 0.3.36"."""
        return f"{self.measured_as or self.engine} {release}"


TRANSFORMERS_5 = Reader("transformers-5", "transformers 5.x", "transformers", "transformers",
                        engines.transformers_v5)
TRANSFORMERS_4 = Reader("transformers-4", "transformers 4.x", "transformers", "transformers",
                        engines.transformers_v4, engines.v4_rope)
VLLM_07B12F1 = Reader("vllm-07b12f1", "vLLM 07b12f1", "vllm", "vLLM", engines.vllm_older)
VLLM_0CD5784 = Reader("vllm-0cd5784", "vLLM 0cd5784", "vllm", "vLLM", engines.vllm_current)
SGLANG = Reader("sglang", "SGLang", "sglang", "SGLang", engines.sglang)
TGI = Reader("tgi", "TGI", "tgi", "TGI", engines.tgi, engines.v4_rope)
LLAMACPP = Reader("llamacpp", "llama.cpp", "llama.cpp", "llama.cpp", engines.llama_cpp,
                  engines.converter_rope, measured_as="llama-cpp-python")

READERS: tuple[Reader, ...] = (TRANSFORMERS_5, TRANSFORMERS_4, VLLM_07B12F1, VLLM_0CD5784,
                               SGLANG, TGI, LLAMACPP)
IDS: tuple[str, ...] = tuple(r.id for r in READERS)
_BY_ID = {r.id: r for r in READERS}


def get(reader_id: str) -> Reader:
    """The reader of an id; KeyError naming the ids for any other string (e.g. a display name)."""
    try:
        return _BY_ID[reader_id]
    except KeyError:
        raise KeyError(f"no reader {reader_id!r}; the readers are {', '.join(IDS)}") from None


def name(reader_id: str) -> str:
    """The display name of a reader id: "vllm-07b12f1" -> "vLLM 07b12f1"."""
    return get(reader_id).name


def targets() -> tuple[str, ...]:
    """The `export --target` names of the readers, in table order (transformers first)."""
    return tuple(dict.fromkeys(r.target for r in READERS))


def of_target(target: str) -> tuple[str, ...]:
    """The ids of the readers whose form `export --target target` writes."""
    return tuple(r.id for r in READERS if r.target == target)


def is_transformers(reader_id: str) -> bool:
    return get(reader_id).target == "transformers"

"""What a result *is*: everything that changes the number, hashed into the keys that decide
resume and reuse (see docs/evaluation.md, "Identity, resume and reuse").

- `run_identity`: the model's content (not its path), the dtype and device it runs in, the
  attention implementation, the data, and the library versions: shared by every cell of a run.
- a cell's `key` = hash(run identity, the cell's own settings, the model config in the cell's
  state): `--resume` skips a cell only when its key is already stored.
- a cell's `signature` = hash(run identity, protocol settings, the rotary cos/sin at the forward
  lengths, the attention implementation and every non-rope config entry): two cells with equal
  signatures compute the same logits, so the later one copies the earlier result (`same_as`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
import transformers

from ..._version import __version__
from ...data.embedded import resolve_model
from ...rope.compat import text_config
from ...rope.registry import rotary_modules

# Config entries that only shape the rotary cos/sin (already compared through the cos/sin).
ROPE_KEYS = {"rope_parameters", "rope_scaling", "rope_theta", "max_position_embeddings"}
# Files of a checkpoint folder that do not change the computation.
_IGNORED = {"README.md", ".gitattributes", "LICENSE"}
_file_hashes: dict[tuple, str] = {}


def digest(obj) -> str:
    """A short stable hash of a JSON-able object."""
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def file_hash(path: Path) -> str:
    """sha256 of a file's bytes, memoised per (path, size, mtime) within the process."""
    st = path.stat()
    memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _file_hashes:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _file_hashes[memo] = h.hexdigest()
    return _file_hashes[memo]


def checkpoint_fingerprint(path: str | os.PathLike, gguf_file: str | None = None) -> str:
    """A hash of a local checkpoint's content: every file of the folder (config, weights,
    tokenizer), or the one GGUF file and the folder's JSON files. Two folders holding the same
    files have the same fingerprint; a file changed in place changes it."""
    root = Path(path).expanduser()
    # Top-level files only: transformers reads a checkpoint from its folder, not subfolders
    # (a training folder's checkpoint-*/ copies must not be hashed with it).
    files = sorted(p for p in root.iterdir() if p.is_file() and p.name not in _IGNORED
                   and not p.name.startswith("."))
    if gguf_file:
        files = [root / gguf_file] + [p for p in files if p.suffix == ".json"]
    return digest([(str(p.relative_to(root)), file_hash(p)) for p in files])


def source_fingerprint(model: str, gguf_file: str | None = None, revision: str | None = None
                       ) -> str | None:
    """The content fingerprint of what `--model` names, before loading it: a local folder's
    files, the embedded GGUF, or the git commit of a Hub snapshot already in the local cache
    (git commits are content hashes). None for a Hub model not cached yet (see `loaded_fingerprint`)."""

    model, gguf_file = resolve_model(model, gguf_file)
    path = Path(model).expanduser()
    if path.is_dir():
        return checkpoint_fingerprint(path, gguf_file)
    from huggingface_hub import try_to_load_from_cache
    hit = try_to_load_from_cache(model, gguf_file or "config.json", revision=revision)
    return f"hub:{Path(hit).parent.name}" if isinstance(hit, str) else None


def loaded_fingerprint(model, before: str | None) -> str:
    """`before` when known, else the Hub commit transformers recorded, else the weights' hash."""
    commit = getattr(model.config, "_commit_hash", None)
    return before or (f"hub:{commit}" if commit else weights_fingerprint(model))


@torch.inference_mode()
def weights_fingerprint(model: torch.nn.Module) -> str:
    """A hash of the model's persistent state (parameters and saved buffers), for models that
    exist only in memory (e.g. just fine-tuned). Same weights, same hash, wherever they live."""
    h = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def model_dtype(model: torch.nn.Module) -> str:
    param = next(model.parameters(), None)
    return str(param.dtype).replace("torch.", "") if param is not None else "none"


def attention_implementation(model) -> str:
    return str(getattr(text_config(model.config), "_attn_implementation", None)
               or getattr(model.config, "_attn_implementation", None))


def run_identity(model, *, fingerprint: str | None, device, data_hash: str | None, **extra) -> dict:
    """The identity every cell of a run shares (`extra`: the protocol's run-wide settings).
    data_hash None: the protocol puts a data hash in each cell instead (retrieval: per task)."""
    return {"model_fingerprint": fingerprint or weights_fingerprint(model),
            "dtype": model_dtype(model), "device": str(torch.device(device)),
            "attn_implementation": attention_implementation(model),
            **({"data_hash": data_hash} if data_hash is not None else {}),
            "versions": f"hf_posext {__version__}, transformers {transformers.__version__}, "
                        f"torch {torch.__version__}", **extra}


def config_state(model) -> dict:
    """The model config as the cell runs it (after patching), with the attention setting."""
    config = text_config(model.config)
    d = {k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
    d["_attn_implementation"] = attention_implementation(model)
    return d


def _cos_sin(module, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [1, seq_len, d], of a rotary module for positions 0..seq_len-1 (dynamic
    modules run at seq_len, exactly as a forward of that length runs them)."""
    x = torch.zeros(1, dtype=torch.float32, device=module.inv_freq.device)
    return module(x, torch.arange(seq_len, device=module.inv_freq.device)[None])


@torch.inference_mode()
def rope_signature(model, seq_len: int) -> str:
    """A hash of the cos/sin every rotary module produces for positions 0..seq_len-1 (dynamic
    modules run at seq_len, exactly as the forward will run them)."""
    h = hashlib.sha256()
    for _, _, module in rotary_modules(model):
        cos, sin = _cos_sin(module, seq_len)
        h.update(cos.float().cpu().numpy().tobytes())
        h.update(sin.float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def computation_signature(model, lengths) -> dict:
    """What decides the logits besides weights and data: cos/sin at each forward length, and
    the attention implementation with every config entry that is not rope-only (an
    attention-level method may share cos/sin with `none` and still compute something else)."""
    state = {k: v for k, v in config_state(model).items() if k not in ROPE_KEYS}
    return {"rope": [rope_signature(model, n) for n in sorted(set(lengths))],
            "attention": digest(state)}


@torch.inference_mode()
def rope_prefix_stable(model, short: int, long: int) -> bool:
    """True when every rotary module gives positions 0..short-1 the same cos/sin in a forward of
    `long` tokens as in one of `short`: then (attention being causal) the first `short` tokens'
    logits of the longer forward are those of the shorter one, and one forward serves both
    lengths. False for dynamic types (NTK/YaRN rescaled by the sequence length) and `longrope`
    (short or long factors chosen by the sequence length)."""
    for _, _, module in rotary_modules(model):
        (cos_l, sin_l), (cos_s, sin_s) = _cos_sin(module, long), _cos_sin(module, short)
        if not (torch.equal(cos_l[:, :short], cos_s) and torch.equal(sin_l[:, :short], sin_s)):
            return False
    return True

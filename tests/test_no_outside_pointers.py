"""Nothing in the repository points outside it: no machine path (`/work/...`), no document that
is not in the repository (`REFERENCE §11`, `REFERENCE.md`, `../shared`), no number of the
project's own tracker (`issue 29`, `(issue #36)`, `the issue's target`) and no team role
(`the lead`). A reader of a clone has none of those; the sentence says what is meant instead.

Upstream references stay: a `#NNN` (or `issue NNN`) with another project's name shortly before
it on the same line (`vllm #48351`, `vllm#18728`, `transformers #41934, #45945`, `llama.cpp
#13331`, `NVIDIA/Megatron-LM issue #1418`) is public and says where to look.

Every tracked text file is read (`git ls-files`), except recorded results data
(benchmarks/results/**/*.json, *.jsonl, *.csv), binary files (images, notebooks' outputs) and
this file, whose patterns name what they forbid."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Recorded data (what a run wrote, kept as it was written) and binary outputs.
DATA = re.compile(r"^benchmarks/results/.*\.(json|jsonl|csv)$")
BINARY = (".png", ".jpg", ".jpeg", ".gif", ".pdf", ".ipynb", ".gguf", ".safetensors", ".bin", ".pt",
          ".coverage")

# Another project's name: a `#NNN` / `issue NNN` within WINDOW characters after one (on the same
# line) is that project's. Matched as a word (`vllm_parity.md` is a file, not vLLM).
PROJECTS = (
    "vllm", "vllm-project", "vllm-ascend", "transformers", "huggingface", "sglang", "llama.cpp",
    "llama-cpp-python", "ggml", "LongLM", "unsloth", "prime-rl", "peft", "pytorch", "tvm", "NeMo",
    "Megatron-LM", "Qwen3", "QwenLM", "GenAIEval", "mlx-lm", "mlx-examples", "pegainfer", "axolotl",
    "lm-evaluation-harness", "text-generation-inference", "TGI", "flash-attention", "exllamav2",
    "exllamav3", "ollama", "TensorRT-LLM",
)
PROJECT = re.compile(r"(?<![\w.-])(?:" + "|".join(re.escape(p) for p in PROJECTS) + r")(?![\w-])",
                     re.IGNORECASE)
WINDOW = 60

ISSUE_WORD = re.compile(r"\b[Ii]ssues? #?\d+")
HASH_NUMBER = re.compile(r"(?<![\w/.&-])#\d+\b")
# Each: (what it is, pattern). Issue citations are checked apart (they may be upstream ones).
FORBIDDEN = (
    ("a machine path outside the repository", re.compile(r"(?<![\w.-])/work/")),
    ("a document not in the repository", re.compile(r"\bREFERENCE(?: §|\.md|:)")),
    ("a document not in the repository", re.compile(r"\.\./shared\b")),
    ("a citation of the project's tracker", re.compile(r"\b[Tt]he issue(?:'s|s')?\b")),
    ("a team role", re.compile(r"\b[Tt]he lead(?![\w-])|\blead's\b|\b[Tt]he CEO\b")),
)


def _git_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and (ROOT / f).is_file()]


def tracked_files() -> list[str]:
    return [f for f in _git_files() if f != SELF and not DATA.match(f) and not f.lower().endswith(BINARY)]


def _text(path: Path) -> str | None:
    raw = path.read_bytes()
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _upstream(line: str, start: int) -> bool:
    """Whether a project's name sits within WINDOW characters before `start` on this line."""
    return PROJECT.search(line[max(0, start - WINDOW):start]) is not None


def hits_in_line(line: str) -> list[str]:
    """What on one line points outside the repository, one entry per hit."""
    found = [f"{what}: {m.group(0)!r}" for what, pattern in FORBIDDEN for m in pattern.finditer(line)]
    for pattern in (ISSUE_WORD, HASH_NUMBER):
        found += [f"a citation of the project's tracker: {m.group(0)!r}"
                  for m in pattern.finditer(line) if not _upstream(line, m.start())]
    return found


def hits(files: list[str]) -> list[str]:
    out = []
    for f in files:
        text = _text(ROOT / f)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            out += [f"{f}:{number}: {hit}" for hit in hits_in_line(line)]
    return out


@pytest.mark.parametrize("line", [
    "the figure issue 37 asks for", "(issue #36)", "#37: the dtype", "issues 29, 37",
    "The #41 target is missed", "the issue's target", "Against the issue's targets",
    "--out /work/ft-arms/share025", "(REFERENCE §11)", "(An et al. 2024; REFERENCE.md §9)",
    "(REFERENCE: LongPPL, HELMET)", "see ../shared/notes", "is the lead's", "beside the lead's tests",
])
def test_each_kind_of_pointer_is_caught(line):
    assert hits_in_line(line)


@pytest.mark.parametrize("line", [
    "vllm #48351", "vllm#18728", "(transformers #41934, #45945)", "vllm #46280, #48351, #48621",
    "llama.cpp #13331", "unsloth#7028", "LongLM #23", "transformers PR 28006",
    "github NVIDIA/Megatron-LM issue #1418", "vllm issue #48621", "mlx-lm PR #1387",
    "the searches' lead-in", "docs/portability.md#8-readers", "color='#1f77b4'",
    "a smaller lead is within the probe's noise", "runs/share025/", "benchmarks/results/side_by_side.md",
])
def test_upstream_and_ordinary_text_pass(line):
    assert not hits_in_line(line)


def test_nothing_in_the_repository_points_outside_it():
    found = hits(tracked_files())
    assert not found, "pointers outside the repository (say what is meant instead):\n" + "\n".join(found)


def test_recorded_results_name_no_machine_folder():
    """Recorded data is exempt from the wording checks above (it holds what a run wrote, model
    answers included), not from the machine-path one: a row names its checkpoint, haystack and
    folder relative to the repository (`runs/...`, `benchmarks/...`) or the installed torch's
    files as `$TORCH/...`, never a folder of the machine that ran it."""
    data = [f for f in _git_files() if DATA.match(f)]
    assert len(data) > 100   # the recorded results are there to read
    path = FORBIDDEN[0][1]
    found = [f"{f}:{n}" for f in data for n, line in enumerate((ROOT / f).read_text().splitlines(), 1)
             if path.search(line)]
    assert not found, "machine paths in recorded results (store them relative to the repository):\n" + "\n".join(found)


def test_readme_is_a_five_minute_page():
    """The front page stays short: at most 1,300 words, no line over 250 characters outside code
    blocks (the detail goes to the pages its table links)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= 1300
    inside, long_lines = False, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif not inside and len(line) > 250:
            long_lines.append(number)
    assert not long_lines, long_lines

"""The commands the documentation shows: fenced blocks (backslash continuations joined,
`# comments` cut) and inline code (which may wrap over lines), in README.md, docs/*.md and
recipes/README.md. Used by tests/test_readme.py (`hf-posext ...`) and tests/test_scripts.py
(`python benchmarks/... | recipes/...`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "recipes" / "README.md"]


def shown_commands(text: str, start: str) -> list[str]:
    """Commands in `text` matching the regex `start` at their beginning."""
    found = []
    for block in re.findall(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", text, re.S | re.M):   # fences may be indented
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.split(r"\s#\s", line)[0].strip()
            if re.match(start, line):
                found.append(line)
    prose = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.S | re.M)
    inline = (" ".join(code.split()) for code in re.findall(r"`([^`]+)`", prose))
    found += [code for code in inline if re.match(start, code)]
    return found


def documented_commands(start: str) -> list[tuple[str, str]]:
    """(doc, command) for every doc, without repeats."""
    return sorted({(doc.relative_to(ROOT).as_posix(), cmd) for doc in DOCS
                   for cmd in shown_commands(doc.read_text(), start)})

"""mkdocs hooks: the site's home page is README.md, and the repository files the pages link to
(committed results, the recipe's README, the notebooks) are part of the site.

Why: every page is written to read well on the repository too, so it links the README's
neighbours with plain relative paths (`../benchmarks/results/search.md`), and mkdocs's strict
build only accepts links to files it knows. Each such file becomes a site file whose source path
is that same relative path (`../benchmarks/...`, resolved against docs/), so mkdocs resolves the
links itself and still fails on a broken one; it is written under `repo/` in the site. README.md
is the home page with its links re-pointed from the repository root to docs/ (written once: the
README). Files outside these folders are not added, so a link to one fails the build.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

# The repository folders (and files) the pages may link to, and which files of them the site
# takes: the results a page cites, never a checkpoint's weights.
OUTSIDE = ("benchmarks/results", "recipes/README.md", "notebooks")
SUFFIXES = {".md", ".png", ".json", ".jsonl", ".csv", ".ipynb"}
_LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)\s]+)\)")


def _readme_as_home(text: str) -> str:
    """README.md links from the repository root; the home page sits in docs/."""
    def repoint(match: re.Match) -> str:
        target = match.group(1)
        return f"]({target[len('docs/'):]})" if target.startswith("docs/") else f"](../{target})"
    return _LINK.sub(repoint, text)


def on_files(files: Files, config) -> Files:
    root = Path(config.config_file_path).resolve().parent
    files.append(File.generated(config, "index.md", content=_readme_as_home((root / "README.md").read_text()),
                                 inclusion=InclusionLevel.INCLUDED))
    for entry in OUTSIDE:
        top = root / entry
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if path.suffix not in SUFFIXES:
                continue
            rel = path.relative_to(root).as_posix()
            dest = "repo/" + (rel[:-3] + ".html" if rel.endswith(".md") else rel)
            files.append(File("../" + rel, src_dir=config.docs_dir, dest_dir=config.site_dir,
                              use_directory_urls=False, dest_uri=dest, inclusion=InclusionLevel.INCLUDED))
    return files

"""The package's layout (docs/architecture.md): the import graph between its parts has no circle,
nothing inside imports the package root (`hf_posext/__init__.py`, the public API) back, at most 8
modules sit at the top level, and no file is over 400 lines.

A *part* is a subpackage (`hf_posext/rope/`, `attention/`, ...) or a top-level module
(`patcher.py`, ...). Edges are read with `ast` from every import statement, function-level ones
included (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hf_posext"
ROOT = "__init__"  # the package root: the public API, imported by no part


def _part(dotted: list[str]) -> str:
    """`['rope', 'config']` -> 'rope'; `['patcher']` -> 'patcher'; `[]` -> the root."""
    if not dotted:
        return ROOT
    return dotted[0]


def _imports(path: Path) -> list[tuple[list[str], int]]:
    """(target as a path inside hf_posext, line) for each import of hf_posext code in `path`."""
    here = list(path.relative_to(PACKAGE).with_suffix("").parts)
    package = here[:-1]  # the package a relative import starts from (for __init__ too)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
            elif node.module and node.module.split(".")[0] == "hf_posext":
                base = []
            else:
                continue
            module = [m for m in (node.module or "").split(".") if m]
            if not node.level:
                module = module[1:]
            if module:
                out.append((base + module, node.lineno))
            else:  # `from . import a, b`: each name a module of `base` or a name of its __init__
                for alias in node.names:
                    sub = PACKAGE.joinpath(*base, alias.name)
                    is_module = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
                    out.append((base + [alias.name] if is_module else base, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "hf_posext":
                    out.append((parts[1:], node.lineno))
    return out


def graph() -> dict[str, dict[str, list[str]]]:
    """part -> {imported part: ['file:line', ...]} over every .py file of the package."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("").parts
        src = _part(list(rel)) if rel != ("__init__",) else ROOT
        for target, line in _imports(path):
            dst = _part(target)
            if dst != src:
                edges[src][dst].append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return edges


def _cycle(edges) -> list[str] | None:
    """One circle of the graph as a list of parts, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state.get(nxt) is None and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(edges):
        if state.get(node) is None and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_planted_circle():
    """The checker itself can fail: a planted a -> b -> c -> a circle is reported."""
    planted = {"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}
    assert _cycle(planted) in (["a", "b", "c", "a"],)
    assert _cycle({"a": {"b": []}, "b": {}}) is None


def test_no_import_circle_between_parts():
    edges = graph()
    circle = _cycle(edges)
    if circle:
        where = [f"{a} -> {b}: {', '.join(edges[a][b])}" for a, b in zip(circle, circle[1:])]
        pytest.fail("import circle " + " -> ".join(circle) + "\n" + "\n".join(where))


def test_nothing_imports_the_package_root_back():
    """The root re-exports the public API; a part importing it would sit above and below it."""
    back = {src: sites for src, dsts in graph().items() for dst, sites in dsts.items()
            if dst == ROOT and src not in ("cli",)}
    assert not back, f"these parts import hf_posext/__init__.py: {back}"


def test_the_big_parts_form_layers():
    """The wings' order (docs/architecture.md): rope below attention below portability, the data
    and the evaluation/training wings above the public API modules; none imports a higher one."""
    order = ["errors", "rope", "attention", "catalog", "portability", "patcher", "loading", "generation",
             "adapters", "data", "evaluation", "training", "commands", "cli"]
    rank = {name: i for i, name in enumerate(order)}
    edges = graph()
    up = [f"{src} -> {dst} ({', '.join(sites)})" for src, dsts in edges.items()
          for dst, sites in dsts.items()
          if src in rank and dst in rank and rank[dst] > rank[src]]
    assert not up, "imports back up:\n" + "\n".join(up)


def test_at_most_eight_top_level_modules():
    # __init__.py is the package itself (its public API), not a module beside the others
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, f"{len(top)} top-level modules: {top}"


def test_no_file_over_400_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"files over 400 lines: {long}"


def test_every_subpackage_is_in_the_wheel():
    """setuptools' find (pyproject: include hf_posext*) only takes folders with an __init__.py."""
    from setuptools import find_packages

    found = set(find_packages(str(PACKAGE.parent), include=["hf_posext*"]))
    folders = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("*.py")}
    assert folders <= found, f"not packaged: {sorted(folders - found)}"


if __name__ == "__main__":  # print the graph: python tests/test_layout.py
    for src, dsts in sorted(graph().items()):
        print(f"{src:12} -> {', '.join(sorted(dsts))}")

"""The package's layout (docs/architecture.md): the import graph between its parts has no circle,
nor has the graph between its modules, nor the one between the repository's scripts (benchmarks/,
recipes/, tests/: a script imports another by its file name); no test loads a benchmarks/ script
by its path (it runs it as a command, or imports the package); nothing inside imports the package
root (`hf_posext/__init__.py`, the public API) back, at most 8 modules sit at the top level, no
file (nor documentation page) is over 400 lines, and each subpackage's docstring names exactly the modules it has.

A *part* is a subpackage (`hf_posext/rope/`, `attention/`, ...) or a top-level module
(`patcher.py`, ...). Edges are read with `ast` from every import statement, function-level ones
included (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hf_posext"
REPO = PACKAGE.parent
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


def _module_of(dotted: list[str]) -> str | None:
    """The file an import target lands in: `['rope', 'config']` -> 'rope/config.py', `['rope']` ->
    'rope/__init__.py'; a name imported from a module (`['rope', 'config', 'X']`) -> its module."""
    for k in range(len(dotted), -1, -1):
        path = PACKAGE.joinpath(*dotted[:k])
        if path.with_suffix(".py").is_file():
            return str(path.with_suffix(".py").relative_to(PACKAGE))
        if (path / "__init__.py").is_file():
            return str((path / "__init__.py").relative_to(PACKAGE))
    return None


def module_graph() -> dict[str, dict[str, list[str]]]:
    """module file -> {imported module file: ['line', ...]} inside the package."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        src = str(path.relative_to(PACKAGE))
        for target, line in _imports(path):
            dst = _module_of(target)
            if dst is not None and dst != src:
                edges[src][dst].append(str(line))
    return edges


def _scripts(root: Path) -> list[Path]:
    """Every .py file of the repository outside the package (and outside hidden folders: .git,
    the venvs)."""
    return sorted(p for p in root.rglob("*.py") if not any(part.startswith(".") for part in
                  p.relative_to(root).parts) and p.relative_to(root).parts[0] != PACKAGE.name)


def script_graph(root: Path = REPO) -> dict[str, dict[str, list[str]]]:
    """script -> {imported script: ['line', ...]}. A script imports another by its file name
    (`from search_setup import ...`, with the folder on sys.path): a top-level import names the
    script of that name in the importer's folder, else every script of that name in the repo."""
    scripts = _scripts(root)
    by_name: dict[str, list[Path]] = defaultdict(list)
    for path in scripts:
        by_name[path.stem].append(path)
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in scripts:
        src = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found = by_name.get(name.split(".")[0], [])
                near = [p for p in found if p.parent == path.parent]
                for dst in near or found:
                    if dst != path:
                        edges[src][str(dst.relative_to(root))].append(str(node.lineno))
    return edges


def _fail_on_circle(edges, what: str) -> None:
    circle = _cycle(edges)
    if circle:
        where = [f"{a} -> {b}: {', '.join(edges[a][b])}" for a, b in zip(circle, circle[1:])]
        pytest.fail(f"import circle between {what}: " + " -> ".join(circle) + "\n" + "\n".join(where))


def test_the_cycle_finder_finds_a_planted_circle():
    """The checker itself can fail: a planted a -> b -> c -> a circle is reported."""
    planted = {"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}
    assert _cycle(planted) in (["a", "b", "c", "a"],)
    assert _cycle({"a": {"b": []}, "b": {}}) is None


def test_the_script_graph_sees_scripts_importing_each_other(tmp_path):
    """A planted pair of scripts importing each other (one lazily, in a function) is a circle;
    a script's own folder wins over a namesake elsewhere."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "bench" / "steps.py").write_text("import json\nfrom report import table\n")
    (tmp_path / "bench" / "report.py").write_text("def table():\n    from steps import X\n")
    (tmp_path / "tools" / "report.py").write_text("import os\n")
    edges = script_graph(tmp_path)
    assert dict(edges["bench/steps.py"]) == {"bench/report.py": ["2"]}
    assert _cycle(edges) == ["bench/report.py", "bench/steps.py", "bench/report.py"]


def test_no_import_circle_between_parts():
    _fail_on_circle(graph(), "parts of hf_posext")


def test_no_import_circle_between_modules():
    _fail_on_circle(module_graph(), "modules of hf_posext")


@pytest.mark.slow
def test_no_import_circle_between_scripts():
    """benchmarks/, recipes/, tests/: scripts import each other by file name (benchmarks/search.py
    and search_report.py share search_setup.py instead of importing each other)."""
    edges = script_graph()
    assert edges["benchmarks/search_report.py"], "the script graph reads no script import"
    _fail_on_circle(edges, "scripts")


# How a file can load another by its path into the running process (not through a command line)
LOADERS = {"run_path", "run_module", "spec_from_file_location", "SourceFileLoader", "syspath_prepend"}


def _is_sys_path(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def path_loads(source: str) -> list[int]:
    """The lines where `source` loads a file by its path into its own process: runpy, importlib's
    file loaders, pytest's syspath_prepend, or sys.path changed (insert / append / extend, an item
    or the whole list set). Inside a function that calls os.fork the load runs in the child, a
    process of its own started with its own argv: that is a command line (tests/test_scripts.py
    runs each script's `--help` so), not a load."""
    tree = ast.parse(source)
    forked = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "fork"
                for n in ast.walk(fn)):
            forked |= {id(n) for n in ast.walk(fn)}
    lines = []
    for node in ast.walk(tree):
        if id(node) in forked:
            continue
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in LOADERS or (name in ("insert", "append", "extend") and _is_sys_path(node.func.value)) or (
                    name == "setattr" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value == "path"):
                lines.append(node.lineno)
        elif isinstance(node, ast.Assign) and any(
                _is_sys_path(t) or (isinstance(t, ast.Subscript) and _is_sys_path(t.value))
                for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_path_load_finder_finds_planted_loads():
    planted = """import runpy, sys, importlib.util
runpy.run_path("scripts/x.py")
spec = importlib.util.spec_from_file_location("x", "scripts/x.py")
sys.path.insert(0, "scripts")
def fixture(monkeypatch):
    monkeypatch.syspath_prepend("scripts")
    monkeypatch.setattr(sys, "path", ["scripts"])
sys.path[0] = "scripts"
def child(path):
    import os
    if not os.fork():
        sys.argv, sys.path[0] = [path], "scripts"
        runpy.run_path(path, run_name="__main__")
"""
    assert path_loads(planted) == [2, 3, 4, 6, 7, 8]


def test_no_test_loads_a_benchmark_script_by_path():
    """A test exercises a benchmarks/ script through its command line (`python benchmarks/<script>.py ...`
    in a process of its own, on tiny local data) or the library it calls, never by loading the
    file into the test's process (runpy, spec_from_file_location, sys.path, or an import by file
    name): what a test needs of a script belongs in the package, where the script imports it."""
    tests = REPO / "tests"
    loads = {str(p.relative_to(REPO)): lines for p in sorted(tests.rglob("*.py"))
             if "benchmarks" in (text := p.read_text()) and (lines := path_loads(text))}
    assert not loads, f"tests loading files by path (line numbers), in files naming benchmarks/: {loads}"
    imports = {src: found for src, dsts in script_graph().items() if src.startswith("tests/")
               and (found := sorted(d for d in dsts if d.startswith("benchmarks/")))}
    assert not imports, f"tests importing benchmark scripts by file name: {imports}"


def test_nothing_imports_the_package_root_back():
    """The root re-exports the public API; a part importing it would sit above and below it."""
    back = {src: sites for src, dsts in graph().items() for dst, sites in dsts.items()
            if dst == ROOT and src not in ("cli",)}
    assert not back, f"these parts import hf_posext/__init__.py: {back}"


def test_the_big_parts_form_layers():
    """The wings' order (docs/architecture.md): rope below attention below portability, the data
    and the evaluation/training wings above the public API modules; none imports a higher one."""
    order = ["errors", "rope", "attention", "catalog", "portability", "patcher", "loading", "generation",
             "adapters", "data", "evaluation", "search", "training", "commands", "cli"]
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
    """Every Python file of the repository (the package, tests, benchmarks, recipes, notebooks'
    helpers), not the package alone: the rule is the project's."""
    long = {str(p.relative_to(REPO)): n for p in REPO.rglob("*.py")
            if not any(part.startswith(".") or part in ("build", "site") for part in p.relative_to(REPO).parts)
            and (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"files over 400 lines: {long}"


def test_no_doc_page_over_400_lines():
    """The same rule for the documentation: every docs/*.md page, README.md and recipes/README.md
    (a long page splits where its topic does, into pages of its own under docs/)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "recipes" / "README.md"]
    long = {str(p.relative_to(REPO)): n for p in pages if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"pages over 400 lines: {long}"


def test_every_subpackage_is_in_the_wheel():
    """setuptools' find (pyproject: include hf_posext*) only takes folders with an __init__.py."""
    from setuptools import find_packages

    found = set(find_packages(str(PACKAGE.parent), include=["hf_posext*"]))
    folders = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("*.py")}
    assert folders <= found, f"not packaged: {sorted(folders - found)}"


def _subpackages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def named_modules(doc: str) -> set[str]:
    """The modules a docstring names: `name.py` (not a path such as `recipes/finetune.py` or
    `hf_posext/cli.py`) and subfolders `name/`."""
    files = re.findall(r"(?<![\w/.])(\w+\.py)\b", doc)
    folders = re.findall(r"(?<![\w/.])(\w+)/(?![\w.])", doc)
    return set(files) | {f"{name}/" for name in folders}


def test_the_docstring_parser_reads_module_names():
    doc = "run.py  the run (`recipes/finetune.py` is a path) · measurement/ the module; cli.py"
    assert named_modules(doc) == {"run.py", "measurement/", "cli.py"}


@pytest.mark.parametrize("folder", _subpackages(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_subpackage_docstring_names_exactly_its_modules(folder):
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    have = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    have |= {f"{p.parent.name}/" for p in folder.glob("*/__init__.py")}
    named = named_modules(doc)
    assert named == have, (f"{folder.relative_to(REPO)}/__init__.py's docstring: missing "
                           f"{sorted(have - named)}, names what is not there {sorted(named - have)}")


TOP_FOLDERS = ("hf_posext", "docs", "benchmarks", "recipes", "tests", "notebooks")
# a path into the repo: `docs/portability.md`, `hf_posext/search/`; not a glob (`search-*/`,
# `benchmarks.{md,json}`), a placeholder (`<out>`) or a dotted name (`rope/compat.get_rope_parameters`)
REPO_PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w./-]*[\w/])(?![\w*{<-]|\.\{)" % "|".join(TOP_FOLDERS))


def missing_paths(text: str) -> list[str]:
    """The repo paths `text` names that do not exist (hidden folders such as benchmarks/.tuning-mix/
    are generated, never committed: not counted; nor is a benchmark's own output folder,
    benchmarks/results/NAME without a suffix, which its first run creates)."""
    refs = [m.group(1).rstrip(".") for m in REPO_PATH.finditer(text)]
    return [r for r in refs if not (REPO / r).exists() and not any(p.startswith(".") for p in Path(r).parts)
            and not _run_output(Path(r))]


def _run_output(path: Path) -> bool:
    return path.parent == Path("benchmarks/results") and not path.suffix


def test_the_path_finder_finds_a_missing_path():
    nowhere = "docs/" + "nowhere.md"   # split: this file's own text names no missing path
    text = f"see docs/architecture.md and {nowhere}, hf_posext/search/run.py, `search-*/` and rope/x.y"
    assert missing_paths(text) == [nowhere]


def test_every_path_the_repo_names_exists():
    """Code, docs and configs name only files that exist (a module moved: its mentions move too)."""
    tracked = [p for p in [*REPO.glob("*"), *(q for top in TOP_FOLDERS for q in (REPO / top).rglob("*"))]
               if p.is_file() and p.suffix in (".py", ".md", ".toml", ".yaml", ".ipynb")
               and not any(part.startswith(".") for part in p.relative_to(REPO).parts)]
    missing = {str(p.relative_to(REPO)): found for p in tracked if (found := missing_paths(p.read_text()))}
    assert not missing, f"paths that do not exist: {missing}"


if __name__ == "__main__":  # print the graph: python tests/test_layout.py
    for src, dsts in sorted(graph().items()):
        print(f"{src:12} -> {', '.join(sorted(dsts))}")

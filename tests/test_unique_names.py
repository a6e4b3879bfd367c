"""One name, one meaning: no top-level function or class name of the package is defined in two
modules, save the few deliberate patterns of ALLOWED below (each with the modules it may be in).

Read with `ast` from every .py file of hf_posext/: the `def` / `class` statements of a module's
body (and of its top-level `if` / `try` blocks: a name defined in both branches is one name).
A private name (a leading underscore) is the module's own and is left out, unless another module
reaches it (`from .m import _name` or `m._name`): then it is as public as any other.
(tests/test_layout.py checks the package's other layout rules.)
"""

from __future__ import annotations

import ast
from collections import defaultdict
from fnmatch import fnmatch
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hf_posext"

# name -> (the modules it may be defined in, as globs relative to hf_posext/; why).
ALLOWED: dict[str, tuple[tuple[str, ...], str]] = {
    # cli.py's command protocol: each command module adds its subparser with `add_subcommand`,
    # which sets `run` (the command's body) as the function cli.main calls. retrieval_plan.run is
    # the `retrieval` command's body for a sequential plan (retrieval.run hands over to it).
    "add_subcommand": (("commands/*.py",), "each CLI command module's hook, called by cli.py"),
    "run": (("commands/*.py", "training/recipe.py"),
            "a command's body (cli.py's protocol), and the fine-tuning recipe's entry run(cfg)"),
    # process entry points: the console script and the vLLM worker run as `python -m`
    "main": (("cli.py", "evaluation/retrieval/vllm_worker.py"), "a process's entry point"),
    # one meaning in each: add this module's entries to an outside registry (transformers'
    # ROPE_INIT_FUNCTIONS / attention interfaces, lm-eval's models), called as `module.register()`
    "register": (("rope/registry.py", "attention/interface.py", "attention/continuation.py",
                  "evaluation/integrations/harness_vllm.py"),
                 "adds the module's entries to an outside registry (idempotent)"),
    # one meaning: the catalog's is rope/config's over every method (it delegates, passing METHODS)
    "canonical_method": (("catalog.py", "rope/config.py"),
                         "the same alias resolution; catalog's passes every method to rope/config's"),
}


def _top_level(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node
        elif isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody
                                  + [s for h in node.handlers for s in h.body])


def _reached_private(tree: ast.Module) -> set[str]:
    """Private names this module takes from another module of the package: imported by name,
    or read as an attribute of a name a package import bound."""
    bound, out = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("hf_posext")):
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if alias.name.startswith("_"):
                    out.add(alias.name)
        elif isinstance(node, ast.Import):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("hf_posext"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            out.add(node.attr)
    return out


def definitions() -> dict[str, list[str]]:
    """name -> the modules (paths relative to hf_posext/) defining it at top level, for every
    public name and every private one another module reaches."""
    where: dict[str, set[str]] = defaultdict(set)
    reached: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        reached |= _reached_private(tree)
        for node in _top_level(tree.body):
            where[node.name].add(path.relative_to(PACKAGE).as_posix())
    return {name: sorted(mods) for name, mods in where.items()
            if not name.startswith("_") or name in reached}


def test_no_name_is_defined_in_two_modules():
    seen = definitions()
    twice = {name: mods for name, mods in seen.items() if len(mods) > 1
             and not (name in ALLOWED and all(any(fnmatch(m, g) for g in ALLOWED[name][0]) for m in mods))}
    assert not twice, ("names defined in more than one module (rename one to say what it does, or "
                       "add a deliberate pattern to ALLOWED with its reason):\n"
                       + "\n".join(f"  {name}: {', '.join(mods)}" for name, mods in sorted(twice.items())))


def test_the_allow_list_is_in_use():
    """Each entry still names a name defined in two modules (a stale entry would let a new
    duplicate of that name through unseen)."""
    seen = definitions()
    stale = [name for name in ALLOWED if len(seen.get(name, ())) < 2]
    assert not stale, f"ALLOWED entries no longer defined twice (drop them): {stale}"


def test_the_walk_sees_a_duplicate(tmp_path, monkeypatch):
    """The check itself: a public name in two modules is found, a private one is not, unless a
    module reaches it; one name in both branches of an `if` is one definition."""
    pkg = tmp_path / "hf_posext"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("def shared():\n    pass\n\ndef _own():\n    pass\n\ndef _lent():\n    pass\n")
    (pkg / "sub" / "b.py").write_text("from ..a import _lent\n\nclass shared:\n    pass\n\n"
                                      "def _own():\n    pass\n\ndef _lent():\n    pass\n\n"
                                      "if True:\n    def once():\n        pass\nelse:\n"
                                      "    def once():\n        pass\n")
    monkeypatch.setitem(globals(), "PACKAGE", pkg)
    seen = definitions()
    assert seen["shared"] == ["a.py", "sub/b.py"] and seen["_lent"] == ["a.py", "sub/b.py"]
    assert "_own" not in seen and seen["once"] == ["sub/b.py"]

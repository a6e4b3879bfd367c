"""Every script under benchmarks/ and recipes/ has a real command line: `--help` prints usage and
exits 0 doing nothing else (no model load, no evaluation, no file written). Scripts are found by
glob, so a new one is covered without editing this file; a file counts as a helper module (not
run) only when it has no `__main__` entry and a sibling script imports it."""

from __future__ import annotations

import argparse
import os
import re
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
from _doccommands import documented_commands

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("benchmarks", "recipes")


def _imported_by_a_sibling(path: Path) -> bool:
    pattern = re.compile(rf"^\s*(from {path.stem} import|import {path.stem}\b)", re.M)
    return any(pattern.search(p.read_text()) for p in path.parent.glob("*.py") if p != path)


def scripts() -> list[Path]:
    found = []
    for path in sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")):
        text = path.read_text()
        if "__main__" not in text and _imported_by_a_sibling(path):
            continue   # a helper module of a script beside it
        found.append(path)
    return found


def tree_state() -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of every file in the repository but .git, virtualenvs and the build's own
    folders: a script's `--help` must leave all of them as they were (and add none). build/ and
    *.egg-info are left out because CI builds the other venvs in the background while this test
    runs, logging into build/ (.ci/run): their changes are not the script's."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        top = Path(dirpath) == ROOT
        dirnames[:] = [d for d in dirnames if d != ".git" and not d.startswith(".venv")
                       and d not in ("__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache")
                       and not (top and d == "build") and not d.endswith(".egg-info")]
        for name in filenames:
            st = os.stat(os.path.join(dirpath, name))
            state[os.path.relpath(os.path.join(dirpath, name), ROOT)] = (st.st_mtime_ns, st.st_size)
    return state


def test_scripts_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in scripts()}
    # the ones the README runs, and no helper module counted as a script
    assert {"recipes/ddp_smoke.py", "recipes/finetune.py", "benchmarks/run.py",
            "benchmarks/long_context.py", "benchmarks/plain_score.py"} <= names
    assert "benchmarks/long_context_report.py" not in names


def run_forked(path: Path, argv: list[str], cwd: Path, logs: Path, parse_only: bool = False) -> int:
    """Start `python path *argv` as a fork of this process: torch, transformers and hf_posext are
    imported already, so 17 scripts cost seconds instead of 17 interpreter starts on 2 cores. The
    child runs the file as __main__ with the script's folder first on sys.path, as `python path`
    does; its stdout / stderr go to logs/<stem>.out / .err. `parse_only`: the first successful
    argparse parse prints "parsed" and exits 0 (the script's own parser, nothing run). Returns
    the child's pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.chdir(cwd)
        for fd, suffix in ((1, "out"), (2, "err")):
            os.dup2(os.open(logs / f"{path.stem}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        sys.argv, sys.path[0] = [str(path), *argv], str(path.parent)
        if parse_only:
            parse = argparse.ArgumentParser.parse_args

            def parse_then_stop(self, args=None, namespace=None):
                parse(self, args, namespace)
                print("parsed")
                raise SystemExit(0)
            argparse.ArgumentParser.parse_args = parse_then_stop
        runpy.run_path(str(path), run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def test_every_script_answers_help_and_does_nothing_else(tmp_path):
    import hf_posext  # noqa: F401  (imported before the forks, so each child has it for free)

    cwd, logs = tmp_path / "cwd", tmp_path / "logs"
    cwd.mkdir()
    logs.mkdir()
    before = tree_state()
    pids = {run_forked(path, ["--help"], cwd, logs): path for path in scripts()}
    failures, deadline = [], time.monotonic() + 120   # --help takes a second: more is real work
    try:
        while pids and time.monotonic() < deadline:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                time.sleep(0.05)
                continue
            path = pids.pop(pid)
            out, err = ((logs / f"{path.stem}.{s}").read_text() for s in ("out", "err"))
            name, code = path.relative_to(ROOT).as_posix(), os.waitstatus_to_exitcode(status)
            if code != 0:
                failures.append(f"{name}: exit {code}: {err.strip().splitlines()[-1:]}")
            elif not re.search(r"^usage: ", out, re.M):
                failures.append(f"{name}: no usage on stdout: {out[:200]!r}")
    finally:
        for pid, path in pids.items():
            failures.append(f"{path.relative_to(ROOT).as_posix()}: still running after 120 s (it started working)")
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert not failures, "\n".join(failures)
    after = tree_state()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"--help wrote into the repository: {changed}"
    assert not list(cwd.iterdir()), "--help wrote into its working directory"


@pytest.mark.parametrize("argv, message", [
    (["recipes/plot_loss.py", "nowhere"], "nowhere"),
    (["recipes/plot_loss.py"], "usage"),
    (["benchmarks/plain_score.py", "{oops"], "JSON"),
])
def test_a_missing_input_is_one_line(argv, message, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / argv[0]), *argv[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# `python benchmarks/<script> ...` as the docs show it (PYTHONPATH=. / flock / .venv/bin/ prefixes)
SCRIPT_COMMAND = r"(PYTHONPATH=\S+ )?(flock \S+ )?(\S*/)?python3? ((benchmarks|recipes)/\S+\.py)"


def test_documented_script_commands_parse(tmp_path):
    """Each `python benchmarks/... | recipes/...` command in the docs is accepted by that script's
    own parser (run up to its parse, in a fork), so a renamed flag or step fails here. A command
    with a placeholder (an all-capitals word such as STEP, or <...>) says what goes there, and is
    not run."""
    import shlex

    commands = [(doc, cmd) for doc, cmd in documented_commands(SCRIPT_COMMAND)
                if not re.search(r"(^|\s)([A-Z][A-Z_]+|'?<[^>]*>'?)(\s|$)", cmd.split(".py", 1)[1])]
    assert len(commands) >= 8, commands
    logs, failures = tmp_path / "logs", []
    logs.mkdir()
    for doc, cmd in commands:
        script = ROOT / re.match(SCRIPT_COMMAND, cmd).group(4)
        argv = shlex.split(cmd[re.match(SCRIPT_COMMAND, cmd).end():])
        assert script.is_file(), f"{doc}: `{cmd}` names no file"
        pid = run_forked(script, argv, tmp_path, logs, parse_only=True)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out, err = ((logs / f"{script.stem}.{s}").read_text() for s in ("out", "err"))
        if code != 0 or "parsed" not in out:
            failures.append(f"{doc}: `{cmd}`: exit {code}: {err.strip().splitlines()[-1:]}")
    assert not failures, "\n".join(failures)


def test_documented_recipe_commands_parse(monkeypatch):
    """Each `accelerate launch ... recipes/finetune.py ARGS` the docs show: its accelerate config
    file exists and ARGS pass the recipe's own parser and validation (`parse_args`, what
    finetune.py runs first). `...` in a command is a placeholder: such a command is not parsed."""
    import shlex

    from hf_posext.training.recipe_config import parse_args

    monkeypatch.chdir(ROOT)   # the docs' paths are relative to the repository
    commands = [(doc, cmd) for doc, cmd in documented_commands(r"(flock \S+ )?(\S*/)?accelerate launch")
                if "recipes/finetune.py" in cmd]
    assert len([c for c in commands if "..." not in c[1]]) >= 5, commands
    for doc, cmd in commands:
        launch, recipe = (shlex.split(part) for part in cmd.split("recipes/finetune.py"))
        if "--config_file" in launch:
            assert (ROOT / launch[launch.index("--config_file") + 1]).is_file(), f"{doc}: `{cmd}`"
        if "..." not in recipe:
            parse_args(recipe)   # a bad key or value: a one-line ValueError naming it

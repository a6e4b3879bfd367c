"""The rule every case of the bad-inputs suite (tests/test_bad_inputs*.py) is held to: a
bad input is refused with a one-line error naming the problem, raised before any weights load;
the command line exits with status 2 (1 for a run that cannot continue) and one `error:` line,
no traceback. The suite's cases were first an adversarial probe (305 inputs over the API, the
CLI, loading, the recipe and results folders); each is now a test here."""

from __future__ import annotations

import contextlib

import pytest
import transformers

from hf_posext.errors import PosextError

# the builtins a caller of a Python API already catches for a bad value, type or path
REFUSALS = (PosextError, ValueError, TypeError, FileNotFoundError)


@contextlib.contextmanager
def counted_loads():
    """The weight loads made inside the block: every `PreTrainedModel.from_pretrained` (the Auto
    classes end there too), by class name."""
    seen: list[str] = []
    real = transformers.PreTrainedModel.from_pretrained.__func__  # type: ignore[attr-defined]  # a classmethod's function

    def counted(cls, *args, **kwargs):
        seen.append(cls.__name__)
        return real(cls, *args, **kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(counted))
        yield seen


def refused(fn, *says: str) -> str:
    """`fn()` raises one of REFUSALS with a one-line message holding each of `says`, before any
    weight loads; returns the message."""
    with counted_loads() as loads, pytest.raises(REFUSALS) as err:
        fn()
    message = str(err.value).strip()
    assert message and "\n" not in message, f"not one line: {message!r}"
    assert not loads, f"weights loaded before the error ({loads}): {message}"
    assert all(s in message for s in says), f"{says} not all in: {message}"
    return message


def cli_refused(argv: list[str], capsys, *says: str, status: int = 2) -> str:
    """`hf-posext ARGV` (in this process) exits with `status` and one error line holding each of
    `says`, no traceback, before any weight loads; returns that line."""
    from hf_posext import cli
    capsys.readouterr()
    with counted_loads() as loads, pytest.raises(SystemExit) as stop:
        cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error" in line.lower()]
    assert stop.value.code == status and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert not loads, f"weights loaded before the error ({loads}): {lines[0]}"
    assert all(s in lines[0] for s in says), f"{says} not all in: {lines[0]}"
    return lines[0]

"""The exceptions hf_posext raises for bad inputs, one small hierarchy so callers can catch them
all (`except hf_posext.errors.PosextError`) and the CLI can print each as one line.
`plain_number` is the one door numbers come in by: every real number type (numpy, torch
scalars) becomes a plain Python int / float before any check, so messages and saved configs
(config.json must stay JSON) only ever see those.

Each subclasses the builtin a caller would already catch (ValueError for a bad value, RuntimeError
for a run that cannot continue), so code written against the builtins keeps working.
"""

import numbers
import operator


def plain_number(value):
    """A real number of any type as a plain `int` (integral types: `operator.index`) or
    `float` (`numbers.Real`); anything else (bool, str, None, a list) comes back unchanged, so
    the caller's own check refuses it with its own message."""
    if isinstance(value, bool) or type(value) in (int, float):
        return value
    if isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and
                                               hasattr(type(value), "__index__")):
        try:
            return operator.index(value)  # type: ignore[arg-type]  # has __index__ (checked above)
        except TypeError:
            pass
    if isinstance(value, numbers.Real):
        return float(value)
    return value


class PosextError(Exception):
    """Base of every hf_posext error; the message names the problem and the fix in one line."""


class ConfigError(PosextError, ValueError):
    """A bad method, knob, length, recipe setting or config.json; raised before weights load."""


class BeyondReach(ConfigError):
    """A target length the method's knobs cannot keep inside the trained length (STRING past
    L + S − W): refused by `patch`; `hf-posext eval --methods all` skips such cells instead."""


class CheckpointError(PosextError, RuntimeError):
    """A recipe checkpoint or cache that is damaged, incomplete or not written by hf_posext."""


class TrainingDiverged(PosextError, RuntimeError):
    """The training loss became non-finite; the last good checkpoint is kept, nothing else saved."""


def exit_status(err: BaseException) -> int:
    """The command-line status of an error: 2 for a bad input (argparse's convention for usage
    errors), 1 for a run that could not continue (damaged file, divergence, disk)."""
    if isinstance(err, ConfigError):
        return 2
    if isinstance(err, PosextError):
        return 1
    return 2 if isinstance(err, (ValueError, TypeError, FileNotFoundError)) else 1


def one_line(prog: str, err: BaseException) -> str:
    """`prog: error: <message on one line> (rerun with --debug for the traceback)`."""
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{prog}: error: {text} (rerun with --debug for the traceback)\n"


def refuse_renamed(fn: str | None, kwargs, renamed: dict[str, str]) -> None:
    """A keyword the API renamed (old name -> new name) fails with a TypeError naming the new one,
    before any work: one name per input, never an alias (`settings.settings_only` does
    the same for the grid's fields). `fn` None: `kwargs` are a method's knobs (`--knobs`, a
    grid's knobs, a recipe's `model.knobs`), refused with a ValueError in the knobs' words."""
    for old, new in renamed.items():
        if old in kwargs:
            if fn is None:   # (a number read from the command line is a float: 4096, not 4096.0)
                value = kwargs[old]
                shown = int(value) if isinstance(value, float) and value.is_integer() else value
                raise ValueError(f"there is no knob {old}: it is called {new} here; give "
                                 f"{new}={shown!r}.")
            raise TypeError(f"{fn}() has no keyword {old}=: it is called {new}= here; pass "
                            f"{new}={kwargs[old]!r}.")


# One seed convention (docs/architecture.md, "Seeds"): a seed is where a run's random numbers
# start, an integer >= 0, default 0, whatever draws them (the search's evolution, the recipe's
# data order and PoSE, an evaluation's trials: seeds seed .. seed + trials − 1).
DEFAULT_SEED = 0


def check_seed(name: str, value) -> int:
    """A seed: an integer >= 0 (numpy integers too), else a ValueError naming `name`."""
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 (where the random numbers start; default "
                         f"{DEFAULT_SEED}), got {value!r}")
    return value

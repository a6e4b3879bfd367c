"""One seed convention (docs/architecture.md, "Seeds"): a seed is where a run's random numbers
start, an integer >= 0, default 0, and every door refuses another value in the same words
(errors.check_seed): the retrieval grid, the evolutionary search, the recipe and the CLI's
`--seed` of passkey, retrieval and search."""

import re

import numpy as np
import pytest
from _badinputs import cli_refused

from hf_posext import RetrievalGrid
from hf_posext.errors import DEFAULT_SEED, check_seed
from hf_posext.search import Evolution
from hf_posext.training.recipe_config import config_from_dict, validate

SAYS = "must be an integer >= 0 (where the random numbers start; default 0), got"


def test_the_default_is_zero_everywhere():
    assert DEFAULT_SEED == 0
    assert RetrievalGrid(["yarn"], [64]).seed == Evolution().seed == config_from_dict({}).training.seed == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_every_door_refuses_a_bad_seed_in_the_same_words(bad):
    for door in (lambda: RetrievalGrid(["yarn"], [64], seed=bad), lambda: Evolution(seed=bad)):
        with pytest.raises((ValueError, TypeError)) as err:
            door()
        assert f"seed {SAYS} {bad!r}" in str(err.value), str(err.value)


def test_the_recipe_refuses_a_negative_seed():
    """(its parser refuses a seed that is no int itself, naming training.seed)"""
    with pytest.raises(ValueError, match=re.escape(f"training.seed {SAYS} -1")):
        validate(config_from_dict({"training": {"seed": -1}}))


def test_numpy_integers_are_seeds():
    assert check_seed("seed", np.int64(7)) == 7 and type(check_seed("seed", np.int64(7))) is int
    assert RetrievalGrid(["yarn"], [64], seed=np.int32(4), trials=2).trial_seeds() == [4, 5]


@pytest.mark.parametrize("command", [["passkey"], ["retrieval"], ["search", "--target-length", "64", "--out", "x"]])
def test_every_command_reads_seed_the_same_way(command, capsys):
    cli_refused([*command, "--seed", "-3"], capsys, f"--seed {SAYS} -3")

"""Env options checked against the constructor's annotations before anything is built (`sim.registry`)."""

from __future__ import annotations

from pathlib import Path

import pytest

import sim
from sim.errors import InputError
from sim.registry import ENVS, constructor_defaults, option_problem
from sim.tasks.dataset import DatasetEnv


@pytest.mark.parametrize("name", ENVS.names())
def test_every_default_fits_its_own_annotation(name):
    """The checker refuses no env's own defaults (a false refusal would block a valid config)."""
    cls = ENVS.get(name)
    defaults = {key: value for key, value in constructor_defaults(cls).items() if not key.startswith("_")}
    assert defaults, f"{name}: no options with defaults found"
    wrong = {key: option_problem(cls, key, value) for key, value in defaults.items()}
    assert {key: problem for key, problem in wrong.items() if problem} == {}


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("image_size", "big", "expected an integer, got 'big'"),
        ("image_size", 64.0, "expected an integer, got 64.0"),
        ("image_size", True, "expected an integer, got True"),
        ("eval_fraction", "half", "expected a number, got 'half'"),
        ("shuffle", "yes", "expected true or false, got 'yes'"),
        ("split", "eval", "expected one of 'auto', 'train', 'validation', 'test', 'all', got 'eval'"),
        ("reward", 3, "expected a string or null, got 3"),
        ("reward_kwargs", {"numeric_match": 0.05}, "expected a mapping or null, got {'numeric_match': 0.05}"),
        ("imagesize", 64, "unknown option; valid: path, reward, image_size"),
    ],
)
def test_a_wrong_value_names_the_expected_type(key, value, expected):
    assert option_problem(DatasetEnv, key, value).startswith(expected)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("image_size", 64),
        ("eval_fraction", 0),  # an integer where a number is asked for
        ("path", Path("data.jsonl")),
        ("path", "data.jsonl"),
        ("reward", None),
        ("reward_kwargs", {"numeric_match": {"rel_tol": 0.05}}),
        ("consistency", "acre"),
    ],
)
def test_a_fitting_value_passes(key, value):
    assert option_problem(DatasetEnv, key, value) is None


def test_make_refuses_a_wrong_type_before_building_and_an_unknown_env_as_input_errors():
    with pytest.raises(InputError, match=r"option 'image_size' of env 'dataset': expected an integer, got 'big'"):
        sim.make("dataset", num_envs=1, image_size="big")
    with pytest.raises(InputError, match=r"unknown env 'datset'; registered: .*dataset"):
        sim.make("datset", num_envs=1)

"""Sequence-length schedules of ``simulator.datasets``."""

from __future__ import annotations

import itertools

import pytest

from simulator.datasets import sequence_length_warmup


def test_sequence_length_warmup_follows_deepspeeds_fixed_linear_schedule() -> None:
    # start 64, max 4096, 2,000 warmup steps: step k has 64 + 4032 * k // 2000 tokens, rounded
    # down to a multiple of 8: step 4 -> 64 + 8.064 = 72.06 -> 72; step 1000 -> 64 + 2016 = 2080;
    # step 1999 -> 64 + 4029.98 = 4093.98 -> 4088; from step 2000 on, 4096.
    lengths = sequence_length_warmup(2001, 4096, 2000)
    assert lengths[:5] == [64, 64, 64, 64, 72]
    assert lengths[1000] == 2080
    assert lengths[1999:] == [4088, 4096]
    assert all(b >= a for a, b in itertools.pairwise(lengths))
    # step 1001: 64 + 4032 * 1001 // 2000 = 64 + 2018 = 2082 -> 2080, the same bucket as step 1000.
    assert sequence_length_warmup(2, 4096, 2000, first_step=1000) == [2080, 2080]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"steps": 0}, "steps"),
    ({"warmup_steps": 0}, "warmup_steps"),
    ({"first_step": -1}, "first_step"),
    ({"max_tokens": 4100}, "max_tokens (4100)"),
    ({"start_tokens": 60}, "start_tokens (60)"),
    ({"start_tokens": 8192}, "start <= max"),
    ({"step_tokens": 0}, "step_tokens must be >= 1"),
])
def test_sequence_length_warmup_rejects_bad_arguments(kwargs, fragment) -> None:
    args = {"steps": 10, "max_tokens": 4096, "warmup_steps": 100, **kwargs}
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        sequence_length_warmup(**args)


def test_sequence_length_warmup_names_an_argument_that_is_not_an_integer() -> None:
    # review finding: steps=10.5 failed inside range() with a message that named nothing
    with pytest.raises(TypeError, match="steps must be an integer, got 10.5"):
        sequence_length_warmup(10.5, 4096, 100)

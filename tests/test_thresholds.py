"""Limit parsing and precedence."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_oam.thresholds import (
    LimitResolver,
    ThresholdError,
    parse_entry,
    parse_limit,
    parse_mapping,
)


@pytest.mark.parametrize(("text", "frac"), [("2%", 0.02), ("2.5%", 0.025), ("0.02", 0.02), (" 10 % ".replace(" ", ""), 0.10), (0.05, 0.05), ("0%", 0.0)])
def test_parse_limit(text, frac) -> None:
    assert parse_limit(text) == pytest.approx(frac)


@pytest.mark.parametrize("text", ["abc", "-3%", "nan", "NaN%", "inf", "-inf%", "", "%", True, None, [1]])
def test_parse_limit_rejects(text) -> None:
    with pytest.raises(ThresholdError):
        parse_limit(text)


@given(st.floats(min_value=0, max_value=100, exclude_max=True, allow_nan=False))
def test_percent_and_fraction_agree(value) -> None:
    assert parse_limit(f"{value!r}%") == pytest.approx(parse_limit(repr(value / 100)))


def test_parse_entry_and_mapping() -> None:
    assert parse_entry("MatMul=5%") == ("MatMul", 0.05)
    assert parse_entry(" FlashAttention* = 0.01 ") == ("FlashAttention*", 0.01)
    for bad in ("MatMul", "=5%", "MatMul=", "MatMul=x"):
        with pytest.raises(ThresholdError):
            parse_entry(bad)
    assert parse_mapping({"MatMul": "5%", "Add": 0.2}) == {"MatMul": 0.05, "Add": 0.2}
    with pytest.raises(ThresholdError, match="must be a dict"):
        parse_mapping(["MatMul=5%"])


def test_defaults() -> None:
    r = LimitResolver.build()
    assert r.resolve("FlashAttention").frac == 0.02
    assert r.resolve("FlashAttentionGrad").frac == 0.02
    assert r.resolve("MatMul").frac == 0.10
    assert r.resolve("step").frac == 0.10


def test_precedence_marker_cli_ini_default() -> None:
    r = LimitResolver.build(marker={"MatMul": 0.01}, cli={"MatMul": 0.02, "Add": 0.03}, ini={"MatMul": 0.04, "Add": 0.05, "Mul": 0.06})
    assert (r.resolve("MatMul").frac, r.resolve("MatMul").source) == (0.01, "marker")
    assert (r.resolve("Add").frac, r.resolve("Add").source) == (0.03, "command line")
    assert (r.resolve("Mul").frac, r.resolve("Mul").source) == (0.06, "ini")
    assert (r.resolve("SiLU").frac, r.resolve("SiLU").source) == (0.10, "default")


def test_exact_beats_glob_and_longer_glob_beats_shorter() -> None:
    r = LimitResolver.build(cli={"*": 0.5, "Flash*": 0.4, "FlashAttention*": 0.3, "FlashAttentionGrad": 0.2})
    assert r.resolve("FlashAttentionGrad").frac == 0.2
    assert r.resolve("FlashAttention").frac == 0.3
    assert r.resolve("FlashDecode").frac == 0.4
    assert r.resolve("MatMul").frac == 0.5

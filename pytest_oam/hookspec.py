"""Hooks pytest-oam calls, for conftest files and plugins to implement."""

from __future__ import annotations

import pytest


@pytest.hookspec
def pytest_oam_register_rules(rules: dict) -> None:
    """Add diagnosis rules for this session: ``rules[rule_id] = pytest_oam.rules.Rule(...)``.

    ``rules`` starts with the built-in rules (:data:`pytest_oam.rules.RULES`); entries may be
    added, replaced or removed. Called once, at configure time.
    """

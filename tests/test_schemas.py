"""The committed JSON Schemas match the models."""

from pathlib import Path

import pytest

from pytest_oam.schemas import render, schemas

FOLDER = Path(__file__).resolve().parents[1] / "schemas"


@pytest.mark.parametrize("name", sorted(schemas()))
def test_committed_schema_matches_model(name) -> None:
    assert (FOLDER / name).read_text() == render(schemas()[name]), (
        f"schemas/{name} drifted from its model: bump the schema version if the format changed, "
        "then run `python -m pytest_oam.schemas`"
    )

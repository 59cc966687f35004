"""JSON Schemas of the files pytest-oam writes, committed under ``schemas/``.

Regenerate after a model change with ``python -m pytest_oam.schemas``; a test fails when the
committed files drift from the models.
"""

from __future__ import annotations

import json
from pathlib import Path


def schemas() -> dict[str, dict]:
    """File name -> JSON Schema of each versioned file format."""
    from simulator.profile import Profile

    from .files.baseline import BaselineFile
    from .gate.record import RecordFile
    from .report.model import OamReport
    from .tuning.knowledge_base import KnowledgeBaseFile

    return {
        "baseline.v1.schema.json": BaselineFile.model_json_schema(),
        "report.v2.schema.json": OamReport.model_json_schema(),
        "profile.v1.schema.json": Profile.model_json_schema(),
        "record.v2.schema.json": RecordFile.model_json_schema(),
        "knowledge_base.v1.schema.json": KnowledgeBaseFile.model_json_schema(),
    }


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main() -> None:
    folder = Path(__file__).resolve().parents[1] / "schemas"
    folder.mkdir(exist_ok=True)
    for name, schema in schemas().items():
        (folder / name).write_text(render(schema), encoding="utf-8")
        print(f"wrote {folder / name}")


if __name__ == "__main__":
    main()

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


def test_a_version_1_report_is_upgraded_to_the_one_severity_scale() -> None:
    import json

    from pytest_oam.report import load_report

    def finding(severity, op_type, share):
        return {"run": 0, "kind": "regressed", "op_type": op_type, "severity": severity, "delta_s": 0.0,
                "step_share_frac": share, "counters": {}, "call_sites": [], "advice": []}

    old = {"schema_version": 1, "pytest_oam_version": "0", "baseline_dir": None, "status_counts": {"regressed": 1},
           "tests": [{"nodeid": "t", "status": "regressed", "findings": [
               finding("critical", "MatMul", 0.2), finding("major", "Add", 0.04), finding("major", "Mul", 0.02),
               finding("major", "memory.reserved_peak", 0.0), finding("minor", "GeLU", 0.005)]}]}
    report = load_report(json.dumps(old))
    assert report.schema_version == 2
    assert [f.severity for f in report.tests[0].findings] == ["serious", "warning", "info", "warning", "info"]
    with pytest.raises(ValueError, match="schema_version 3; this pytest-oam reads versions 1 and 2"):
        load_report(json.dumps({**old, "schema_version": 3}))
    with pytest.raises(ValueError, match="severity"):
        load_report(json.dumps({**old, "tests": [{"nodeid": "t", "status": "regressed",
                                                   "findings": [finding("grave", "MatMul", 0.2)]}]}))

"""The report of a gating run as data: the pydantic models of ``--oam-report PATH.json`` (one
:class:`GateReport` per test, carried from an xdist worker to the controller in the test's
:class:`~pytest_oam.gate.result.GateResult`), and reading and writing them. Everything shown to people is in
:mod:`pytest_oam.report.text`; unit conversions for display in :mod:`pytest_oam.format`.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..judge.severity import Severity
from ..judge.status import GateStatus

#: 2: one severity scale (fatal / serious / warning / info) for rule findings and for the
#: explanation of regressions, which version 1 graded critical / major / minor.
REPORT_SCHEMA_VERSION = 2


_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class VerdictReport(BaseModel):
    model_config = _CONFIG
    run: int = Field(ge=0, description="Index of the profiled run within the test")
    op_type: str
    baseline_s: float | None
    current_s: float | None
    change_frac: float | None
    limit_frac: float = Field(ge=0)
    limit_source: str
    status: Literal["pass", "regressed", "improved", "new", "missing", "insignificant", "not-significant"]
    statistic: Literal["median", "mean", "p99"] = Field(description="The per-step statistic that decided")
    unit: Literal["s", "bytes", "count"] = Field(
        default="s", description="Unit of baseline_s and current_s ('count': events per step, e.g. alloc_retries)")


class FindingReport(BaseModel):
    model_config = _CONFIG
    run: int = Field(ge=0)
    kind: Literal["regressed", "new"]
    op_type: str
    severity: Severity = Field(description="By the share of the baseline step the regression costs: serious from "
                               "5%, warning from 3%, info below; peak memory and allocator time: warning")
    delta_s: float
    step_share_frac: float
    counters: dict[str, tuple[float, float]] = Field(description="name -> (baseline, current)")
    call_sites: list[tuple[str, float]] = Field(
        description="(file:line, seconds in the first step); memory rows: seconds waited for flushes "
        "(alloc_retries) or bytes held at the allocated peak (the peak rows)")
    advice: list[str]


class DiagnosisReport(BaseModel):
    """A diagnosis rule's finding on one profiled run (see :mod:`pytest_oam.rules`)."""

    model_config = _CONFIG
    run: int = Field(ge=0)
    rule_id: str
    severity: Severity = Field(description="fatal: a correctness problem; performance by the share of the step a fix "
                               "saves: serious from 5%, warning from 3% (built-in rules report nothing below)")
    op_type: str
    op_name: str
    location: str | None = Field(description="file:line of the user code that launched the op")
    description: str
    fix: str
    gain_s: float = Field(ge=0, description="Estimated time a fix saves per step")
    step_share_frac: float = Field(ge=0)


class TopOp(BaseModel):
    model_config = _CONFIG
    op_type: str
    time_s: float = Field(ge=0)
    share_frac: float = Field(ge=0)


class RunReport(BaseModel):
    model_config = _CONFIG
    index: int = Field(ge=0)
    status: GateStatus
    hardware: str
    devices: int = Field(ge=1)
    step_time_s: float = Field(ge=0)
    baseline_step_time_s: float | None = None
    tokens_per_s: float | None = None
    top_ops: list[TopOp]
    reasons: list[str] = Field(default_factory=list)


class GateReport(BaseModel):
    """One profiled test of the run. ``failed``: the gate (or the tuned check) failed the test."""

    model_config = _CONFIG
    nodeid: str
    status: GateStatus
    failed: bool = False
    baseline_path: str | None = None
    message: str | None = None
    runs: list[RunReport] = Field(default_factory=list)
    verdicts: list[VerdictReport] = Field(default_factory=list)
    findings: list[FindingReport] = Field(default_factory=list)
    diagnosis: list[DiagnosisReport] = Field(default_factory=list)
    tuned_failures: list[str] = Field(
        default_factory=list, description="Calls more than their tuned limit slower than the knowledge base's "
        "optimum (the tuned check, @pytest.mark.oam(tuned=...) / --oam-tuned-limit); any one fails the test")
    tuned_notes: list[str] = Field(
        default_factory=list, description="Calls the tuned check skipped: no record for their shapes")


class OamReport(BaseModel):
    """The file ``--oam-report PATH.json`` writes."""

    model_config = _CONFIG
    schema_version: Literal[2] = REPORT_SCHEMA_VERSION
    pytest_oam_version: str
    baseline_dir: str | None
    tests: list[GateReport]
    status_counts: dict[str, int]


def dump_report(report: OamReport) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True, allow_nan=False) + "\n"


#: Version 1's severities of the explanation of a regression, on today's scale. ``major`` (1% to
#: 5% of the step, or a peak-memory / allocator-time regression) is re-graded from its share.
_V1_SEVERITY = {"critical": "serious", "minor": "info"}



def upgrade_v1_gate(test: dict) -> dict:
    """One test's gate result (:class:`GateReport` as JSON data) of a version 1 report or record,
    on the version 2 scale: its regression findings' critical / major / minor become serious /
    warning / info, a ``major`` one re-graded from its share of the step (peak memory and
    allocator time: warning). The rule findings already used the scale."""
    from ..judge.severity import grade_share
    from ..judge.thresholds import MEMORY_ROWS

    findings = []
    for f in test.get("findings", []):
        old = f.get("severity")
        if old == "major":
            new = "warning" if f.get("op_type") in MEMORY_ROWS else grade_share(f.get("step_share_frac", 0.0))
        else:
            new = _V1_SEVERITY.get(old, old)  # an unknown value stays, and validation names it
        findings.append({**f, "severity": new})
    return {**test, "findings": findings}


def load_report(text: str) -> OamReport:
    """Read the JSON text of an ``--oam-report`` file, version 1 or 2 (version 1 is upgraded).

    Raises:
        ValueError: not JSON, another schema version, or a document the model rejects
            (pydantic's ``ValidationError`` is a ``ValueError``; it names the field).
    """
    data = json.loads(text)
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version == 1:
        data = {**data, "schema_version": 2, "tests": [upgrade_v1_gate(t) for t in data.get("tests", [])]}
    elif version != REPORT_SCHEMA_VERSION:
        raise ValueError(f"report has schema_version {version!r}; this pytest-oam reads versions 1 and "
                         f"{REPORT_SCHEMA_VERSION}")
    return OamReport.model_validate(data)


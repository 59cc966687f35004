"""Record and replay: a test's whole profiled evidence in one file, analysed again anywhere.

``--oam-record=failed|all|none`` (default ``failed``) writes, for each chosen test that
profiled something, a gzip-compressed JSON :class:`RecordFile` to ``--oam-record-dir``
(default ``.oam/records``): every run's full profile (op, memory and communication records),
how each run was made, the hardware specs used, the baseline the test was compared with, the
gate's settings and the verdicts and findings it reached.

``oam replay RECORD`` runs :func:`pytest_oam.evaluate.evaluate_gate` again on the recorded
data, offline, with the recorded hardware specs, and checks that it reaches the recorded
result. ``oam replay RECORD --hardware NAME`` re-simulates the recorded op sequences on other
hardware (:func:`simulator.runtime.recost`) and prints what would change.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator.hardware import HardwareSpec
from simulator.profile import Profile

from ..files.baseline import BaselineFile
from ..report.model import GateReport

#: 2: the gate result uses one severity scale (see :data:`pytest_oam.report.REPORT_SCHEMA_VERSION`);
#: version 1 records are upgraded when read.
SCHEMA_VERSION = 2
RECORD_KIND = "pytest-oam-record"
RECORD_MODES = ("failed", "all", "none")
DEFAULT_RECORD_DIR = ".oam/records"
_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RecordError(ValueError):
    """A record file that cannot be read; the message names the file."""


class RunConfig(BaseModel):
    """How one ``oam_profile.run`` call was made (the workload is named, not stored)."""

    model_config = _CONFIG
    workload: str = Field(description="module.qualname of the workload function")
    arguments: str = Field(description="repr of the positional and keyword arguments (for reading, not rerunning)")
    steps: int = Field(ge=1)
    hardware: str
    devices: int = Field(ge=1)
    op_time_scale: dict[str, float] = Field(default_factory=dict)
    memory: bool = False
    allocator: str | None = None
    collection: Literal["offline", "online"] = "offline"


class RecordedRun(BaseModel):
    model_config = _CONFIG
    config: RunConfig
    profile: Profile


class RecordFile(BaseModel):
    """Schema version 2 of a record file (``*.oam.json.gz``)."""

    model_config = _CONFIG
    schema_version: Literal[2] = SCHEMA_VERSION
    kind: Literal["pytest-oam-record"] = RECORD_KIND
    pytest_oam_version: str
    simulator_version: str
    created_utc: str = Field(description="ISO 8601 time the record was written")
    nodeid: str
    test_outcome: Literal["passed", "failed", "skipped"]
    gate_inputs: dict[str, Any] = Field(description="pytest_oam.evaluate.GateInputs of the test")
    rules: list[str] = Field(description="Ids of the diagnosis rules that ran")
    baseline: BaselineFile | None = None
    runs: list[RecordedRun] = Field(min_length=1)
    hardware: dict[str, HardwareSpec] = Field(description="Every hardware spec the runs used, by name")
    gate: GateReport = Field(description="The result the gate reached when recorded")
    failure_text: str | None = None


def record_filename(nodeid: str) -> str:
    """The test's baseline file name (:func:`pytest_oam.baseline.baseline_filename`: portable,
    unique by a hash) ending in ``.oam.json.gz``."""
    from ..files.baseline import baseline_filename

    return baseline_filename(nodeid).removesuffix(".json") + ".oam.json.gz"


def write_record(path: Path, record: RecordFile) -> None:
    """Write ``record`` gzip-compressed, atomically (an existing record of the same test is
    replaced: records are outputs of the run, not inputs)."""
    from ..files.fileio import atomic_write_bytes

    data = record.model_dump_json().encode("utf-8")
    atomic_write_bytes(path, gzip.compress(data, compresslevel=6, mtime=0))


def load_record(path: Path) -> RecordFile:
    """Read and validate a record file (gzip-compressed or plain JSON); a version 1 record is
    upgraded (its gate's regression findings put on the one severity scale).

    Raises:
        RecordError: the file cannot be read, is not gzip or JSON, is not a record, has another
            schema version, or fails validation; the message names the file and the field.
    """
    from ..files.fileio import DuplicateKeyError, InputFileError, loads_unique, read_input_bytes

    try:
        raw = read_input_bytes(Path(path))  # regular files only; at most MAX_INPUT_BYTES decompressed
    except InputFileError as exc:
        raise RecordError(f"{path}: {exc.problem}") from None
    try:
        data = loads_unique(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RecordError(f"{path}: is not a record (neither gzip nor UTF-8 JSON)") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise RecordError(f"{path}: is not a record: its JSON nests too deeply") from None
    except DuplicateKeyError as exc:
        raise RecordError(f"{path}: is not a record: it {exc}") from None
    except ValueError as exc:  # an integer literal past the interpreter's digit limit
        raise RecordError(f"{path}: is not a record: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != RECORD_KIND:
        what = "a baseline file" if isinstance(data, dict) and "runs" in data and "nodeid" in data else "not a record"
        raise RecordError(f"{path}: is {what}; oam replay reads the *.oam.json.gz files that --oam-record writes")
    if data.get("schema_version") == 1 and isinstance(data.get("gate"), dict):
        from ..report.model import upgrade_v1_gate

        data = {**data, "schema_version": SCHEMA_VERSION, "gate": upgrade_v1_gate(data["gate"])}
    if data.get("schema_version") != SCHEMA_VERSION:
        raise RecordError(f"{path}: has schema_version {data.get('schema_version')!r}; "
                          f"this pytest-oam reads versions 1 and {SCHEMA_VERSION}")
    try:
        return RecordFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise RecordError(f"{path}: is not a valid record: {where}: {err['msg']}") from None


def make_record(
    *, nodeid: str, test_outcome: str, gate_inputs: dict[str, Any], rules: list[str],
    baseline: BaselineFile | None, runs: list[tuple[RunConfig, Profile]], gate: GateReport,
    failure_text: str | None,
) -> RecordFile:
    """Assemble a record; the hardware specs are taken from the bundled ones the runs named."""
    from datetime import datetime, timezone

    import pytest_oam
    import simulator
    from simulator.hardware import load_hardware

    return RecordFile(
        pytest_oam_version=pytest_oam.__version__,
        simulator_version=simulator.SIMULATOR_VERSION,
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        nodeid=nodeid,
        test_outcome=test_outcome,
        gate_inputs=gate_inputs,
        rules=rules,
        baseline=baseline,
        runs=[RecordedRun(config=c, profile=p) for c, p in runs],
        # an imported real profile (oam_profile.load, real:* hardware) has no spec to keep
        hardware={p.hardware: load_hardware(p.hardware) for _, p in runs if not p.hardware.startswith("real:")},
        gate=gate,
        failure_text=failure_text,
    )


@dataclass
class Replay:
    """What :func:`replay` found: the replayed gate result, and how it differs from the recorded one."""

    report: GateReport
    failure_text: str | None
    differences: list[str] = field(default_factory=list)
    not_replayed_rules: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.differences


def _compare_reports(recorded: GateReport, replayed: GateReport, skipped_rules: set[str]) -> list[str]:
    """How the replayed result differs from the recorded one (findings of rules that were not
    replayed are left out of the comparison)."""
    differences = []
    for name in ("status", "failed", "message", "runs", "verdicts", "findings", "diagnosis"):
        old, new = getattr(recorded, name), getattr(replayed, name)
        if name == "diagnosis":
            old = [d for d in old if d.rule_id not in skipped_rules]
        if old == new:
            continue
        if isinstance(old, list):
            differences.append(f"{name}: {len(old)} recorded, {len(new)} replayed"
                               + (" (values differ)" if len(old) == len(new) else ""))
        else:
            differences.append(f"{name}: recorded {old!r}, replayed {new!r}")
    return differences


def replay(record: RecordFile) -> Replay:
    """Run the gate of ``record`` again, offline, and compare with the recorded result.

    Rules that a plugin registered when the record was made (not built in) are not run; they
    are listed in ``not_replayed_rules`` and their recorded findings are not compared.

    Raises:
        RecordError: the record's gate settings cannot be read.
    """
    import dataclasses

    from pydantic import TypeAdapter

    from ..judge.rules import RULES
    from .evaluate import GateInputs, evaluate_gate

    unknown = sorted(set(record.gate_inputs) - {f.name for f in dataclasses.fields(GateInputs)})
    if unknown:
        raise RecordError(f"record of {record.nodeid}: gate_inputs: unknown setting {', '.join(map(repr, unknown))}")
    try:
        inputs = TypeAdapter(GateInputs).validate_python(
            dict(record.gate_inputs), strict=False)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"])
        raise RecordError(f"record of {record.nodeid}: gate_inputs.{where}: {err['msg']}") from None
    for limits in (inputs.marker_thresholds, inputs.cli_thresholds, inputs.ini_thresholds):
        bad = {op: v for op, v in limits.items() if not 0 <= v < 1e9}
        if bad:
            raise RecordError(f"record of {record.nodeid}: gate_inputs: limits must be fractions >= 0, got {bad}")
    missing = sorted({run.profile.hardware for run in record.runs if not run.profile.hardware.startswith("real:")}
                     - set(record.hardware))
    if missing:
        raise RecordError(f"record of {record.nodeid}: its runs name hardware {', '.join(map(repr, missing))} but "
                          f"it holds specs only for {', '.join(map(repr, sorted(record.hardware))) or 'none'}")
    rules = {rule_id: RULES[rule_id] for rule_id in record.rules if rule_id in RULES}
    missing = [rule_id for rule_id in record.rules if rule_id not in RULES]
    result, text = evaluate_gate(
        inputs, [r.profile for r in record.runs], record.baseline, rules=rules,
        test_passed=record.test_outcome == "passed", hardware=record.hardware.__getitem__,
    )
    return Replay(result.report, text, _compare_reports(record.gate, result.report, set(missing)), missing)


@dataclass
class WhatIf:
    """The recorded runs re-simulated on other hardware: per run, (recorded, re-simulated)."""

    hardware: str
    runs: list[tuple[Profile, Profile]]


def what_if(record: RecordFile, hardware: str) -> WhatIf:
    """Re-simulate each recorded run's op sequence on ``hardware`` with this simulator.

    Raises:
        ValueError: unknown hardware, or a run that cannot be re-simulated (see
            :func:`simulator.runtime.recost`).
    """
    from simulator.runtime import recost

    runs = []
    for i, run in enumerate(record.runs):
        try:
            runs.append((run.profile, recost(run.profile, hardware, run.config.op_time_scale)))
        except ValueError as exc:
            raise ValueError(f"run {i + 1} ({run.config.workload}): {exc}") from None
    return WhatIf(hardware, runs)


def what_if_table(result: WhatIf, fmt: str = "simple") -> str:
    """Per run (numbered from 1, as in the gate's report): step time and each op type's time per
    step on both hardware, and the ratio."""
    from tabulate import tabulate

    from ..format import fmt_time, table_cell

    rows = []
    for i, (old, new) in enumerate(result.runs, start=1):
        rows.append([i, "step", fmt_time(old.step_time_s), fmt_time(new.step_time_s),
                     f"{new.step_time_s / old.step_time_s:.2f}x" if old.step_time_s else "-"])
        for op_type in sorted(old.op_types, key=lambda t: -old.op_time_s(t)):
            a, b = old.op_time_s(op_type), new.op_time_s(op_type)
            rows.append([i, table_cell(op_type, fmt), fmt_time(a), fmt_time(b), f"{b / a:.2f}x" if a else "-"])
    old_hw = table_cell(", ".join(sorted({old.hardware for old, _ in result.runs})), fmt)
    return tabulate(rows, headers=["run", "op type", f"{old_hw} (recorded)",
                                   f"{table_cell(result.hardware, fmt)} (what-if)", "ratio"],
                    tablefmt=fmt, disable_numparse=True)

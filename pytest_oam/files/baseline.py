"""Baseline files: one JSON file per test, read and written through versioned pydantic models.

A file holds one :class:`RunBaseline` per ``oam_profile.run`` call of the test, in order.
Writes are atomic (temporary file in the same folder, then ``os.replace``) with sorted keys,
so a baseline diff in a pull request is readable and a killed run leaves the old file intact.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    StringConstraints,
    ValidationError,
    model_validator,
)

from simulator.profile import LiveMemory

from .fileio import InputFileError, JsonFileError, atomic_write_text, file_state, read_json_object

SCHEMA_VERSION = 1
#: How many of the groups that held memory at the allocated peak a baseline keeps (the largest).
PEAK_LIVE_GROUPS = 200
_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
OpType = Annotated[str, StringConstraints(min_length=1)]

# Plausibility bounds: a value past one of them is a damaged or hand-edited file, never a
# measurement (a baseline with ``time_s: 1e308`` passed every comparison). They are checked by
# validators, not ``le=``, so that the committed JSON Schemas stay as they are.
#: Time per step: 1e6 s is 11.6 days; no simulated or profiled step comes near it.
MAX_STEP_TIME_S = 1e6
#: Bytes per step (HBM traffic) or held (memory peaks): 2**60 (1 EiB) is what one NPU's HBM
#: moves in about 11 days at full bandwidth, and a million times its capacity.
MAX_BYTES = 2**60
#: Counts per step (calls, DMA transfers, allocations, tokens) and steps per run: 1e12 is a
#: million a second for MAX_STEP_TIME_S; real and simulated runs count millions per step at most.
MAX_COUNT = 1e12
#: FLOP per step: 1e18 FLOP/s (an exascale machine) for MAX_STEP_TIME_S.
MAX_FLOP = 1e24
#: Cards in a run: more NPUs than any cluster holds.
MAX_DEVICES = 2**20
# Pipe ratios (mac_ratio ...) have no bound: a run with op_time_scale < 1 makes them exceed 1
# (the op's time shrinks, its pipes' busy time does not), and any bound would be arbitrary.


def _at_most(limit: float, unit: str):
    def check(value):
        if value is not None and value > limit:
            raise ValueError(f"{value:g}{unit} is implausible (more than {limit:g}{unit}); the file is damaged "
                             "or was edited by hand")
        return value

    return AfterValidator(check)


Seconds = Annotated[PositiveFloat, _at_most(MAX_STEP_TIME_S, " s")]
SecondsOrZero = Annotated[NonNegativeFloat, _at_most(MAX_STEP_TIME_S, " s")]
Count = Annotated[PositiveFloat, _at_most(MAX_COUNT, "")]
CountOrZero = Annotated[NonNegativeFloat, _at_most(MAX_COUNT, "")]
Bytes = Annotated[NonNegativeFloat, _at_most(MAX_BYTES, " bytes")]
Flop = Annotated[NonNegativeFloat, _at_most(MAX_FLOP, " FLOP")]


class OpStats(BaseModel):
    """One op type within one step: total time and counters (median / mean over steps)."""

    model_config = _CONFIG
    time_s: Seconds = Field(description="Time of this op type per step: median over the steps it ran in")
    mean_time_s: Seconds = Field(description="Time of this op type per step: mean over all steps")
    p99_time_s: Seconds | None = Field(
        default=None, description="99th percentile over the steps it ran in (runs of at least 50 steps)"
    )
    max_time_s: Seconds | None = Field(default=None, description="Slowest step's time of this op type")
    count_per_step: Count
    flop: Flop
    hbm_bytes: Bytes
    dma_count: CountOrZero
    mac_ratio: NonNegativeFloat = Field(description="Time-weighted mean over the op's records")
    vec_ratio: NonNegativeFloat
    mte2_ratio: NonNegativeFloat
    alloc_stall_s: SecondsOrZero = Field(
        default=0.0, description="Time its calls waited for the caching allocator per step (runs with memory=True)")
    alloc_count: CountOrZero = Field(
        default=0.0, description="Allocations that stalled its calls (device mallocs, retries) per step, runs with "
        "memory=True")
    overlap_frac: float | None = Field(
        default=None, ge=0, le=1, description="DMA/compute overlap of its compute-stream calls, time-weighted mean")


class PeakHolder(LiveMemory):
    """One group of the allocations live at the allocated peak, as a baseline keeps it: the call
    site's files relative to the pytest rootdir, or without folders outside it."""

    model_config = _CONFIG

    @model_validator(mode="after")
    def _plausible(self) -> PeakHolder:
        for name, limit, unit in (("size_bytes", MAX_BYTES, " bytes"), ("count", MAX_COUNT, "")):
            value = getattr(self, name)
            if value > limit:
                raise ValueError(f"{name}: {value:g}{unit} is implausible (more than {limit:g}{unit}); the file "
                                 "is damaged or was edited by hand")
        return self


class RunBaseline(BaseModel):
    """What one profiled run is compared on. Identity: hardware, devices, simulator version,
    workload fingerprint."""

    model_config = _CONFIG
    hardware: str
    devices: Annotated[int, _at_most(MAX_DEVICES, "")] = Field(ge=1)
    simulator_version: str
    workload_fingerprint: str
    steps: Annotated[int, _at_most(MAX_COUNT, "")] = Field(ge=1)
    step_time_s: Seconds = Field(description="Median step time")
    step_time_mean_s: Seconds = Field(description="Mean step time")
    step_time_p99_s: Seconds | None = Field(
        default=None, description="99th percentile step time (runs of at least 50 steps)"
    )
    step_time_max_s: Seconds | None = Field(default=None, description="Slowest step")
    tokens_per_step: Annotated[int, Field(ge=1), _at_most(MAX_COUNT, "")] | None = None
    collection_mode: Literal["offline", "online"] = Field(
        default="offline", description="How the run was collected; online runs carry a per-op overhead")
    memory_reserved_peak_bytes: Annotated[int, Field(ge=0), _at_most(MAX_BYTES, " bytes")] | None = Field(
        default=None, description="Runs with memory=True")
    memory_allocated_peak_bytes: Annotated[int, Field(ge=0), _at_most(MAX_BYTES, " bytes")] | None = None
    alloc_time_s: SecondsOrZero | None = Field(default=None, description="Allocator time per step, median")
    alloc_retries_per_step: CountOrZero | None = Field(
        default=None, description="Allocations that flushed the cache (synchronise, free every unsplit cached "
        "segment) and retried, per step: mean over the steps (torch num_alloc_retries)")
    memory_peak_live: list[PeakHolder] | None = Field(
        default=None, description="What held the memory at the allocated peak (memory=True runs): the "
        f"{PEAK_LIVE_GROUPS} largest groups by op type, kind and call site, largest first")
    step_trace_s: dict[OpType, SecondsOrZero] | None = Field(
        default=None, description="Imported real runs with step_trace_time.csv: each part of the step (computing, "
        "communication_exposed, free, bubble), median over the steps, seconds")
    ops: dict[OpType, OpStats] = Field(min_length=1)


class CollectionSettings(BaseModel):
    """How a Python API / ``oam`` baseline was collected, so that it can be collected again."""

    model_config = _CONFIG
    hardware: str = Field(description="As given, e.g. 'Ascend 910 x 8'")
    steps: int = Field(ge=1)
    seed: int | None = Field(default=None, ge=0, description="Seed of the dataset draws")
    max_seq_len: int | None = Field(default=None, ge=1)
    seq_len: int | None = Field(default=None, ge=1, description="Fixed length of every step (no dataset)")
    params: dict[OpType, bool | int | float | str] = Field(default_factory=dict)


class BaselineFile(BaseModel):
    """Schema version 1 of a baseline file."""

    model_config = _CONFIG
    schema_version: Literal[1] = SCHEMA_VERSION
    nodeid: str = Field(description="The pytest test id, or 'api:<model>' for baselines made by the Python API")
    runs: list[RunBaseline] = Field(min_length=1)
    model: str | None = Field(default=None, description="Model zoo name (Python API baselines)")
    dataset: str | None = Field(default=None, description="Sequence-length distribution (Python API baselines)")
    tag: str | None = Field(default=None, description="Free-form label, e.g. the version measured")
    collection: CollectionSettings | None = Field(default=None, description="Python API / oam baselines")


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the fault."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_STEM = 150


def baseline_filename(nodeid: str) -> str:
    """A portable, unique file name for a test id.

    Unsafe characters become ``_``, the readable part is cut to 150 characters, and a hash
    of the full id is appended, so ids that differ only in replaced characters or in case
    still get distinct files (and names stay under 255 bytes).
    """
    stem = _UNSAFE.sub("_", nodeid).strip("._") or "test"
    digest = hashlib.sha256(nodeid.encode("utf-8")).hexdigest()[:12]
    return f"{stem[:_MAX_STEM]}-{digest}.json"


def _non_finite_paths(value: object, path: str = "") -> list[str]:
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{path or '<root>'} is {value}"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _non_finite_paths(v, f"{path}[{i}]")]
    return []


def _format_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def baseline_state(path: Path) -> Literal["missing", "present"]:
    """Whether a baseline file is at ``path`` ("present": a regular file, or a symbolic link to
    one) or nothing is ("missing": the test has no baseline yet). Nothing is opened or read, so
    this never blocks; :func:`load_baseline` then reads a "present" one.

    Raises:
        BaselineError: something that is not a baseline file is there: a symbolic link to a
            missing file, a folder, a named pipe (FIFO), a socket or a device; or the baseline
            folder cannot be searched (permission denied). The message names the path.
    """
    try:
        return file_state(Path(path))
    except InputFileError as exc:
        raise BaselineError(path, exc.problem) from None


def load_baseline(path: Path, nodeid: str | None = None) -> BaselineFile:
    """Read and validate ``path``.

    Raises:
        BaselineError: missing (a symbolic link to a missing file included), not a regular file
            (a named pipe is never opened), unreadable, truncated, not JSON, a key given twice,
            another schema version, NaN or Infinity values, implausible values (past
            :data:`MAX_STEP_TIME_S` and the other bounds), fields that fail validation, or a
            file made for another test.
    """
    try:
        data = read_json_object(path, "a valid baseline")
        bad = _non_finite_paths(data)
    except JsonFileError as exc:
        raise BaselineError(path, exc.problem) from None
    except RecursionError:
        raise BaselineError(path, "is not a valid baseline: its JSON nests too deeply") from None
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BaselineError(
            path, f"has schema_version {version!r}; this pytest-oam reads version {SCHEMA_VERSION}"
        )
    if bad:
        raise BaselineError(path, "holds non-finite values: " + "; ".join(bad))
    try:
        baseline = BaselineFile.model_validate(data)
    except RecursionError:
        raise BaselineError(path, "is not a valid baseline: its JSON nests too deeply") from None
    except ValidationError as exc:
        raise BaselineError(path, f"is not a valid baseline: {_format_validation(exc)}") from None
    if nodeid is not None and baseline.nodeid != nodeid:
        raise BaselineError(path, f"belongs to test {baseline.nodeid!r}, not {nodeid!r}")
    return baseline


def dump_baseline(baseline: BaselineFile) -> str:
    """Canonical text of a baseline: sorted keys, 2-space indent, trailing newline.

    A run without a step split (``step_trace_s``: every simulated run) is written without the
    key, as before real step splits were kept, so such baselines stay byte for byte the same.

    Raises:
        ValueError: a value is NaN or infinite (refused, never written).
    """
    data = baseline.model_dump(mode="json")
    for run in data["runs"]:
        if run.get("step_trace_s") is None:
            run.pop("step_trace_s", None)
    return json.dumps(data, sort_keys=True, indent=2, allow_nan=False) + "\n"


def save_baseline(path: Path, baseline: BaselineFile) -> None:
    """Write ``baseline`` to ``path`` atomically, creating the folder if needed."""
    atomic_write_text(path, dump_baseline(baseline))

"""The tuned-results knowledge base: the best known configuration of an operator per shapes,
dtype, hardware and simulator version, as Ascend's AOE keeps tuned tilings in a knowledge base.

    result = auto_tune(target=OptimizationTarget(operator="FlashAttention", metric="latency_s"), ...
    result.save_to("tuned/knowledge_base.json")                 # or: oam tune job.toml --save PATH
    kb = KnowledgeBase.load("tuned/knowledge_base.json")
    config = kb.lookup("FlashAttention", shapes=[[1, 32, 4096, 128]] * 3, dtype="fp16", hardware="ascend910")

The file is one JSON document (``schema_version`` 1, sorted keys, records in key order, written
atomically) that lives in the repository beside the baselines, so a re-tune shows in review.
A record is never replaced unless the caller asks (``replace=True``, ``oam tune --replace``).
Records of another hardware or simulator version are not used by :meth:`KnowledgeBase.lookup`;
:meth:`KnowledgeBase.stale` finds them so that messages can say a record is stale.

Latencies are of one call of the operator with these shapes, in seconds (``latency_s``); the
tuning metrics of the record are per step of the tuning workload, as ``auto_tune`` measured them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, StringConstraints, ValidationError

from ..files.fileio import InputFileError, atomic_write_text, file_state, read_json_object

if TYPE_CHECKING:
    from simulator.profile import Profile

    from .calls import OpCall

SCHEMA_VERSION = 1
#: Where the plugin looks when the ``oam_knowledge_base`` ini key is not set (relative to the ini file).
DEFAULT_PATH = "tuned/knowledge_base.json"
_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
Name = Annotated[str, StringConstraints(min_length=1)]
Shape = Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]
ConfigValue = bool | int | float | str | None


class KnowledgeBaseError(ValueError):
    """A knowledge base file that cannot be used, or a record that may not be written; the
    message names the file."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class ConfigMetrics(BaseModel):
    """What one configuration measured: one call's latency and the tuning metrics."""

    model_config = _CONFIG
    latency_s: PositiveFloat = Field(description="Mean time of one call of the operator with these shapes")
    metrics: dict[Name, float] = Field(
        description="The tuning metrics (auto_tune's names and units: latency_s, throughput_tokens_per_s, "
                    "flop_per_s, peak_memory_bytes, and the deprecated latency_ms, latency_s in milliseconds, "
                    "kept for targets that still name it), per step of the tuning workload")


class TunedRecord(BaseModel):
    """The tuned configuration of one operator at one (shapes, dtype, hardware, simulator version)."""

    model_config = _CONFIG
    operator: Name = Field(description="Op type, e.g. FlashAttention")
    shapes: list[Shape] = Field(min_length=1, description="Input shapes of the operator, one list per input")
    dtype: Name
    attrs: dict[Name, ConfigValue] = Field(
        default_factory=dict, description="Op attributes the tuning did not change (e.g. causal): a call "
        "matches the record only when it has these values")
    hardware: Name = Field(description="Simulated hardware name, e.g. ascend910")
    simulator_version: Name
    metric: Name = Field(description="The metric tuned for")
    constraint: str | None = None
    config: dict[Name, ConfigValue] = Field(description="The tuned parameters of the workload")
    default: ConfigMetrics = Field(description="The workload's default configuration")
    tuned: ConfigMetrics = Field(description="The tuned configuration")
    search: Literal["exhaustive", "tpe", "random"]
    unique_evaluations: int = Field(ge=1)
    seed: int = Field(ge=0)
    workload: str | None = Field(default=None, description="module:function of the tuning workload, if known")

    @property
    def key(self) -> tuple:
        return (self.operator, _shape_key(self.shapes), self.dtype, tuple(sorted(self.attrs.items())),
                self.hardware, self.simulator_version)

    def matches(self, attrs: Mapping[str, Any]) -> bool:
        """Does a call with ``attrs`` have this record's fixed attributes?"""
        return all(k in attrs and attrs[k] == v for k, v in self.attrs.items())

    def describe(self) -> str:
        """``FlashAttention [1, 32, 4096, 128] x3 fp16 causal=True on ascend910 (simulator 0.3.0)``."""
        fixed = "".join(f" {k}={v}" for k, v in sorted(self.attrs.items()))
        return f"{self.operator} {format_shapes(self.shapes)} {self.dtype}{fixed} on {self.hardware} " \
               f"(simulator {self.simulator_version})"


class KnowledgeBaseFile(BaseModel):
    """Schema version 1 of the tuned-results knowledge base."""

    model_config = _CONFIG
    schema_version: Literal[1] = SCHEMA_VERSION
    records: list[TunedRecord] = Field(default_factory=list)


def _shape_key(shapes: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in shape) for shape in shapes)


def format_shapes(shapes: Sequence[Sequence[int]]) -> str:
    """Shapes for a message: equal consecutive shapes once with a count (``[1, 32, 4096, 128] x3``)."""
    parts: list[str] = []
    groups: list[tuple[list[int], int]] = []
    for shape in shapes:
        shape = [int(d) for d in shape]
        if groups and groups[-1][0] == shape:
            groups[-1] = (shape, groups[-1][1] + 1)
        else:
            groups.append((shape, 1))
    for shape, count in groups:
        parts.append(f"{shape}" + (f" x{count}" if count > 1 else ""))
    return ", ".join(parts)


def _check_shapes(shapes: object) -> list[list[int]]:
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Sequence) or not shapes:
        raise ValueError(f"shapes must be a list of input shapes such as [[1, 32, 4096, 128]], got {shapes!r}")
    out = []
    for shape in shapes:
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not shape or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
            raise ValueError(f"shapes: {shape!r} is not a list of positive integers (one list per input)")
        out.append([int(d) for d in shape])
    return out


class KnowledgeBase:
    """The records of one knowledge base file (``path``); changes are written by :meth:`save`."""

    def __init__(self, path: Path | str, records: Sequence[TunedRecord] = ()) -> None:
        self.path = Path(path)
        self._records: dict[tuple, TunedRecord] = {r.key: r for r in records}

    @classmethod
    def load(cls, path: Path | str, *, missing_ok: bool = True) -> KnowledgeBase:
        """Read ``path``; a file that does not exist is an empty knowledge base (``missing_ok``).

        Raises:
            KnowledgeBaseError: unreadable, empty, truncated, not JSON, another schema version, a record
                that fails validation, or two records with the same key (naming the file).
        """
        path = Path(path)
        try:
            # a symbolic link to a missing file is an error, not an empty knowledge base (saving
            # would replace the link); a named pipe is never opened
            if file_state(path) == "missing" and missing_ok:
                return cls(path)
            data = read_json_object(path, "a knowledge base")
        except InputFileError as exc:  # JsonFileError included
            raise KnowledgeBaseError(path, exc.problem) from None
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise KnowledgeBaseError(path, f"has schema_version {version!r}; this pytest-oam reads knowledge "
                                           f"base version {SCHEMA_VERSION}")
        try:
            file = KnowledgeBaseFile.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()[:4])
            raise KnowledgeBaseError(path, f"is not a valid knowledge base: {problems}") from None
        seen: set[tuple] = set()
        for record in file.records:
            if record.key in seen:
                raise KnowledgeBaseError(path, f"has two records for {record.describe()}")
            seen.add(record.key)
        return cls(path, file.records)

    @property
    def records(self) -> list[TunedRecord]:
        """Every record, in key order."""
        return [self._records[k] for k in sorted(self._records, key=repr)]

    def add(self, record: TunedRecord, *, replace: bool = False) -> None:
        """Add ``record``; an existing record with the same key is replaced only with ``replace``.

        Raises:
            KnowledgeBaseError: a record for the same key exists and ``replace`` is false.
        """
        old = self._records.get(record.key)
        if old is not None and not replace:
            raise KnowledgeBaseError(self.path, f"already has a record for {record.describe()} "
                                                f"(config {old.config}); pass replace=True (oam tune --replace) "
                                                "to replace it")
        self._records[record.key] = record

    def record(self, operator: str, *, shapes: Sequence[Sequence[int]], dtype: str = "fp16",
               hardware: str = "ascend910", simulator_version: str | None = None,
               attrs: Mapping[str, Any] | None = None) -> TunedRecord | None:
        """The record of ``operator`` at exactly these shapes, dtype, hardware and simulator
        version (default: the installed simulator's) whose fixed attributes the call's ``attrs``
        have (``{"causal": True}``), or ``None``. Without ``attrs`` any record of these shapes
        matches, if there is only one.

        Raises:
            ValueError: ``shapes`` is not a list of shapes, or several records match (the most
                specific one wins; two equally specific ones are ambiguous).
        """
        if simulator_version is None:
            from simulator import SIMULATOR_VERSION as simulator_version
        shape_key = _shape_key(_check_shapes(shapes))
        found = [r for r in self._records.values()
                 if (r.operator, _shape_key(r.shapes), r.dtype, r.hardware, r.simulator_version)
                 == (operator, shape_key, dtype, hardware, simulator_version)
                 and (attrs is None or r.matches(attrs))]
        if not found:
            return None
        found.sort(key=lambda r: -len(r.attrs))
        if len(found) > 1 and (attrs is None or len(found[0].attrs) == len(found[1].attrs)):
            raise ValueError(f"{self.path}: several records match {operator} {format_shapes(shape_key)} {dtype} "
                             f"with {attrs}: " + "; ".join(r.describe() for r in found))
        return found[0]

    def lookup(self, operator: str, *, shapes: Sequence[Sequence[int]], dtype: str = "fp16",
               hardware: str = "ascend910", simulator_version: str | None = None,
               attrs: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """The tuned configuration (a new dict, to pass to the workload as keywords) of
        ``operator`` at these shapes and attributes (see :meth:`record`), or ``None`` when there
        is no current record (see :meth:`stale` for records of other hardware or simulator
        versions).

        Raises:
            ValueError: ``shapes`` is not a list of shapes, or the match is ambiguous.
        """
        record = self.record(operator, shapes=shapes, dtype=dtype, hardware=hardware,
                             simulator_version=simulator_version, attrs=attrs)
        return None if record is None else dict(record.config)

    def stale(self, operator: str, *, shapes: Sequence[Sequence[int]], dtype: str = "fp16",
              hardware: str = "ascend910", simulator_version: str | None = None) -> list[TunedRecord]:
        """Records of ``operator`` at these shapes and dtype made on other hardware or by
        another simulator version: not used, but worth naming."""
        if simulator_version is None:
            from simulator import SIMULATOR_VERSION as simulator_version
        shape_key = _shape_key(_check_shapes(shapes))
        return [r for r in self.records if r.operator == operator and _shape_key(r.shapes) == shape_key
                and r.dtype == dtype and (r.hardware, r.simulator_version) != (hardware, simulator_version)]

    def dump(self) -> str:
        """Canonical text: sorted keys, 2-space indent, records in key order, trailing newline."""
        file = KnowledgeBaseFile(records=self.records)
        return json.dumps(file.model_dump(mode="json"), sort_keys=True, indent=2, allow_nan=False) + "\n"

    def save(self) -> None:
        """Write the knowledge base to :attr:`path` atomically (folders are created).

        Raises:
            OSError: the file cannot be written.
        """
        atomic_write_text(self.path, self.dump())


class _TargetLike(Protocol):
    operator: str | None
    metric: str
    constraint: str | None


class _TrialLike(Protocol):
    params: dict[str, Any]
    metrics: dict[str, float]
    op_calls: tuple[OpCall, ...]


class TuningResult(Protocol):
    """What :func:`record_from_result` reads of a tuning result, a
    :class:`pytest_oam.tune.TuneResult` (a protocol: the knowledge base does not import the
    search, which saves into it)."""

    target: _TargetLike
    best: _TrialLike | None
    default: _TrialLike
    trials: list[_TrialLike]
    hardware: str
    sampler: str
    unique_evaluations: int
    seed: int


def record_from_result(result: TuningResult, *, shapes: Sequence[Sequence[int]] | None = None,
                       dtype: str | None = None, workload: str | None = None) -> TunedRecord:
    """The knowledge base record of a tuning result (see :meth:`pytest_oam.tune.TuneResult.save_to`).

    Raises:
        TuneError: no feasible configuration, no operator in the target, or an operator
            that ran with several shapes (or none matching ``shapes`` / ``dtype``).
    """

    from .calls import TuneError

    target = result.target
    if target.operator is None:
        raise TuneError("only an operator's tuning goes into the knowledge base: give the target an operator")
    if result.best is None:
        raise TuneError(f"no feasible configuration of {target.operator} was found; nothing to record")
    shapes = None if shapes is None else _check_shapes(shapes)

    def call(trial, which: str):
        calls = [c for c in trial.op_calls if (shapes is None or _shape_key(c.shapes) == _shape_key(shapes))
                 and (dtype is None or c.dtype == dtype)]
        if not calls:
            seen = "; ".join(f"{format_shapes(c.shapes)} {c.dtype}" for c in trial.op_calls) or "none"
            raise TuneError(f"the {which} configuration ran no {target.operator} with shapes "
                            f"{format_shapes(shapes or [])} {dtype or ''}; its calls: {seen}")
        if len(calls) > 1:
            seen = "; ".join(f"{format_shapes(c.shapes)} {c.dtype} {dict(c.attrs)}" for c in calls)
            raise TuneError(f"{target.operator} runs with {len(calls)} different shapes or attributes in the "
                            f"{which} configuration ({seen}); pass shapes= (and dtype=) to say which one to record, "
                            "and keep one set of attributes per tuning workload")
        return calls[0]

    best_call = call(result.best, "best")
    shapes_key = _shape_key(best_call.shapes)
    default_calls = [c for c in result.default.op_calls if _shape_key(c.shapes) == shapes_key
                     and c.dtype == best_call.dtype]
    if not default_calls or not result.default.metrics:
        raise TuneError(f"the default configuration ran no {target.operator} with shapes "
                        f"{format_shapes(best_call.shapes)} {best_call.dtype}: before and after differ in shape")
    try:
        return _record(result, best_call, default_calls[0], workload)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise TuneError(f"the tuned configuration of {target.operator} cannot be recorded "
                        f"(configuration values must be booleans, numbers, text or None): {problems}") from None


def _record(result: TuningResult, best_call, default_call, workload: str | None) -> TunedRecord:
    import simulator

    target = result.target
    # What no evaluated configuration changed, and is not a tuned parameter, is a property of
    # the call (causal), not a knob. Best and default alone were not enough: a parameter whose
    # name is not the op attribute's (enable_fusion -> fusion) with the same value in both was
    # kept as fixed, and the tuned check then skipped a test that ran the other value, however
    # slow (newcomer finding).
    seen: dict[str, set] = {}
    for trial in (result.default, *result.trials):
        for c in trial.op_calls:
            if _shape_key(c.shapes) == _shape_key(best_call.shapes) and c.dtype == best_call.dtype:
                for k, v in c.attrs:
                    seen.setdefault(k, set()).add(repr(v))
    return TunedRecord(
        operator=target.operator, shapes=[list(s) for s in best_call.shapes], dtype=best_call.dtype,
        attrs={k: v for k, v in best_call.attrs
               if k not in result.best.params and dict(default_call.attrs).get(k, object()) == v
               and seen.get(k, set()) == {repr(v)}},
        hardware=result.hardware, simulator_version=simulator.SIMULATOR_VERSION, metric=target.metric,
        constraint=target.constraint, config=dict(sorted(result.best.params.items())),
        default=ConfigMetrics(latency_s=default_call.latency_s, metrics=dict(result.default.metrics)),
        tuned=ConfigMetrics(latency_s=best_call.latency_s, metrics=dict(result.best.metrics)),
        search=result.sampler, unique_evaluations=result.unique_evaluations, seed=result.seed, workload=workload,
    )


# -- the gate: is a measured call near the tuned optimum? ---------------------------------------


class TunedGateFailure(AssertionError):
    """An operator runs more than the limit slower than its tuned optimum, or has no current
    record; the message names the op, shapes, hardware, both latencies, the limit and the
    tuned configuration."""


@dataclass(frozen=True)
class TunedCheck:
    """One distinct call of an operator (per input shapes, dtype and attributes) judged against
    its knowledge base record. ``status``: ``"ok"`` (within the limit), ``"slower"`` (more than
    ``limit_frac`` slower than the tuned latency) or ``"no-record"`` (no current record);
    ``message`` says which, naming the op, shapes, hardware, both latencies (microseconds), the
    limit and the tuned configuration. ``latency_s`` is the mean time of one call, in seconds."""

    operator: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    latency_s: float
    limit_frac: float
    status: Literal["ok", "slower", "no-record"]
    message: str
    record: TunedRecord | None = None


def check_near_tuned(profile: Profile, operator: str, knowledge_base: KnowledgeBase, *, limit_frac: float,
                     config_text: str | None = None) -> list[TunedCheck]:
    """Judge every distinct call of ``operator`` in ``profile`` against the tuned optimum its
    knowledge base record holds (a call may take ``tuned latency x (1 + limit_frac)``).
    ``config_text`` (the configuration the profile ran, for the message) is optional. A profile
    without ``operator`` gives an empty list.

    Raises:
        ValueError: ``limit_frac`` is negative or not finite, or a record match is ambiguous.
    """
    import math

    from ..format import fmt_percent, fmt_us
    from .calls import calls_of

    if isinstance(limit_frac, bool) or not isinstance(limit_frac, (int, float)) or not math.isfinite(limit_frac) \
            or limit_frac < 0:
        raise ValueError(f"limit_frac must be a finite fraction >= 0, got {limit_frac!r}")
    records = profile.ops_of(operator)
    if not records:
        return []
    steps = max(1, profile.op_steps(operator))
    out = []
    where = f"on {profile.hardware} (simulator {profile.simulator_version})"
    kb = knowledge_base
    # the kernel's own time: a run that models memory waits for the allocator in its first step,
    # which the tuned latency (a run without memory) never did
    for call in calls_of(records, steps, kernel_only=True):
        what = f"{operator} {format_shapes(call.shapes)} {call.dtype} {where}"
        record = kb.record(operator, shapes=call.shapes, dtype=call.dtype, hardware=profile.hardware,
                           simulator_version=profile.simulator_version, attrs=dict(call.attrs))
        common = {"operator": operator, "shapes": call.shapes, "dtype": call.dtype, "latency_s": call.latency_s,
                  "limit_frac": limit_frac}
        if record is None:
            stale = [r for r in kb.stale(operator, shapes=call.shapes, dtype=call.dtype, hardware=profile.hardware,
                                         simulator_version=profile.simulator_version) if r.matches(dict(call.attrs))]
            others = [r for r in kb.records if r.operator == operator and _shape_key(r.shapes) == _shape_key(call.shapes)
                      and r.dtype == call.dtype and (r.hardware, r.simulator_version)
                      == (profile.hardware, profile.simulator_version) and not r.matches(dict(call.attrs))]
            line = f"no tuned record for {what} with {dict(call.attrs)} in {kb.path}"
            if others:
                line += "; records for other attributes, not used: " + "; ".join(r.describe() for r in others)
            if stale:
                line += "; stale records, not used: " + "; ".join(
                    f"{r.hardware}, simulator {r.simulator_version}: config {r.config}, "
                    f"{fmt_us(r.tuned.latency_s, grouping=True)}" for r in stale)
            out.append(TunedCheck(**common, status="no-record",
                                  message=line + "; tune it with 'oam tune JOB --save " + str(kb.path) + "'"))
            continue
        allowed_s = record.tuned.latency_s * (1 + limit_frac)
        slower = call.latency_s / record.tuned.latency_s - 1
        measured = (f"{what} takes {fmt_us(call.latency_s, grouping=True)} per call"
                    + (f" with {config_text}" if config_text else ""))
        if call.latency_s > allowed_s:
            out.append(TunedCheck(**common, status="slower", record=record, message=(
                f"{measured}, {fmt_percent(slower, 1)} slower than the tuned "
                f"{fmt_us(record.tuned.latency_s, grouping=True)} (limit {fmt_percent(limit_frac, None)}); "
                f"use the tuned configuration {record.config}")))
        else:
            out.append(TunedCheck(**common, status="ok", record=record, message=(
                f"{measured}, within {fmt_percent(limit_frac, None)} of the tuned "
                f"{fmt_us(record.tuned.latency_s, grouping=True)} ({fmt_percent(slower, 1, signed=True)})")))
    return out


def assert_near_tuned(profile: Profile, operator: str, knowledge_base: KnowledgeBase | Path | str, *,
                      limit: str | float = "5%", config: Mapping[str, Any] | None = None) -> list[TunedRecord]:
    """Every distinct call of ``operator`` in ``profile`` (per input shapes and dtype) takes at
    most ``limit`` more time than the tuned optimum its knowledge base record holds.
    ``operator`` is an op type or an ``fnmatch`` glob (``FlashAttention*``: forward and
    backward), as in the ``tuned=`` marker.

    ``config`` (the test's configuration, for the message) is optional. Returns the records used.

    Raises:
        TunedGateFailure: a call slower than ``tuned latency x (1 + limit)``, or shapes with no
            record for this hardware and simulator version (stale records are named).
        KnowledgeBaseError: the knowledge base file is corrupt or of another version.
        ValueError: ``profile`` has no ``operator`` call, or ``limit`` does not parse.
    """
    __tracebackhide__ = True
    from ..judge.thresholds import parse_limit

    limit_frac = parse_limit(limit)
    kb = knowledge_base if isinstance(knowledge_base, KnowledgeBase) else KnowledgeBase.load(knowledge_base)
    from fnmatch import fnmatchcase

    op_types = [t for t in profile.op_types if fnmatchcase(t, operator)]
    if not op_types:
        raise ValueError(f"the profile has no {operator!r} call; its op types: {', '.join(profile.op_types) or 'none'}")
    checks = [check for op_type in op_types
              for check in check_near_tuned(profile, op_type, kb, limit_frac=limit_frac,
                                            config_text=str(dict(config)) if config else None)]
    problems = [c.message for c in checks if c.status != "ok"]
    if problems:
        raise TunedGateFailure("\n".join(problems))
    return [c.record for c in checks]

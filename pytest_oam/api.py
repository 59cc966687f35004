"""The Python API outside pytest: build a baseline, collect a profile, compare, act.

    import pytest_oam as oam
    baseline = oam.ProfileBaseline.create(model="llama-7b", dataset="wikitext-103",
                                          hardware="Ascend 910 x 8", tag="v1.0")
    baseline.collect()
    baseline.save("baselines/llama-7b-v1.0.json")
    current = oam.collect_profile(model="llama-7b", dataset="wikitext-103")
    report = oam.compare_profiles(baseline, current, regression_threshold=0.05)

A run is judged by the plugin's own gate (:func:`pytest_oam.gate.evaluate.judge_run`, which
the plugin calls for each run of a test: the comparison, then the diagnosis of each
regression); baseline files are the plugin's format, loadable by either. Times are in seconds.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from pydantic import ValidationError

from simulator.profile import Profile
from simulator.units import MS_PER_S

from .files.baseline import (
    BaselineFile,
    CollectionSettings,
    RunBaseline,
    load_baseline,
    save_baseline,
)
from .files.fileio import atomic_write_bytes, atomic_write_text
from .format import fmt_percent, fmt_us
from .judge.compare import (  # REAL_MIN_DELTA_S: defined with the comparison (the gate applies it too)
    REAL_MIN_DELTA_S,  # noqa: F401 - importable here, where compare_profiles documents it
    SIGNIFICANCE_ALPHA,
    RunComparison,
    Verdict,
    check_alpha,
    summarize,
)
from .judge.explain import Finding
from .judge.thresholds import DEFAULT_THRESHOLDS, LimitResolver, parse_limit

#: Steps a profile collects by default (each draws its sequence length from the dataset).
DEFAULT_STEPS = 4
DEFAULT_HARDWARE = "Ascend 910 x 8"
#: Sequence length of every step when no dataset is given.
DEFAULT_SEQ_LEN = 2048


def _model_zoo() -> dict[str, tuple[Callable, object]]:
    from simulator.models import LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, training_step

    return {
        "llama-7b": (training_step, LLAMA2_7B),
        "llama-13b": (training_step, LLAMA2_13B),
        "llama-70b": (training_step, LLAMA2_70B),
    }


def known_models() -> list[str]:
    return sorted(_model_zoo())


#: Parameters of the zoo's training steps: type and meaning. ``seq_len`` comes from the
#: dataset (or ``seq_len`` with no dataset); the layout from ``tensor_parallel``.
MODEL_PARAMETERS: dict[str, tuple[type, str]] = {
    "batch_size": (int, "micro-batch per data-parallel replica (default 1)"),
    "tensor_parallel": (int, ("Megatron tensor-parallel size; data parallelism takes the other cards "
                             "(default: one HCCS group, as far as the heads allow)")),
    "dtype": (str, "compute dtype: fp16, or bf16 on the 910B (default fp16)"),
    "block_size": (int, "FlashAttention block, a multiple of 16 (default 128)"),
    "pipeline_stages": (int, ("FlashAttention buffers in flight, i.e. DMA/compute overlap inside the "
                             "kernel; not pipeline parallelism (default 2)")),
    "fusion": (bool, "fused FlashAttention kernel (default true)"),
}


def model_parameters(model: str) -> list[str]:
    """The keyword parameters a zoo model takes (see :data:`MODEL_PARAMETERS`)."""
    _model_zoo()[model]  # KeyError for an unknown model
    return sorted(MODEL_PARAMETERS)


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_params(model: str, params: dict[str, object], hardware: str, devices: int) -> dict[str, object]:
    """Type-check ``params`` against :data:`MODEL_PARAMETERS` and turn ``tensor_parallel`` into
    the step's layout.

    Raises:
        ValueError: an unknown parameter, a value of the wrong type, an unknown dtype for the
            hardware, or a tensor-parallel size that does not divide the cards.
    """
    from simulator.hardware import load_hardware
    from simulator.models import ParallelLayout

    unknown = sorted(set(params) - set(MODEL_PARAMETERS))
    if unknown:
        hint = ""
        if "seq_len" in unknown:
            hint = " (seq_len comes from the dataset; give seq_len with dataset=None)"
        raise ValueError(f"unknown parameter {', '.join(map(repr, unknown))} for model {model!r}{hint}; "
                         f"known: {', '.join(sorted(MODEL_PARAMETERS))}")
    kwargs: dict[str, object] = {}
    for name, value in params.items():
        kind, _ = MODEL_PARAMETERS[name]
        if kind is bool and not isinstance(value, bool):
            raise ValueError(f"parameter {name} must be true or false, got {value!r}")
        if kind is int:
            _check_int(f"parameter {name}", value, 1)
        if kind is str and not isinstance(value, str):
            raise ValueError(f"parameter {name} must be a string, got {value!r}")
        kwargs[name] = value
    if "dtype" in kwargs:
        from simulator.models.llama import TRAINING_DTYPES

        rates = load_hardware(hardware).cube_unit.macs_per_cycle_per_core
        usable = [d for d in TRAINING_DTYPES if d in rates]  # one message that never sends you astray
        if kwargs["dtype"] not in usable:
            why = "is not a training dtype" if kwargs["dtype"] not in TRAINING_DTYPES else "has no Cube rate"
            raise ValueError(f"parameter dtype {kwargs['dtype']!r} {why} on {hardware}; use {' or '.join(usable)}")
    tp = kwargs.pop("tensor_parallel", None)
    if tp is not None:
        if devices % tp:
            raise ValueError(f"parameter tensor_parallel={tp} does not divide the {devices} cards")
        kwargs["layout"] = ParallelLayout(tensor_parallel=tp, data_parallel=devices // tp)
    return kwargs


_HARDWARE_FORM = re.compile(r"^(?P<name>[a-z0-9]+?)(?:x(?P<count>[+-]?\d+))?$")


#: A hardware file (e.g. one ``oam calibrate`` wrote) with an optional card count: ``./my.json x 8``.
_HARDWARE_FILE_FORM = re.compile(r"^(?P<path>.+?\.json)(?:\s*[x×]\s*(?P<count>[+-]?\d+))?$", re.IGNORECASE)


def parse_hardware(text: str) -> tuple[str, int]:
    """``"Ascend 910 x 8"`` -> ``("ascend910", 8)``; ``"ascend910b"`` -> ``("ascend910b", 1)``;
    a hardware file, ``"./my-910b.json x 8"`` -> ``("./my-910b.json", 8)`` (the path as given).

    Raises:
        ValueError: not a known device or a usable hardware file (a
            :class:`~simulator.hardware.HardwareFileError` naming the file and field), or a card
            count below 1 (the message lists the choices).
    """
    from simulator.hardware import list_hardware, load_hardware_file

    file = _HARDWARE_FILE_FORM.match(str(text).strip())
    if file:
        load_hardware_file(file.group("path"))
        count = int(file.group("count")) if file.group("count") else 1
        if count < 1:
            raise ValueError(f"hardware {text!r}: the card count must be at least 1, got {count}")
        return file.group("path"), count
    known = list_hardware()
    compact = re.sub(r"[\s_*]+", "", str(text).lower().replace("×", "x"))
    compact = compact.replace("-", "") if not re.search(r"x-\d+$", compact) else compact
    match = _HARDWARE_FORM.match(compact)
    name = match.group("name") if match else ""
    if name not in known:
        raise ValueError(f"unknown hardware {text!r}; known: {', '.join(known)}, each optionally with "
                         "a card count, e.g. 'Ascend 910 x 8' or 'ascend910b x 16'")
    count = int(match.group("count")) if match.group("count") else 1
    if count < 1:
        raise ValueError(f"hardware {text!r}: the card count must be at least 1, got {count}")
    return name, count


def _dataset_name(dataset: str | None) -> str | None:
    return None if dataset is None or str(dataset).lower() == "none" else dataset


class _DatasetSteps:
    """A workload whose every step takes its sequence length from a list."""

    def __init__(self, step: Callable, config: object, lengths: list[int], kwargs: dict) -> None:
        self.step, self.config, self.lengths, self.kwargs, self.index = step, config, lengths, kwargs, 0

    def __call__(self, npu) -> None:
        seq_len = self.lengths[self.index % len(self.lengths)]
        self.index += 1
        self.step(npu, self.config, seq_len=seq_len, **self.kwargs)


def collect_profile(
    model: str | Callable = "llama-7b",
    dataset: str | None = "wikitext-103",
    *,
    hardware: str = DEFAULT_HARDWARE,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    max_seq_len: int = 4096,
    seq_len: int | None = None,
    focus: str | None = None,
    context_ops: int | None = None,
    params: Mapping[str, object] | None = None,
    **model_kwargs,
) -> Profile:
    """Simulate ``steps`` steps of ``model`` and return the profile.

    ``model`` is a model zoo name (:func:`known_models`, parameters in
    :data:`MODEL_PARAMETERS`) or a workload ``fn(npu, **kwargs)``. With a ``dataset``, each
    step of a zoo model draws its sequence length (cut to ``max_seq_len``, a multiple of 128)
    from that corpus's distribution with ``seed``; with ``dataset=None`` (or ``"none"``) every
    step has ``seq_len`` tokens (default 2048). Model parameters come as keywords
    (``block_size=64``) or as a ``params`` mapping.

    With ``focus`` (an op type or glob, e.g. ``"FlashAttention"``), only the matching ops and
    the ``context_ops`` (default 5) ops before and after each of them keep full records; the
    rest are summarised per step and op type (:meth:`Profile.focused`), which keeps long runs
    small and leaves every op type's time, and so the comparison, unchanged.

    Raises:
        ValueError: unknown model, dataset, hardware or parameter (naming the value and the
            choices), a value of the wrong type, ``seq_len`` together with a dataset,
            ``context_ops`` without ``focus``, a ``focus`` no op type matches.
    """
    if context_ops is not None and focus is None:
        raise ValueError("context_ops applies only with focus=OP")
    context = 5 if context_ops is None else context_ops
    if focus is not None:
        _check_int("context_ops", context, 0)
    profile = _collect(model, dataset, hardware, steps, seed, max_seq_len, seq_len, {**(params or {}), **model_kwargs})
    return profile if focus is None else profile.focused(focus, context)


def _collect(model, dataset, hardware, steps, seed, max_seq_len, seq_len, model_kwargs) -> Profile:
    from simulator import run
    from simulator.datasets import load_dataset

    name, devices = parse_hardware(hardware)
    _check_int("steps", steps, 1)
    if callable(model):
        return run(model, steps=steps, hardware=name, devices=devices, **model_kwargs)
    zoo = _model_zoo()
    if model not in zoo:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(sorted(zoo))}, or a workload function")
    step, config = zoo[model]
    kwargs = _check_params(model, model_kwargs, name, devices)
    dataset = _dataset_name(dataset)
    if dataset is None:
        lengths = [_check_int("seq_len", DEFAULT_SEQ_LEN if seq_len is None else seq_len, 1)]
    else:
        if seq_len is not None:
            raise ValueError(f"seq_len applies only without a dataset; {dataset} draws each step's length "
                             "(use max_seq_len to cut it, or dataset=None)")
        _check_int("seed", seed, 0)
        if _check_int("max_seq_len", max_seq_len, 1) % 128:
            raise ValueError(f"max_seq_len must be a positive multiple of 128, got {max_seq_len}")
        lengths = load_dataset(dataset).sample(steps, max_seq_len, seed=seed)
    workload = _DatasetSteps(step, config, lengths, kwargs)
    return run(workload, steps=steps, hardware=name, devices=devices)


@dataclass
class ProfileBaseline:
    """A baseline for the Python API: what to collect, and (after :meth:`collect`) the result.

    Files written by :meth:`save` are plugin baseline files (``nodeid`` ``api:<model>``) that
    also record how they were collected (``collection``), so :meth:`load` then
    :meth:`collect` simulates the same workload again.
    """

    model: str
    dataset: str | None = "wikitext-103"
    hardware: str = DEFAULT_HARDWARE
    tag: str | None = None
    steps: int = DEFAULT_STEPS
    seed: int = 0
    max_seq_len: int = 4096
    seq_len: int | None = None
    params: dict[str, object] = field(default_factory=dict)
    file: BaselineFile | None = None
    profile: Profile | None = field(default=None, repr=False)

    @classmethod
    def create(cls, model: str, dataset: str | None = "wikitext-103", hardware: str = DEFAULT_HARDWARE,
               tag: str | None = None, steps: int = DEFAULT_STEPS, seed: int = 0, max_seq_len: int = 4096,
               seq_len: int | None = None, params: dict[str, object] | None = None) -> ProfileBaseline:
        """Describe a baseline; checks every setting now (see :func:`collect_profile`).

        ``params`` go to the model's step (:data:`MODEL_PARAMETERS`, e.g. ``block_size``).

        Raises:
            ValueError: unknown model, dataset, hardware or parameter, or a bad setting.
        """
        from simulator.datasets import load_dataset

        if not isinstance(model, str) or model not in _model_zoo():
            raise ValueError(f"unknown model {model!r}; known: {', '.join(known_models())} "
                             "(a workload function goes to collect_profile)")
        name, devices = parse_hardware(hardware)
        _check_params(model, dict(params or {}), name, devices)
        _check_int("steps", steps, 1)
        dataset = _dataset_name(dataset)
        if dataset is None:
            _check_int("seq_len", DEFAULT_SEQ_LEN if seq_len is None else seq_len, 1)
        else:
            load_dataset(dataset)
            if seq_len is not None:
                raise ValueError(f"seq_len applies only without a dataset; {dataset} draws each step's length")
            _check_int("seed", seed, 0)
            if _check_int("max_seq_len", max_seq_len, 1) % 128:
                raise ValueError(f"max_seq_len must be a positive multiple of 128, got {max_seq_len}")
        return cls(model=model, dataset=dataset, hardware=hardware, tag=tag, steps=steps, seed=seed,
                   max_seq_len=max_seq_len, seq_len=seq_len, params=dict(params or {}))

    def collect(self) -> Profile:
        """Simulate the model and keep its profile and statistics.

        Raises:
            ValueError: the baseline was saved by the pytest plugin for a test (its model is the
                test's id): only baselines of the Python API or ``oam baseline`` can be collected
                again.
        """
        if self.file is not None and not self.file.nodeid.startswith("api:"):
            raise ValueError(f"this baseline was saved by the pytest plugin for {self.file.nodeid}: run that test "
                             "to collect it again (only baselines made by ProfileBaseline or oam baseline know "
                             "their model)")
        self.profile = collect_profile(self.model, self.dataset, hardware=self.hardware, steps=self.steps,
                                       seed=self.seed, max_seq_len=self.max_seq_len, seq_len=self.seq_len,
                                       **self.params)
        collection = CollectionSettings(
            hardware=self.hardware, steps=self.steps, seed=self.seed if self.dataset else None,
            max_seq_len=self.max_seq_len if self.dataset else None,
            seq_len=None if self.dataset else (self.seq_len or DEFAULT_SEQ_LEN), params=dict(self.params))
        self.file = BaselineFile(nodeid=f"api:{self.model}", runs=[summarize(self.profile)],
                                 model=self.model, dataset=self.dataset, tag=self.tag, collection=collection)
        return self.profile

    @property
    def run(self) -> RunBaseline:
        if self.file is None:
            raise ValueError("the baseline holds no data: call collect() or load() first")
        return self.file.runs[0]

    def save(self, path: str | Path) -> None:
        """Write the baseline file atomically (plain JSON; a ``.gz`` name is refused).

        Raises:
            ValueError: nothing collected yet, or a ``.gz`` path.
        """
        if self.file is None:
            raise ValueError("nothing to save: call collect() first")
        path = Path(path)
        if path.suffix == ".gz":
            raise ValueError(f"{path}: baseline files are plain JSON (reviewable in a diff); use a .json name")
        save_baseline(path, self.file)

    @classmethod
    def load(cls, path: str | Path) -> ProfileBaseline:
        """Read a baseline file (made by this API or by ``--oam-save-baseline``).

        Raises:
            BaselineError: the file is missing, malformed or invalid (naming the file).
        """
        file = load_baseline(Path(path))
        run = file.runs[0]
        c = file.collection
        if c is None:
            return cls(model=file.model or file.nodeid, dataset=file.dataset, hardware=f"{run.hardware} x {run.devices}",
                       tag=file.tag, steps=run.steps, file=file)
        return cls(model=file.model or file.nodeid, dataset=file.dataset, hardware=c.hardware, tag=file.tag,
                   steps=c.steps, seed=c.seed or 0, max_seq_len=c.max_seq_len or 4096, seq_len=c.seq_len,
                   params=dict(c.params), file=file)


@dataclass(frozen=True)
class Regression:
    """One regressed op type (or ``step``): its time per step in seconds at the baseline and
    now, ``regression_ratio`` = current / baseline, and the limit it broke (a fraction).

    ``baseline_time_ms`` and ``current_time_ms`` (milliseconds) are deprecated: they still
    work, with a ``DeprecationWarning``; use ``baseline_time_s`` and ``current_time_s``.
    """

    op_name: str
    baseline_time_s: float
    current_time_s: float
    regression_ratio: float
    limit_frac: float

    @property
    def baseline_time_ms(self) -> float:
        """Deprecated: :attr:`baseline_time_s` in milliseconds."""
        _deprecated("Regression.baseline_time_ms", "Regression.baseline_time_s")
        return self.baseline_time_s * MS_PER_S  # not display: the deprecated field's unit

    @property
    def current_time_ms(self) -> float:
        """Deprecated: :attr:`current_time_s` in milliseconds."""
        _deprecated("Regression.current_time_ms", "Regression.current_time_s")
        return self.current_time_s * MS_PER_S  # not display: the deprecated field's unit


def _deprecated(old: str, new: str) -> None:
    import warnings

    warnings.warn(f"{old} is deprecated: use {new} (seconds)", DeprecationWarning, stacklevel=3)


#: Version of :meth:`ComparisonReport.to_json` (``oam compare --format json``). 2: the findings'
#: severities are on the one scale of :mod:`pytest_oam.severity` (version 1: critical / major / minor).
COMPARISON_SCHEMA_VERSION = 2


@dataclass(frozen=True)
class ComparisonReport:
    """The result of :func:`compare_profiles`: status, verdicts, regressions and findings."""

    status: str
    comparison: RunComparison
    findings: list[Finding]
    baseline_run: RunBaseline | None = None
    current_run: RunBaseline | None = None
    limits: dict[str, float] = field(default_factory=dict)
    #: The diagnosis rules over the current profile (:mod:`pytest_oam.rules`): all of them for a
    #: simulated profile, those that need no hardware spec for an imported real one.
    diagnosis: list = field(default_factory=list)

    @property
    def has_regression(self) -> bool:
        return self.status == "regressed"

    @property
    def passed(self) -> bool:
        """Does the comparison pass the gate? True for ``pass`` and ``improved``; False for
        ``regressed``, ``missing-ops`` and ``incomparable`` (the statuses
        :meth:`~pytest_oam.judge.status.GateStatus.fails` fails with ``strict``, as ``oam compare``
        exits 1 on them) and when nothing could be compared, so ``assert report.passed`` misses no
        failing status (``not report.regressions`` passes a ``missing-ops`` report)."""
        from .judge.status import GateStatus

        return not (self.comparison.compared_nothing or GateStatus(self.status).fails(strict=True))

    @property
    def regressions(self) -> list[Regression]:
        """Regressed rows measured in time: op types, ``step`` and ``alloc_time``. Peak memory
        and cache flushes are in :attr:`memory_regressions`."""
        return [
            Regression(v.op_type, v.baseline_s, v.current_s, v.current_s / v.baseline_s, v.limit_frac)
            for v in self.comparison.verdicts
            if v.status == "regressed" and v.unit == "s"
        ]

    @property
    def memory_regressions(self) -> list[Verdict]:
        """Regressed rows not measured in time: peak memory (``unit`` "bytes") and allocations
        that flushed the cache per step (``alloc_retries``, unit "count", baseline possibly 0)."""
        return [v for v in self.comparison.verdicts if v.status == "regressed" and v.unit != "s"]

    def noise_notes(self) -> list[str]:
        """What was above its limit but did not count, and why (never hidden)."""
        notes = []
        weak = [v for v in self.comparison.verdicts if v.status == "not-significant"]
        if weak:
            notes.append("above the limit but not significant (per-step samples, one-sided Mann-Whitney U): "
                         + ", ".join(f"{v.op_type} {fmt_percent(v.change_frac, 1, signed=True)} ({v.statistic})"
                                     for v in weak))
        tiny = [v for v in self.comparison.verdicts if v.status == "insignificant"]
        if tiny:
            notes.append("above the limit but below the minimum time that counts: "
                         + ", ".join(f"{v.op_type} {fmt_us(v.current_s - v.baseline_s, signed=True)}" for v in tiny))
        return notes

    def to_text(self) -> str:
        """The comparison for a terminal; op names and other text from the files compared are
        made :func:`~pytest_oam.report.terminal_safe` (no escape sequence, no forged line)."""
        from .format import terminal_safe
        from .report.text import findings_text, verdict_table

        safe = terminal_safe
        lines = [f"status: {self.status}", verdict_table(self.comparison.verdicts)]
        lines += [f"note: {safe(r)}" for r in self.comparison.reasons + self.noise_notes()]
        if self.findings:
            lines += ["diagnosis:", findings_text(self.findings)]
        if self.diagnosis:
            lines += ["rules:"] + [f"  [{d.severity}] {safe(d.rule_id)}: {safe(d.op_type)}"
                                   + (f" at {safe(d.location)}" if d.location else "") + f": {safe(d.description)}\n"
                                   f"      what to do: {safe(d.fix)}" for d in self.diagnosis]
        return "\n".join(lines)

    def to_json(self) -> str:
        data = {
            "schema_version": COMPARISON_SCHEMA_VERSION,
            "status": self.status,
            "hardware": None if self.current_run is None else self.current_run.hardware,
            "devices": None if self.current_run is None else self.current_run.devices,
            "limits": self.limits,
            "verdicts": [vars(v) for v in self.comparison.verdicts],
            "reasons": self.comparison.reasons,
            "notes": self.noise_notes(),
            "diagnosis": [
                {"rule_id": d.rule_id, "severity": d.severity, "op_type": d.op_type, "op_name": d.op_name,
                 "location": d.location, "description": d.description, "fix": d.fix, "gain_s": d.gain_s,
                 "step_share_frac": d.step_share_frac}
                for d in self.diagnosis
            ],
            "findings": [
                {"op_type": f.op_type, "kind": f.kind, "severity": f.severity, "delta_s": f.delta_s,
                 "call_sites": f.call_sites, "advice": f.advice,
                 "counters": {c.name: [c.baseline, c.current] for c in f.counters}}
                for f in self.findings
            ],
        }
        return json.dumps(data, indent=2, sort_keys=True, allow_nan=False)

    def to_markdown(self) -> str:
        """The comparison as GitHub Markdown; text from the files compared is escaped
        (:func:`~pytest_oam.report.md_text`), so it cannot forge a table row or inject HTML."""
        from .format import md_code, md_text
        from .report.text import findings_markdown, verdict_table

        lines = [f"**{self.status}**", "", verdict_table(self.comparison.verdicts, fmt="github")]
        lines += [f"- note: {md_text(r)}" for r in self.comparison.reasons + self.noise_notes()]
        lines += findings_markdown(self.findings)
        lines += [f"- **{d.severity}** {md_code(d.rule_id)} {md_text(d.op_type)}"
                  + (f" at {md_code(d.location)}" if d.location else "") + f": {md_text(d.description)}\n"
                  f"  - {md_text(d.fix)}" for d in self.diagnosis]
        return "\n".join(lines) + "\n"


def _as_run(value: ProfileBaseline | BaselineFile | Profile, role: str,
            fingerprint: str | None = None) -> tuple[RunBaseline, Profile | None]:
    if isinstance(value, ProfileBaseline):
        if value.file is None:
            raise ValueError(f"the {role} holds no data: call collect() or load() first")
        value = value.file if value.profile is None else value.profile
    if isinstance(value, Profile):
        return summarize(value), value
    if not isinstance(value, BaselineFile):
        raise TypeError(f"the {role} must be a ProfileBaseline, a BaselineFile or a Profile, not {type(value).__name__}")
    if len(value.runs) == 1:
        return value.runs[0], None
    matching = [r for r in value.runs if r.workload_fingerprint == fingerprint]
    if len(matching) != 1:
        raise ValueError(
            f"the {role} ({value.nodeid}) holds {len(value.runs)} profiled runs and "
            f"{'none' if not matching else len(matching)} of them has the current workload's fingerprint "
            f"{fingerprint}; compare_profiles compares one run: compare with the plugin, or pass that run's file"
        )
    return matching[0], None


def _bundled_spec(name: str):
    """The bundled spec called ``name``, or ``None`` (a profile of a card this version does not ship)."""
    from simulator.hardware import list_hardware, load_hardware

    return load_hardware(name) if name in list_hardware() else None


def compare_profiles(
    baseline: ProfileBaseline | BaselineFile | Profile,
    current: Profile | ProfileBaseline | BaselineFile,
    regression_threshold: float | str = 0.10,
    thresholds: Mapping[str, float | str] | None = None,
    min_delta_s: float | None = None,
    alpha: float = SIGNIFICANCE_ALPHA,
) -> ComparisonReport:
    """Compare ``current`` with ``baseline`` through the plugin's gate: the run is judged by
    :func:`pytest_oam.gate.evaluate.judge_run`, as each run of a test is, and the diagnosis
    rules run over the current profile.

    ``regression_threshold`` is the default limit (``0.05`` or ``"5%"``); FlashAttention and the
    peak-memory rows keep the plugin's stricter limits (2% and 5%, or the threshold if lower); ``thresholds`` sets
    per-op limits (``{"MatMul": "5%", "FlashAttention*": 0.01}``) over both. A baseline file
    taken as ``current`` compares the same way, but its findings cannot name call sites. A
    baseline file with several runs (a plugin test that profiled more than once) is compared
    on its run with the current workload's fingerprint. ``min_delta_s`` is the smallest change
    in seconds that counts (:func:`pytest_oam.compare.compare_run`); by default
    :data:`REAL_MIN_DELTA_S` for imported real profiles, 0 for simulated ones. When both sides
    are profiles with per-step samples (at least
    :data:`~pytest_oam.compare.SIGNIFICANCE_MIN_SAMPLES` steps of an op type), a change above
    its limit counts only if it is significant at ``alpha`` (a one-sided Mann-Whitney U test,
    :func:`pytest_oam.compare.apply_significance`); otherwise it is reported as
    ``not-significant``.

    Raises:
        ThresholdError: a negative, non-finite or malformed threshold.
        ValueError: the baseline holds no data, was made on other hardware or device count, or
            has several runs and none (or more than one) matches the current workload; ``alpha``
            is not between 0 and 1.
        TypeError: an argument of another type.

    A ``thresholds`` pattern that matches no row is named in the report's reasons (a typo would
    otherwise leave the gate looser than asked).
    """
    check_alpha(alpha)  # before any work, whether or not the significance test runs
    limit = parse_limit(regression_threshold)
    flash = min(DEFAULT_THRESHOLDS["FlashAttention*"], limit)
    memory = min(DEFAULT_THRESHOLDS["memory.*"], limit)  # peak memory keeps the plugin's stricter limit too
    per_op = {op: parse_limit(value) for op, value in (thresholds or {}).items()}
    resolver = LimitResolver.build(cli={"FlashAttention*": flash, "memory.*": memory, "*": limit, **per_op})
    current_run, current_profile = _as_run(current, "current profile")
    base_run, base_profile = _as_run(baseline, "baseline", current_run.workload_fingerprint)
    if (base_run.hardware, base_run.devices) != (current_run.hardware, current_run.devices):
        raise ValueError(
            f"the baseline was made on {base_run.hardware} x {base_run.devices}, the current profile on "
            f"{current_run.hardware} x {current_run.devices}: collect both on the same hardware"
        )
    if min_delta_s is not None and (min_delta_s < 0 or not math.isfinite(min_delta_s)):
        raise ValueError(f"min_delta_s must be a finite number >= 0, got {min_delta_s!r}")
    from .gate.evaluate import card_spec, judge_run

    # the plugin's gate judges each run with the same function (by default REAL_MIN_DELTA_S for
    # an imported real profile, 0 for a simulated one)
    spec = card_spec(current_run.hardware, _bundled_spec)
    comparison, findings = judge_run(0, base_run, current_run, resolver, profile=current_profile,
                                     baseline_profile=base_profile, hardware=spec, min_delta_s=min_delta_s,
                                     alpha=alpha)
    rows = {v.op_type for v in comparison.verdicts}
    unmatched = [p for p in per_op if not any(fnmatchcase(row, p) for row in rows)]
    if unmatched:
        note = ("thresholds match no row of this comparison: " + ", ".join(unmatched)
                + " (op types are case-sensitive: " + ", ".join(sorted(rows)) + ")")
        comparison = dataclasses.replace(comparison, reasons=[*comparison.reasons, note])
    rules = []
    if current_profile is not None:
        from .judge.rules import run_rules

        rules = run_rules(current_profile, spec)
    return ComparisonReport(comparison.status, comparison, findings, base_run, current_run,
                            {"default": limit, "FlashAttention*": flash, "memory.*": memory, **per_op}, rules)

# -- profile files --------------------------------------------------------------------------


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile`` as JSON to ``path`` atomically (gzip-compressed if it ends in ``.gz``)."""
    path = Path(path)
    text = profile.to_json()
    if path.suffix == ".gz":
        atomic_write_bytes(path, gzip.compress(text.encode("utf-8"), mtime=0))
    else:
        atomic_write_text(path, text)


class ProfileFileError(ValueError):
    """A file that is not a readable profile or baseline; the message names the file."""


def load_profile(path: str | Path) -> Profile:
    """Read a profile written by :func:`save_profile` (or ``oam collect``).

    Raises:
        ProfileFileError: unreadable, not gzip/JSON, or not a valid profile (naming the file).
    """
    value = load_any(path)
    if not isinstance(value, Profile):
        raise ProfileFileError(f"{path}: is a baseline file, not a profile")
    return value


def load_any(path: str | Path) -> Profile | BaselineFile:
    """Read a profile or a baseline file, whichever ``path`` holds; real profiler output
    (torch_npu / msprof CSV or output folder, Kineto or torch_npu Chrome-trace JSON) is
    imported (:mod:`pytest_oam.importers`).

    Raises:
        ProfileFileError: unreadable, not gzip/JSON, or neither a profile nor a baseline.
        BaselineError: a baseline file that fails validation.
    """
    from .files.importers import ImportError_, import_chrome_trace, import_profile

    path = Path(path)
    if path.is_dir() or path.suffix.lower() == ".csv":
        try:
            return import_profile(path)
        except ImportError_ as exc:
            raise ProfileFileError(str(exc)) from None
    from .files.file_kinds import input_problem, json_kind_problem, known_json_problem
    from .files.fileio import DuplicateKeyError, InputFileError, read_input

    duplicates: list[str] = []  # refused in our own formats, tolerated in foreign traces

    def note_duplicates(pairs: list[tuple[str, object]]) -> dict:
        result = dict(pairs)
        if len(result) != len(pairs) and not duplicates:
            seen: set[str] = set()
            duplicates.extend(key for key, _ in pairs if key in seen or seen.add(key))
        return result

    try:
        # regular files only (a named pipe is never opened); at most MAX_INPUT_BYTES decompressed
        raw, compressed = read_input(path)
        data = json.loads(raw, object_pairs_hook=note_duplicates)
    except InputFileError as exc:
        raise ProfileFileError(input_problem(path, exc.problem)) from None
    except RecursionError:
        raise ProfileFileError(f"{path}: is not a profile, a baseline or a trace: its JSON nests too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        # a profiler file's damage in its own words (file_kinds): "a torch_npu trace_view.json, an unclosed array"
        raise ProfileFileError(known_json_problem(path, raw, exc)
                               or f"{path}: is not a JSON profile or baseline ({exc})") from None
    if isinstance(data, list) or (isinstance(data, dict) and "traceEvents" in data):
        try:
            return import_chrome_trace(path)
        except ImportError_ as exc:
            raise ProfileFileError(str(exc)) from None
    if isinstance(data, dict) and data.get("kind") == "pytest-oam-record":
        # a record of a test (--oam-record), not a baseline (newcomer finding: it was called a
        # compressed baseline)
        raise ProfileFileError(f"{path}: is a record of {data.get('nodeid', 'a test')} (pytest --oam-record); "
                               f"replay it with: oam replay {path}")
    if isinstance(data, dict) and "runs" in data:
        if compressed:
            raise ProfileFileError(f"{path}: is a compressed baseline file; baselines are plain JSON")
        return load_baseline(path)
    if not isinstance(data, dict) or "ops" not in data:
        raise ProfileFileError(json_kind_problem(path, data)  # a profiler file of another kind (file_kinds)
                               or f"{path}: is neither a profile (no 'ops') nor a baseline file (no 'runs')")
    if duplicates:
        raise ProfileFileError(f"{path}: is not a valid profile: it {DuplicateKeyError(duplicates[0])}")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise ProfileFileError(f"{path}: is not a valid profile: {problems}") from None

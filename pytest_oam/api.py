"""The Python API outside pytest: build a baseline, collect a profile, compare, act.

    import pytest_oam as oam
    baseline = oam.ProfileBaseline.create(model="llama-7b", dataset="wikitext-103",
                                          hardware="Ascend 910 x 8", tag="v1.0")
    baseline.collect()
    baseline.save("baselines/llama-7b-v1.0.json")
    current = oam.collect_profile(model="llama-7b", dataset="wikitext-103")
    report = oam.compare_profiles(baseline, current, regression_threshold=0.05)

The comparison and the diagnosis are the plugin's own (:mod:`pytest_oam.compare`,
:mod:`pytest_oam.diagnosis`); baseline files are the plugin's format, loadable by either.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from simulator.profile import Profile

from .baseline import BaselineFile, RunBaseline, load_baseline, save_baseline
from .compare import RunComparison, compare_run, summarize
from .diagnosis import Finding, diagnose
from .fileio import atomic_write_bytes, atomic_write_text
from .thresholds import DEFAULT_THRESHOLDS, LimitResolver, parse_limit

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


def model_parameters(model: str) -> list[str]:
    """The keyword parameters a zoo model's step takes (``seq_len`` comes from the dataset)."""
    import inspect

    step, _ = _model_zoo()[model]
    return sorted(
        name for name, p in inspect.signature(step).parameters.items()
        if p.kind is p.KEYWORD_ONLY and name not in ("seq_len", "layout")
    )


_HARDWARE_FORM = re.compile(r"^(?P<name>[a-z0-9]+?)(?:x(?P<count>\d+))?$")


def parse_hardware(text: str) -> tuple[str, int]:
    """``"Ascend 910 x 8"`` -> ``("ascend910", 8)``; ``"ascend910b"`` -> ``("ascend910b", 1)``.

    Raises:
        ValueError: not a known device, or a count below 1 (the message lists the choices).
    """
    from simulator.hardware import list_hardware

    known = list_hardware()
    compact = re.sub(r"[\s_*-]+", "", str(text).lower().replace("×", "x"))
    match = _HARDWARE_FORM.match(compact)
    name = match.group("name") if match else ""
    count = int(match.group("count")) if match and match.group("count") else 1
    if name not in known or count < 1:
        choices = ", ".join([*known, "'Ascend 910 x 8'", "'Ascend 910B x 8'"])
        raise ValueError(f"unknown hardware {text!r}; known: {choices}")
    return name, count


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
    focus: str | None = None,
    context_ops: int = 5,
    **model_kwargs,
) -> Profile:
    """Simulate ``steps`` steps of ``model`` and return the profile.

    ``model`` is a model zoo name (:func:`known_models`) or a workload ``fn(npu, **kwargs)``.
    With a ``dataset``, each step of a zoo model draws its sequence length (cut to
    ``max_seq_len``) from that corpus's distribution with ``seed``.

    With ``focus`` (an op type or glob, e.g. ``"FlashAttention"``), only the matching ops and
    the ``context_ops`` ops before and after each of them keep full records; the rest are
    summarised per step and op type (:meth:`Profile.focused`), which keeps long runs small
    and leaves every op type's time, and so the comparison, unchanged.

    Raises:
        ValueError: unknown model, dataset or hardware (naming the value and the choices), a
            ``focus`` no op type matches, or a negative ``context_ops``.
    """
    if focus is not None and (not isinstance(context_ops, int) or context_ops < 0):
        raise ValueError(f"context_ops must be a non-negative integer, got {context_ops!r}")
    profile = _collect(model, dataset, hardware, steps, seed, max_seq_len, model_kwargs)
    return profile if focus is None else profile.focused(focus, context_ops)


def _collect(model, dataset, hardware, steps, seed, max_seq_len, model_kwargs) -> Profile:
    from simulator import run
    from simulator.datasets import load_dataset

    name, devices = parse_hardware(hardware)
    if callable(model):
        return run(model, steps=steps, hardware=name, devices=devices, **model_kwargs)
    zoo = _model_zoo()
    if model not in zoo:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(sorted(zoo))}, or a workload function")
    step, config = zoo[model]
    allowed = model_parameters(model)
    unknown = sorted(set(model_kwargs) - set(allowed) - {"seq_len"})
    if unknown:
        raise ValueError(f"unknown parameter {', '.join(map(repr, unknown))} for model {model!r}; "
                         f"known: {', '.join(allowed)}")
    fixed_seq_len = model_kwargs.pop("seq_len", DEFAULT_SEQ_LEN)
    if dataset is None:
        lengths = [fixed_seq_len]
    else:
        lengths = load_dataset(dataset).sample(steps, max_seq_len, seed=seed)
    workload = _DatasetSteps(step, config, lengths, model_kwargs)
    return run(workload, steps=steps, hardware=name, devices=devices)


@dataclass
class ProfileBaseline:
    """A baseline for the Python API: what to collect, and (after :meth:`collect`) the result.

    Files written by :meth:`save` are plugin baseline files (``nodeid`` ``api:<model>``).
    """

    model: str
    dataset: str | None = "wikitext-103"
    hardware: str = DEFAULT_HARDWARE
    tag: str | None = None
    steps: int = DEFAULT_STEPS
    seed: int = 0
    max_seq_len: int = 4096
    seq_len: int = DEFAULT_SEQ_LEN
    params: dict[str, object] = field(default_factory=dict)
    file: BaselineFile | None = None
    profile: Profile | None = field(default=None, repr=False)

    @classmethod
    def create(cls, model: str, dataset: str | None = "wikitext-103", hardware: str = DEFAULT_HARDWARE,
               tag: str | None = None, steps: int = DEFAULT_STEPS, seed: int = 0, max_seq_len: int = 4096,
               seq_len: int = DEFAULT_SEQ_LEN, params: dict[str, object] | None = None) -> ProfileBaseline:
        """Describe a baseline; checks every name now.

        ``seq_len`` is the length of every step when ``dataset`` is ``None``; with a dataset,
        each step draws its length (at most ``max_seq_len``) with ``seed``. ``params`` go to
        the model's step (:func:`model_parameters` lists them, e.g. ``block_size``).

        Raises:
            ValueError: unknown model, dataset or hardware.
        """
        from simulator.datasets import load_dataset

        if model not in _model_zoo():
            raise ValueError(f"unknown model {model!r}; known: {', '.join(known_models())}")
        unknown = sorted(set(params or {}) - set(model_parameters(model)))
        if unknown:
            raise ValueError(f"unknown parameter {', '.join(map(repr, unknown))} for model {model!r}; "
                             f"known: {', '.join(model_parameters(model))}")
        if dataset is not None:
            load_dataset(dataset)
        parse_hardware(hardware)
        return cls(model=model, dataset=dataset, hardware=hardware, tag=tag, steps=steps, seed=seed,
                   max_seq_len=max_seq_len, seq_len=seq_len, params=dict(params or {}))

    def collect(self) -> Profile:
        """Simulate the model and keep its profile and statistics."""
        self.profile = collect_profile(self.model, self.dataset, hardware=self.hardware, steps=self.steps,
                                       seed=self.seed, max_seq_len=self.max_seq_len, seq_len=self.seq_len,
                                       **self.params)
        self.file = BaselineFile(nodeid=f"api:{self.model}", runs=[summarize(self.profile)],
                                 model=self.model, dataset=self.dataset, tag=self.tag)
        return self.profile

    @property
    def run(self) -> RunBaseline:
        if self.file is None:
            raise ValueError("the baseline holds no data: call collect() or load() first")
        return self.file.runs[0]

    def save(self, path: str | Path) -> None:
        """Write the baseline file atomically.

        Raises:
            ValueError: nothing collected yet.
        """
        if self.file is None:
            raise ValueError("nothing to save: call collect() first")
        save_baseline(Path(path), self.file)

    @classmethod
    def load(cls, path: str | Path) -> ProfileBaseline:
        """Read a baseline file (made by this API or by ``--oam-save-baseline``).

        Raises:
            BaselineError: the file is missing, malformed or invalid (naming the file).
        """
        file = load_baseline(Path(path))
        run = file.runs[0]
        hardware = f"{run.hardware} x {run.devices}"
        return cls(model=file.model or file.nodeid, dataset=file.dataset, hardware=hardware, tag=file.tag,
                   steps=run.steps, file=file)


@dataclass(frozen=True)
class Regression:
    """One regressed op type (or ``step``). Times in milliseconds; ratio = current / baseline."""

    op_name: str
    baseline_time_ms: float
    current_time_ms: float
    regression_ratio: float
    limit_frac: float


@dataclass(frozen=True)
class ComparisonReport:
    """The result of :func:`compare_profiles`: status, verdicts, regressions and findings."""

    status: str
    comparison: RunComparison
    findings: list[Finding]

    @property
    def has_regression(self) -> bool:
        return self.status == "regressed"

    @property
    def regressions(self) -> list[Regression]:
        return [
            Regression(v.op_type, v.baseline_s * 1e3, v.current_s * 1e3, v.current_s / v.baseline_s, v.limit_frac)
            for v in self.comparison.verdicts
            if v.status == "regressed"
        ]

    def to_text(self) -> str:
        from .report import findings_text, verdict_table

        lines = [f"status: {self.status}", verdict_table(self.comparison.verdicts)]
        lines += [f"note: {r}" for r in self.comparison.reasons]
        if self.findings:
            lines += ["diagnosis:", findings_text(self.findings)]
        return "\n".join(lines)

    def to_json(self) -> str:
        data = {
            "status": self.status,
            "verdicts": [vars(v) for v in self.comparison.verdicts],
            "reasons": self.comparison.reasons,
            "findings": [
                {"op_type": f.op_type, "kind": f.kind, "severity": f.severity, "delta_s": f.delta_s,
                 "call_sites": f.call_sites, "advice": f.advice,
                 "counters": {c.name: [c.baseline, c.current] for c in f.counters}}
                for f in self.findings
            ],
        }
        return json.dumps(data, indent=2, sort_keys=True, allow_nan=False)

    def to_markdown(self) -> str:
        from .report import findings_markdown, verdict_table

        lines = [f"**{self.status}**", "", verdict_table(self.comparison.verdicts, fmt="github")]
        lines += [f"- note: {r}" for r in self.comparison.reasons]
        lines += findings_markdown(self.findings)
        return "\n".join(lines) + "\n"


def _as_run(value: ProfileBaseline | BaselineFile | Profile, role: str) -> tuple[RunBaseline, Profile | None]:
    if isinstance(value, ProfileBaseline):
        return value.run, value.profile
    if isinstance(value, BaselineFile):
        return value.runs[0], None
    if isinstance(value, Profile):
        return summarize(value), value
    raise TypeError(f"the {role} must be a ProfileBaseline, a BaselineFile or a Profile, not {type(value).__name__}")


def compare_profiles(
    baseline: ProfileBaseline | BaselineFile | Profile,
    current: Profile | ProfileBaseline | BaselineFile,
    regression_threshold: float | str = 0.10,
) -> ComparisonReport:
    """Compare ``current`` with ``baseline`` with the plugin's comparison and diagnosis.

    ``regression_threshold`` is the default limit (``0.05`` or ``"5%"``); FlashAttention keeps
    the plugin's stricter limit (2%, or the threshold if that is lower). A baseline file taken
    as ``current`` compares the same way, but its findings cannot name call sites.

    Raises:
        ThresholdError: a negative, non-finite or malformed threshold.
        ValueError: the baseline holds no data, or was made on other hardware or device count.
        TypeError: an argument of another type.
    """
    limit = parse_limit(regression_threshold)
    flash = min(DEFAULT_THRESHOLDS["FlashAttention*"], limit)
    resolver = LimitResolver.build(cli={"FlashAttention*": flash, "*": limit})
    base_run, _ = _as_run(baseline, "baseline")
    current_run, current_profile = _as_run(current, "current profile")
    if (base_run.hardware, base_run.devices) != (current_run.hardware, current_run.devices):
        raise ValueError(
            f"the baseline was made on {base_run.hardware} x {base_run.devices}, the current profile on "
            f"{current_run.hardware} x {current_run.devices}: collect both on the same hardware"
        )
    comparison = compare_run(0, base_run, current_run, resolver)
    findings = diagnose(comparison, current_profile, current_run.ops, base_run.ops)
    return ComparisonReport(comparison.status, comparison, findings)


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
    """Read a profile or a baseline file, whichever ``path`` holds.

    Raises:
        ProfileFileError: unreadable, not gzip/JSON, or neither a profile nor a baseline.
        BaselineError: a baseline file that fails validation.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        compressed = raw[:2] == b"\x1f\x8b"
        data = json.loads(gzip.decompress(raw) if compressed else raw)
    except OSError as exc:
        raise ProfileFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileFileError(f"{path}: is not a JSON profile or baseline ({exc})") from None
    if isinstance(data, dict) and "runs" in data:
        if compressed:
            raise ProfileFileError(f"{path}: is a compressed baseline file; baselines are plain JSON")
        return load_baseline(path)
    if not isinstance(data, dict) or "ops" not in data:
        raise ProfileFileError(f"{path}: is neither a profile (no 'ops') nor a baseline file (no 'runs')")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise ProfileFileError(f"{path}: is not a valid profile: {problems}") from None

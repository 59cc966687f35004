"""The ``oam_profile`` fixture's object: runs workloads on the simulator for one test and keeps
their profiles for the gate; shape properties and the tuned check on the test's hardware."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from simulator.profile import Profile

    from .files.baseline import BaselineFile
    from .markers import MarkerSettings
    from .settings import OamSettings


PROFILER_KEY = pytest.StashKey["OamProfiler"]()


def _arguments_repr(args: tuple, kwargs: dict[str, Any], limit: int = 2000) -> str:
    """The workload's arguments as text, for a record (shortened past ``limit`` characters)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items() if k not in ("memory", "allocator")]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit] + "..."


def first_given(*values):
    """The first value that is not ``None``."""
    return next(v for v in values if v is not None)


class OamProfiler:
    """The object the ``oam_profile`` fixture gives a test."""

    def __init__(self, item: pytest.Item, settings: OamSettings, marker: MarkerSettings,
                 baseline: BaselineFile | None, baseline_path: Path | None) -> None:
        self._settings = settings
        self._marker = marker
        self.baseline = baseline
        self.baseline_path = baseline_path
        self.baseline_error: str | None = None
        self.profiles: list[Profile] = []
        self.run_configs: list[dict[str, Any]] = []  # how each run was made, for --oam-record
        self._config = item.config

    def run(self, workload, *args, steps: int = 1, hardware: str | None = None,
            devices: int | None = None, op_time_scale: dict[str, float] | None = None, **kwargs) -> Profile:
        """Run ``workload(npu, *args, **kwargs)`` on the simulator and keep its profile.

        ``hardware`` and ``devices`` default to the test's marker, then ``--oam-hardware`` /
        the ``oam_hardware`` ini value, then one ``ascend910``. ``op_time_scale`` injects a
        slowdown per op type (for testing gates).

        Raises:
            ValueError: unknown hardware, bad steps or devices, or an operator error (naming
                the op and shapes).
        """
        if not callable(workload):
            raise TypeError(f"oam_profile.run: the workload must be a function called as workload(npu, *args, "
                            f"**kwargs), got {type(workload).__name__} {workload!r:.80}")
        import simulator

        hardware, devices = self._hardware(hardware), first_given(devices, self._marker.devices, 1)
        collection = kwargs.pop("collection", None) or self._settings.collection()
        profile = simulator.run(
            workload, *args, steps=steps, hardware=hardware, devices=devices, op_time_scale=op_time_scale,
            collection=collection, **kwargs,
        )
        self._keep(profile, workload, args, kwargs, steps, devices, op_time_scale, collection)
        return profile

    def _keep(self, profile: Profile, workload, args: tuple, kwargs: dict, steps: int, devices: int,
              op_time_scale: dict[str, float] | None, collection: str) -> None:
        """Keep ``profile`` for the gate, with how it was made (for --oam-record)."""
        self.profiles.append(profile)
        allocator = kwargs.get("allocator")
        self.run_configs.append({
            "workload": f"{getattr(workload, '__module__', '?')}.{getattr(workload, '__qualname__', repr(workload))}",
            "arguments": _arguments_repr(args, kwargs),
            "steps": steps, "hardware": profile.hardware, "devices": devices,
            "op_time_scale": dict(op_time_scale or {}),
            "memory": bool(kwargs.get("memory") or allocator is not None),
            "allocator": None if allocator is None else str(allocator),
            "collection": collection,
        })

    def load(self, path: str | os.PathLike) -> Profile:
        """Read a real profile at ``path`` and keep it for the gate, like a simulated run:
        whatever :func:`pytest_oam.api.load_any` reads (a torch_npu output folder or its
        ``kernel_details.csv``, an msprof ``op_summary_*.csv``, a torch_npu ``trace_view.json``,
        a Kineto trace, or a profile ``oam collect`` wrote). A relative path is relative to the
        current folder. Baselines, thresholds, markers, statuses, reports and records then treat
        it as they treat ``run``'s profiles; changes under
        :data:`pytest_oam.judge.compare.REAL_MIN_DELTA_S` (20 us) do not count for imported runs,
        whose hardware is ``real:<source>``.

        Nothing readable at ``path`` (missing, empty, mis-encoded, cut short, of another kind) or
        a baseline file fails the test with one line naming the file and what is wrong, without
        a traceback (``pytest.fail``).
        """
        __tracebackhide__ = True
        from simulator.profile import Profile

        from .api import ProfileFileError, load_any

        try:
            profile = load_any(path)
        except ProfileFileError as exc:
            pytest.fail(f"oam_profile.load: {exc}", pytrace=False)
        if not isinstance(profile, Profile):
            pytest.fail(f"oam_profile.load: {path}: is a baseline file; load a profile or real profiler output",
                        pytrace=False)
        self.profiles.append(profile)
        self.run_configs.append({
            "workload": "oam_profile.load", "arguments": _arguments_repr((os.fspath(path),), {}),
            "steps": profile.steps, "hardware": profile.hardware, "devices": profile.devices,
            "op_time_scale": {}, "memory": bool(profile.memory), "allocator": None, "collection": profile.collection,
        })
        return profile

    def run_torch(self, step, *args, setup=None, steps: int = 1, hardware: str | None = None,
                  devices: int | None = None, op_time_scale: dict[str, float] | None = None, **kwargs) -> Profile:
        """Capture the user's torch ``step(*setup(), *args, **kwargs)`` on the simulator
        (:func:`simulator.capture.run_torch`) and keep its profile for the gate, as :meth:`run`.

        ``hardware`` and ``devices`` default as in :meth:`run`. PyTorch operators no mapping
        knows are costed generically and named in a warning; under ``--oam-strict`` they fail
        the test.

        Raises:
            TorchMissingError: PyTorch is not installed.
            CaptureError: the step reads tensor values or runs device-specific code (the
                message names the line), or ``setup`` returned None.
            TypeError, ValueError: as :meth:`run`.
        """
        __tracebackhide__ = True
        import warnings

        import simulator
        from simulator.capture import CaptureError, TorchMissingError, UnmappedOpsWarning

        hardware, devices = self._hardware(hardware), first_given(devices, self._marker.devices, 1)
        collection = kwargs.pop("collection", None) or self._settings.collection()
        problem = None
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UnmappedOpsWarning)
                profile = simulator.run_torch(step, *args, setup=setup, steps=steps, hardware=hardware,
                                              devices=devices, op_time_scale=op_time_scale, collection=collection,
                                              **kwargs)
        except (CaptureError, TorchMissingError) as error:
            problem = f"oam_profile.run_torch: {error}"
        if problem is not None:  # outside the except block: the one line, without the chained traceback
            pytest.fail(problem, pytrace=False)
        for warning in caught:
            if issubclass(warning.category, UnmappedOpsWarning) and self._settings.strict:
                pytest.fail(f"oam_profile.run_torch: {warning.message} (--oam-strict fails a step with "
                            "operators the simulator does not model)", pytrace=False)
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        self._keep(profile, step, args, kwargs, steps, devices, op_time_scale, collection)
        return profile

    # -- performance properties over shapes (pytest_oam.perf); nothing here is gated ----------

    def _hardware(self, hardware: str | None) -> str:
        return first_given(hardware, self._marker.hardware, self._settings.hardware)

    def measure(self, op_type: str, shape, *, hardware: str | None = None, **kwargs):
        """:func:`pytest_oam.perf.measure` on the test's hardware; not kept for the gate."""
        from .properties.perf import measure

        return measure(op_type, shape, hardware=self._hardware(hardware), **kwargs)

    def assert_efficiency(self, op_type: str, shape, at_least: float, *, hardware: str | None = None, **kwargs):
        """:func:`pytest_oam.perf.assert_efficiency` on the test's hardware."""
        from .properties.perf import assert_efficiency

        return assert_efficiency(op_type, shape, at_least, hardware=self._hardware(hardware), **kwargs)

    def assert_no_cliff(self, op_type: str, shape, *, hardware: str | None = None, **kwargs) -> None:
        """:func:`pytest_oam.perf.assert_no_cliff` on the test's hardware."""
        from .properties.perf import assert_no_cliff

        assert_no_cliff(op_type, shape, hardware=self._hardware(hardware), **kwargs)

    def assert_near_best(self, op_type: str, shape, *, hardware: str | None = None, **kwargs):
        """:func:`pytest_oam.perf.assert_near_best` on the test's hardware."""
        from .properties.perf import assert_near_best

        return assert_near_best(op_type, shape, hardware=self._hardware(hardware), **kwargs)

    def assert_near_tuned(self, op_type: str, *, limit: str | float = "5%", profile: Profile | None = None,
                          knowledge_base: str | os.PathLike | None = None, config: dict | None = None):
        """:func:`pytest_oam.knowledge_base.assert_near_tuned` on ``profile`` (default: the last
        profile this test ran): each call of ``op_type`` (an op type or an ``fnmatch`` glob,
        ``FlashAttention*``) takes at most ``limit`` more time than
        the tuned optimum recorded for its shapes, dtype, hardware and simulator version.
        ``knowledge_base`` defaults to the ``oam_knowledge_base`` ini key (relative to the ini
        file; default ``tuned/knowledge_base.json``). Returns the records used.

        Raises:
            TunedGateFailure: slower than the limit, or no current record (stale ones named).
            KnowledgeBaseError: a corrupt or other-version knowledge base file.
            ValueError: no profile yet, no ``op_type`` call, or a bad ``limit``.
        """
        __tracebackhide__ = True
        from .tuning.knowledge_base import assert_near_tuned

        if profile is None:
            if not self.profiles:
                raise ValueError("assert_near_tuned: run a workload with oam_profile.run first, or pass profile=")
            profile = self.profiles[-1]
        if knowledge_base is None:
            ini_dir = self._config.inipath.parent if self._config.inipath else self._config.rootpath
            knowledge_base = ini_dir / self._config.getini("oam_knowledge_base")
        return assert_near_tuned(profile, op_type, knowledge_base, limit=limit, config=config)


"""The stateful side of the plugin: settings, the per-test profiler, the gate and its reports.

Data flow: the ``oam_profile`` fixture runs workloads (on an xdist worker or in-process) ->
the ``pytest_runtest_makereport`` hook compares the profiles with the baseline and attaches
the result, as builtin types, to the test report (``report.oam_gate``) -> the controller's
``pytest_runtest_logreport`` collects results and writes baselines -> terminal summary and the
JSON report at the end. Only the controller writes files.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .evaluate import GateInputs, gate_fails
from .thresholds import MEMORY_ROWS, STEP_ROW, ThresholdError, parse_entry, parse_mapping

if TYPE_CHECKING:
    from simulator.profile import Profile

    from .baseline import BaselineFile

_PROFILER_KEY = pytest.StashKey["OamProfiler"]()
MARKER_KEYWORDS = ("thresholds", "hardware", "devices", "tuned")
REPORT_FORMATS = (".json", ".md", ".html")


@dataclass(frozen=True)
class OamSettings:
    """Options resolved from the command line and the ini file."""

    baseline_dir: Path | None  # gate mode when set
    save_dir: Path | None  # --oam-save-baseline when set
    cli_thresholds: dict[str, float]
    ini_thresholds: dict[str, float]
    hardware: str
    report_paths: tuple[Path, ...]
    strict: bool = False
    fail_on_improvement: bool = False
    prune: bool = False
    disabled_rules: tuple[str, ...] = ()
    rule_thresholds: dict[str, dict[str, float]] = field(default_factory=dict)
    rules: dict[str, Any] = field(default_factory=dict)
    collect: str = "auto"
    record: str = "failed"
    record_dir: Path | None = None
    #: Tuned-optimum limits (op type or glob -> fraction) from --oam-tuned-limit and the ini.
    cli_tuned_limits: dict[str, float] = field(default_factory=dict)
    ini_tuned_limits: dict[str, float] = field(default_factory=dict)
    knowledge_base: Path | None = None

    def collection(self) -> str:
        """The collection mode of a profiled run. ``auto`` is offline when runs are compared with
        or saved as baselines (their timing must not be perturbed); otherwise (a diagnosis run)
        online when an op callback is registered to watch the run live, else offline."""
        if self.collect != "auto":
            return self.collect
        if self.baseline_dir is not None or self.save_dir is not None:
            return "offline"
        from simulator.callbacks import has_callbacks

        return "online" if has_callbacks() else "offline"

    def fails(self, status: str, compared_nothing: bool = False) -> bool:
        """Does a test with this gate status fail?"""
        return gate_fails(status, compared_nothing, self.strict, self.fail_on_improvement)


def _usage(message: str) -> pytest.UsageError:
    return pytest.UsageError(message)


def simulator_clash() -> str | None:
    """Why ``import simulator`` would not give pytest-oam's simulator, or ``None``.

    pytest-oam ships its simulator as the top-level package ``simulator``; a module of the same
    name in the user's project (a ``simulator.py`` beside the tests, already imported or first on
    ``sys.path``) hides it. Checked without importing anything.
    """
    import importlib.util
    import sys

    ours = Path(__file__).resolve().parent.parent / "simulator"
    module = sys.modules.get("simulator")
    if module is not None:
        places = [getattr(module, "__file__", None) or "", *getattr(module, "__path__", ())]
    else:
        try:
            spec = importlib.util.find_spec("simulator")
        except (ImportError, ValueError):
            spec = None
        places = [] if spec is None else [spec.origin or "", *(spec.submodule_search_locations or ())]
    found = next((p for p in places if p), None)
    if found is None and module is None:
        return "pytest-oam's simulator package cannot be found: reinstall pytest-oam"
    if found is not None and (Path(found).resolve() == ours or ours in Path(found).resolve().parents):
        return None
    return (f"another module named 'simulator' ({found or module!r}) hides pytest-oam's simulator package "
            f"({ours}); rename your module (or the folder that puts it first on sys.path) to use oam_profile")


def check_simulator_module() -> None:
    """Fail the calling test, with the reason, when another ``simulator`` module hides ours."""
    __tracebackhide__ = True
    problem = simulator_clash()
    if problem is not None:
        pytest.fail(f"oam: {problem}", pytrace=False)


def _check_hardware(name: str, where: str) -> None:
    from simulator.hardware import list_hardware

    known = list_hardware()
    if name not in known:
        raise _usage(f"{where}: unknown hardware {name!r}; known: {', '.join(known)}")


def _check_devices(devices: int, hardware: str, where: str) -> None:
    from simulator.hardware import load_hardware

    try:
        load_hardware(hardware).interconnect.check_device_count(devices, hardware)
    except ValueError as exc:
        raise _usage(f"{where}: {exc}") from None


def _check_matplotlib() -> None:
    """An HTML report draws its plots with matplotlib: refuse it at start when it is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise _usage("--oam-report: an .html report draws its plots with matplotlib, which is not installed; "
                     "install it with pip install 'pytest-oam[plot]'")


def _parse_entries(entries: list[str], where: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for entry in entries:
        if not entry.strip():
            continue
        try:
            op, limit = parse_entry(entry)
        except ThresholdError as exc:
            raise _usage(f"{where}: {exc}") from None
        out[op] = limit
    return out


def _test_files(folder: Path, depth: int = 3, limit: int = 3) -> list[str]:
    """Names of up to ``limit`` test modules or conftest files in ``folder`` and its
    subfolders, ``depth`` levels down."""
    found: list[str] = []
    for root, dirs, names in os.walk(folder):
        level = len(Path(root).relative_to(folder).parts)
        if level >= depth:
            dirs.clear()
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += sorted(str(Path(root, n).relative_to(folder)) for n in names if n == "conftest.py"
                        or (n.endswith(".py") and (n.startswith("test_") or n[:-3].endswith("_test"))))
        if len(found) >= limit:
            break
    return found[:limit]


def _ini_bool(config: pytest.Config, key: str) -> bool:
    """A boolean ini key; a value pytest cannot read as one is an error naming the key."""
    try:
        return bool(config.getini(key))
    except (ValueError, pytest.UsageError) as exc:  # pytest 9.2 raises UsageError, earlier ValueError
        raise _usage(f"{key} (ini): {exc}; use true or false") from None


def _check_baseline_dir(folder: Path, must_exist: bool, source: str = "--oam-baseline") -> None:
    """Refuse a baseline folder that cannot be one: a file, a test folder, or (when only
    gating) a folder that does not exist, where every test would silently have no baseline.
    ``source`` names where the folder came from in messages."""
    if folder.exists() and not folder.is_dir():
        raise _usage(f"{source}: {folder} is a file, not a baseline folder")
    if folder.is_dir():
        tests = _test_files(folder)
        if tests:
            raise _usage(
                f"{source}: {folder} holds tests ({', '.join(sorted(tests)[:3])}), not baselines; "
                + ("write --oam-baseline=DIR, or put the option after the test paths" if source == "--oam-baseline"
                   else "name a folder of baselines")
            )
    elif must_exist:
        raise _usage(
            f"{source}: baseline folder {folder} does not exist; "
            "create baselines with --oam-save-baseline first"
        )


def report_overwrite_problem(path: Path) -> str | None:
    """Why ``--oam-report`` must not write ``path``, or ``None``: a report replaces only a report
    of ours (or an empty file); any other existing file (a baseline, a knowledge base, a page of
    the user's) is never overwritten."""
    import json

    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        return f"{path} exists and is not a regular file"
    try:
        with path.open("rb") as fh:
            head = fh.read(1 << 16)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc}) to check that it is a report of ours"
    if not head.strip():
        return None
    suffix = path.suffix.lower()
    text = head.decode("utf-8", errors="replace")
    if suffix == ".md":
        ours = text.startswith("## oam performance gate")
    elif suffix == ".html":
        ours = text.lstrip().startswith("<!DOCTYPE html>") and "<title>oam performance gate" in text
    else:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        ours = isinstance(data, dict) and {"pytest_oam_version", "tests", "status_counts"} <= set(data)
        if not ours and isinstance(data, dict) and {"runs", "nodeid"} <= set(data):
            return f"{path} is a baseline file; it is not overwritten by a report"
    if ours:
        return None
    return (f"{path} exists and is not a pytest-oam report; a report never replaces another file: "
            "give another path, or delete the file first")


def settings_from_config(config: pytest.Config) -> OamSettings:
    """Resolve and validate the plugin's options.

    Raises:
        pytest.UsageError: an unknown hardware name, a malformed threshold, or a baseline
            folder argument that looks like a test path.
    """
    opt = config.option
    ini_dir = config.inipath.parent if config.inipath else config.rootpath
    ini_baseline = Path(config.getini("oam_baseline_dir") or "baselines")
    default_dir = ini_baseline if ini_baseline.is_absolute() else ini_dir / ini_baseline
    baseline_dir = None
    if any(arg == "--oam-baseline=" for arg in config.invocation_params.args):
        raise _usage("--oam-baseline=: the folder is empty; give a folder, or --oam-baseline alone for the ini default")
    if opt.oam_baseline is not None:
        value = opt.oam_baseline
        if value == "":
            baseline_dir = default_dir
        else:
            if value.endswith(".py") or "::" in value:
                raise _usage(
                    f"--oam-baseline: {value!r} looks like a test path, not a baseline folder; "
                    f"write --oam-baseline=DIR, or put the option after the test paths"
                )
            baseline_dir = Path(config.invocation_params.dir, value)
    save_dir = (baseline_dir or default_dir) if opt.oam_save_baseline else None
    named_on_command_line = opt.oam_baseline not in (None, "")
    # the ini key (or -o oam_baseline_dir=...) names another folder than the default
    from_ini = not named_on_command_line and (config.getini("oam_baseline_dir") or "baselines") != "baselines"
    for folder in {baseline_dir, save_dir} - {None}:
        # A folder named on the command line or in the oam_baseline_dir ini key must exist when
        # only gating (a typo would otherwise turn every test into a green no-baseline); the
        # default "baselines" may not exist yet, and each test then reports no-baseline.
        _check_baseline_dir(folder, must_exist=(named_on_command_line or from_ini) and save_dir is None,
                            source="--oam-baseline" if named_on_command_line else "oam_baseline_dir (ini or -o)")
    cli = _parse_entries(opt.oam_threshold or [], "--oam-threshold")
    ini = _parse_entries(config.getini("oam_thresholds"), "oam_thresholds (ini)")
    if opt.oam_hardware is not None:
        hardware = opt.oam_hardware
        _check_hardware(hardware, "--oam-hardware")
    else:
        hardware = config.getini("oam_hardware") or "ascend910"
        if hardware != "ascend910":
            _check_hardware(hardware, "oam_hardware (ini)")
    reports = tuple(Path(config.invocation_params.dir, p) for p in opt.oam_report or [])
    for report in reports:
        if report.is_dir():
            raise _usage(f"--oam-report: {report} is a folder; give a file path such as oam.json")
        if report.suffix.lower() not in REPORT_FORMATS:
            raise _usage(f"--oam-report: {report} must end in {' or '.join(REPORT_FORMATS)}")
    if any(r.suffix.lower() == ".html" for r in reports):
        _check_matplotlib()
    for report in reports:
        for folder in {baseline_dir, save_dir, default_dir} - {None}:
            if folder.resolve() in report.resolve().parents:
                raise _usage(f"--oam-report: {report} is inside the baseline folder {folder}; write reports "
                             "elsewhere (a report there would replace a baseline or be taken for one)")
        problem = report_overwrite_problem(report)
        if problem is not None:
            raise _usage(f"--oam-report: {problem}")
    prune = bool(opt.oam_prune)
    if prune and save_dir is None:
        raise _usage("--oam-prune: deletes stale baselines only together with --oam-save-baseline")
    rules, disabled, rule_thresholds = _rule_settings(config)
    collect = opt.oam_collect or config.getini("oam_collect") or "auto"
    if collect not in ("auto", "offline", "online"):
        raise _usage(f"oam_collect (ini): {collect!r} is not one of auto, offline, online")
    record = opt.oam_record or config.getini("oam_record") or "failed"
    if record not in ("failed", "all", "none"):
        raise _usage(f"oam_record (ini): {record!r} is not one of failed, all, none")
    if opt.oam_record_dir is not None:
        record_dir = Path(config.invocation_params.dir, opt.oam_record_dir)
    else:
        ini_record = Path(config.getini("oam_record_dir") or ".oam/records")
        record_dir = ini_record if ini_record.is_absolute() else ini_dir / ini_record
    if record_dir.exists() and not record_dir.is_dir():
        raise _usage(f"--oam-record-dir: {record_dir} exists and is not a folder")
    cli_tuned = _parse_entries(opt.oam_tuned_limit or [], "--oam-tuned-limit")
    ini_tuned = _parse_entries(config.getini("oam_tuned_limits"), "oam_tuned_limits (ini)")
    knowledge_base = Path(config.getini("oam_knowledge_base") or "tuned/knowledge_base.json")
    knowledge_base = knowledge_base if knowledge_base.is_absolute() else ini_dir / knowledge_base
    if cli_tuned or ini_tuned:
        _check_knowledge_base(knowledge_base, "--oam-tuned-limit" if cli_tuned else "oam_tuned_limits (ini)")
    return OamSettings(
        baseline_dir, save_dir, cli, ini, hardware, reports,
        strict=bool(opt.oam_strict or _ini_bool(config, "oam_strict")),
        fail_on_improvement=bool(opt.oam_fail_on_improvement or _ini_bool(config, "oam_fail_on_improvement")),
        prune=prune, disabled_rules=disabled, rule_thresholds=rule_thresholds, rules=rules,
        collect=collect, record=record, record_dir=record_dir,
        cli_tuned_limits=cli_tuned, ini_tuned_limits=ini_tuned, knowledge_base=knowledge_base,
    )


def _load_knowledge_base(path: Path):
    """The knowledge base of the tuned check.

    Raises:
        KnowledgeBaseError: the file does not exist (a typo in ``oam_knowledge_base`` must not
            turn every tuned check into a skipped one), is corrupt or of another schema version.
    """
    from .knowledge_base import KnowledgeBase, KnowledgeBaseError

    if not path.is_file():
        raise KnowledgeBaseError(path, "does not exist (the oam_knowledge_base ini key names it; write one with "
                                       "'oam tune JOB --save PATH')")
    return KnowledgeBase.load(path, missing_ok=False)


def _check_knowledge_base(path: Path, where: str) -> None:
    """A tuned-limit option needs a knowledge base that exists and reads (checked at start, so
    a typo in ``oam_knowledge_base`` is not a green run of skipped checks)."""
    from .knowledge_base import KnowledgeBaseError

    try:
        _load_knowledge_base(path)
    except KnowledgeBaseError as exc:
        raise _usage(f"{where}: {exc}") from None


def _rule_settings(config: pytest.Config) -> tuple[dict, tuple[str, ...], dict[str, dict[str, float]]]:
    """The session's diagnosis rules (built-ins plus ``pytest_oam_register_rules``), the ones
    switched off, and threshold overrides; checked now so a typo is a usage error."""
    from .rules import RULES, check_rules, parse_rule_thresholds

    rules = dict(RULES)
    config.hook.pytest_oam_register_rules(rules=rules)
    try:
        check_rules(rules)
    except ValueError as exc:
        raise _usage(f"pytest_oam_register_rules: {exc}") from None
    disabled = tuple(config.getini("oam_disable_rules"))
    try:
        thresholds = parse_rule_thresholds(config.getini("oam_rule_thresholds"))
    except ValueError as exc:
        raise _usage(str(exc)) from None
    unknown = sorted((set(disabled) | set(thresholds)) - set(rules))
    if unknown:
        raise _usage(f"oam_disable_rules / oam_rule_thresholds: unknown diagnosis rule "
                     f"{', '.join(map(repr, unknown))}; known: {', '.join(sorted(rules))}")
    for rule_id, values in thresholds.items():
        bad = sorted(set(values) - set(rules[rule_id].thresholds))
        if bad:
            raise _usage(f"oam_rule_thresholds: rule {rule_id!r} has no threshold {', '.join(map(repr, bad))}; "
                         f"its thresholds: {', '.join(sorted(rules[rule_id].thresholds)) or 'none'}")
    return rules, disabled, thresholds


@dataclass(frozen=True)
class MarkerSettings:
    thresholds: dict[str, float]
    hardware: str | None
    devices: int | None
    #: ``tuned={"FlashAttention": "5%"}``: op type or glob -> fraction slower than the tuned optimum allowed.
    tuned: dict[str, float] = field(default_factory=dict)


def marker_settings(item: pytest.Item) -> MarkerSettings:
    """Settings of every ``@pytest.mark.oam`` of ``item``, merged.

    Markers of the module, the class and the function (and stacked markers) all apply; where
    two set the same key, the closer one wins, and ``thresholds`` and ``tuned`` merge pattern by
    pattern.

    Raises:
        pytest.UsageError: positional arguments, an unknown keyword, bad thresholds or tuned
            limits, an unknown hardware name, or a non-positive device count; the message
            names the test.
    """
    thresholds: dict[str, float] = {}
    tuned: dict[str, float] = {}
    hardware = devices = None
    where = f"{item.nodeid}: @pytest.mark.oam"
    for marker in reversed(list(item.iter_markers("oam"))):  # farthest first, closest last
        if marker.args:
            raise _usage(f"{where}: takes keywords only ({', '.join(MARKER_KEYWORDS)}), got {marker.args!r}")
        unknown = sorted(set(marker.kwargs) - set(MARKER_KEYWORDS))
        if unknown:
            raise _usage(f"{where}: unknown keyword {unknown[0]!r}; known: {', '.join(MARKER_KEYWORDS)}")
        try:
            thresholds.update(parse_mapping(marker.kwargs.get("thresholds") or {}))
            if "tuned" in marker.kwargs:
                tuned.update(parse_mapping(marker.kwargs["tuned"], "tuned"))
        except ThresholdError as exc:
            raise _usage(f"{where}: {exc}") from None
        if marker.kwargs.get("hardware") is not None:
            hardware = marker.kwargs["hardware"]
            if not isinstance(hardware, str):
                raise _usage(f"{where}: hardware must be a name, got {hardware!r}")
            _check_hardware(hardware, where)
        if marker.kwargs.get("devices") is not None:
            devices = marker.kwargs["devices"]
            if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
                raise _usage(f"{where}: devices must be a positive integer, got {devices!r}")
    return MarkerSettings(thresholds, hardware, devices, tuned)


def match_runs(baseline_runs: list, fingerprints: list[str], work: list[dict] | None = None) -> list[int | None]:
    """Pair each current run with a baseline run: same workload fingerprint first (in order);
    then each remaining run with the remaining baseline run whose work is closest (``work``: per
    current run, its summary's ``ops``, compared with the baseline run's), in order, or by
    position without ``work``. Work, not time: the run that does the same work is
    the one to compare with, and pairing by time would pair a slowed run with a slower one
    (newcomer finding: a changed run was compared with the first spare baseline run, a 4x larger
    workload, and a 3x slowdown passed). Returns, per current run, a baseline index or None."""
    used: set[int] = set()
    matched: list[int | None] = [None] * len(fingerprints)
    for i, fp in enumerate(fingerprints):
        for j, run in enumerate(baseline_runs):
            if j not in used and run.workload_fingerprint == fp:
                matched[i] = j
                used.add(j)
                break
    spare = [j for j in range(len(baseline_runs)) if j not in used]
    for i in range(len(fingerprints)):
        if matched[i] is None and spare:
            if work is not None:
                spare.sort(key=lambda j: (_work_distance(work[i], baseline_runs[j].ops), j))
            matched[i] = spare.pop(0)
    return matched


def _work_distance(current_ops: dict, baseline_ops: dict) -> float:
    """How unlike two runs' work is: the sum over op types of |log| of the ratios of their FLOP
    and of their HBM bytes per step in which the op ran (``OpStats``; +1, so that an op type one
    run lacks counts by its size; bytes tell apart the ops that do no FLOP: copies, collectives)."""
    total = 0.0
    for op in set(current_ops) | set(baseline_ops):
        now, was = current_ops.get(op), baseline_ops.get(op)
        for name in ("flop", "hbm_bytes"):
            total += abs(math.log((getattr(now, name, 0.0) + 1.0) / (getattr(was, name, 0.0) + 1.0)))
    return total


def _arguments_repr(args: tuple, kwargs: dict[str, Any], limit: int = 2000) -> str:
    """The workload's arguments as text, for a record (shortened past ``limit`` characters)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items() if k not in ("memory", "allocator")]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit] + "..."


def _line(tr, text: str, **markup: bool) -> None:
    """Write one summary line: test ids, op names and messages come from data files (baselines,
    real profiler output), so control characters and line breaks are taken out of it (an ANSI
    escape in an op name must not print a fake green line)."""
    from .report import terminal_safe

    tr.write_line(terminal_safe(text), **markup)


def _test_of(nodeid: str) -> str:
    """A test id without its parameters: ``f.py::C::test_x[1-a]`` -> ``f.py::C::test_x``."""
    head, sep, _ = nodeid.partition("[")
    return head if sep else nodeid


def _outcome_reason(report: pytest.TestReport) -> str:
    """The reason a test gave for its skip or xfail, or the last line of its error (one line)."""
    if hasattr(report, "wasxfail") and report.wasxfail:
        reason = report.wasxfail
    elif report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        reason = str(report.longrepr[2])
    else:
        reason = getattr(report.longrepr, "reprcrash", None)
        reason = reason.message if reason is not None else ""
    reason = reason.removeprefix("Skipped: ").removeprefix("reason: ").strip()
    return reason.splitlines()[0] if reason else ""


def _first(*values):
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

        hardware = _first(hardware, self._marker.hardware, self._settings.hardware)
        devices = _first(devices, self._marker.devices, 1)
        collection = kwargs.pop("collection", None) or self._settings.collection()
        profile = simulator.run(
            workload, *args, steps=steps, hardware=hardware, devices=devices, op_time_scale=op_time_scale,
            collection=collection, **kwargs,
        )
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
        return profile

    # -- performance properties over shapes (pytest_oam.perf); nothing here is gated ----------

    def _hardware(self, hardware: str | None) -> str:
        return _first(hardware, self._marker.hardware, self._settings.hardware)

    def measure(self, op_type: str, shape, *, hardware: str | None = None, **kwargs):
        """:func:`pytest_oam.perf.measure` on the test's hardware; not kept for the gate."""
        from .perf import measure

        return measure(op_type, shape, hardware=self._hardware(hardware), **kwargs)

    def assert_efficiency(self, op_type: str, shape, at_least: float, *, hardware: str | None = None, **kwargs):
        """:func:`pytest_oam.perf.assert_efficiency` on the test's hardware."""
        from .perf import assert_efficiency

        return assert_efficiency(op_type, shape, at_least, hardware=self._hardware(hardware), **kwargs)

    def assert_no_cliff(self, op_type: str, shape, *, hardware: str | None = None, **kwargs) -> None:
        """:func:`pytest_oam.perf.assert_no_cliff` on the test's hardware."""
        from .perf import assert_no_cliff

        assert_no_cliff(op_type, shape, hardware=self._hardware(hardware), **kwargs)

    def assert_near_best(self, op_type: str, shape, *, hardware: str | None = None, **kwargs):
        """:func:`pytest_oam.perf.assert_near_best` on the test's hardware."""
        from .perf import assert_near_best

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
        from .knowledge_base import assert_near_tuned

        if profile is None:
            if not self.profiles:
                raise ValueError("assert_near_tuned: run a workload with oam_profile.run first, or pass profile=")
            profile = self.profiles[-1]
        if knowledge_base is None:
            ini_dir = self._config.inipath.parent if self._config.inipath else self._config.rootpath
            knowledge_base = ini_dir / self._config.getini("oam_knowledge_base")
        return assert_near_tuned(profile, op_type, knowledge_base, limit=limit, config=config)


class OamSession:
    """Registered once per pytest run as a plugin; holds the gate's state."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._settings: OamSettings | None = None
        self.is_worker = hasattr(config, "workerinput")
        self.bad_markers: dict[str, str] = {}  # nodeid -> message, on an xdist worker
        self.results: dict[str, dict[str, Any]] = {}
        self.written: list[str] = []
        self.op_types_seen: set[str] = set()
        self.report_errors: dict[Path, str] = {}
        self.pruned: list[str] = []
        self.unused_baselines: list[str] = []  # gate mode, full run: files no collected test reads
        self.collected: set[str] = set()
        self.order: dict[str, int] = {}  # test id -> collection position, for reports in test order
        self.pending_saves: dict[str, dict[str, Any]] = {}
        self.partial: set[str] = set()
        self.prune_refused: str | None = None
        self.save_errors: list[str] = []
        self.recorded: list[str] = []
        #: Per test id, the per-step series of its runs (for an HTML report), sent like the gate.
        self.series: dict[str, list[dict[str, Any]]] = {}
        self._kb = None  # the knowledge base of the tuned check, read when first needed
        #: Per test id, tuned checks skipped for want of a record (shown in the summary).
        self.tuned_notes: dict[str, list[str]] = {}
        #: Per test id, what its record needs until the tuned check has run (--oam-record).
        self._pending_records: dict[str, tuple] = {}
        #: --oam-prune: baselines of uncollected tests that are not provably gone, kept.
        self.prune_kept: list[str] = []

    @property
    def settings(self) -> OamSettings:
        """The options, resolved when first needed (at start when an ``--oam-*`` option is given).

        Raises:
            pytest.UsageError: see :func:`settings_from_config`; or another ``simulator`` module
                hides pytest-oam's.
        """
        if self._settings is None:
            problem = simulator_clash()
            if problem is not None:
                raise _usage(problem)
            self._settings = settings_from_config(self.config)
        return self._settings

    @property
    def wants_series(self) -> bool:
        return any(p.suffix.lower() == ".html" for p in self.settings.report_paths)

    # -- collection: validate markers before any test runs --------------------------------------

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.note_collected(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, ids: list[str]) -> None:
        self.note_collected(ids)

    def note_collected(self, ids) -> None:
        ids = list(ids)
        self.collected.update(ids)
        self._note_order(ids)

    def _note_order(self, ids) -> None:
        for nodeid in ids:
            self.order.setdefault(nodeid, len(self.order))

    def _tests_in_order(self) -> list:
        """The gated tests' reports in collection order (xdist finishes them in any order)."""
        from .report import GateReport

        ordered = sorted(self.results.items(), key=lambda kv: self.order.get(kv[0], len(self.order)))
        return [GateReport.model_validate(r) for _, r in ordered]

    def _note_partial(self, reason: str) -> None:
        """Remember why this run may not see every test (for --oam-prune); workers pass it on."""
        self.partial.add(reason)
        if self.is_worker:
            self.config.workeroutput["oam_partial"] = sorted(self.partial)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        if items:
            self._note_partial("deselected tests")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._note_partial("collection errors")
        elif report.skipped:
            self._note_partial("a module skipped at collection")

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        self.partial.update(getattr(node, "workeroutput", {}).get("oam_partial", ()))
        if error:
            self.partial.add("a worker crashed")

    @pytest.hookimpl(trylast=True)  # after -k and -m deselected tests: their markers do not matter
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # Every bad marker of the selected tests at once, not the first one per run. An xdist
        # worker cannot end the session with a usage error (the controller would report a
        # crashed worker), so there each bad test errors at setup with the same message; the
        # other tests run, and the run fails.
        if self.unusable():
            return  # each test that uses the fixture errors with the reason
        self.settings  # noqa: B018 - a bad ini value is a usage error before any test
        errors = {}
        for item in items:
            if item.get_closest_marker("oam") is not None:
                try:
                    marker = marker_settings(item)
                    if marker.devices is not None:  # a count HCCL does not support on that hardware's servers
                        _check_devices(marker.devices, marker.hardware or self.settings.hardware,
                                       f"{item.nodeid}: @pytest.mark.oam")
                except pytest.UsageError as exc:
                    errors[item.nodeid] = str(exc)
        if self.is_worker:
            self.bad_markers = errors
        elif len(errors) == 1:
            raise pytest.UsageError(next(iter(errors.values())))
        elif errors:
            raise pytest.UsageError(f"{len(errors)} bad @pytest.mark.oam markers:\n" + "\n".join(errors.values()))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.nodeid in self.bad_markers:
            pytest.fail(self.bad_markers[item.nodeid], pytrace=False)

    # -- the fixture ----------------------------------------------------------------------------

    def baseline_path(self, nodeid: str, folder: Path) -> Path:
        from .baseline import baseline_filename

        return folder / baseline_filename(nodeid)

    def profiler_for(self, item: pytest.Item) -> OamProfiler:
        """Make the test's profiler, reading its baseline first (as it was before this run).

        Raises:
            BaselineError: in gate mode without ``--oam-save-baseline``, the test's baseline
                file exists but cannot be used (the test errors, naming the file).
        """
        from .baseline import BaselineError, baseline_state, load_baseline

        baseline = path = error = None
        if self.settings.baseline_dir is not None:
            path = self.baseline_path(item.nodeid, self.settings.baseline_dir)
            try:  # a dangling symlink, a FIFO, a folder: named, never opened (a FIFO would hang)
                present = baseline_state(path) == "present"
            except BaselineError as exc:
                if self.settings.save_dir is None:
                    raise
                present, error = False, str(exc)
            if present:
                try:
                    baseline = load_baseline(path, item.nodeid)
                except BaselineError as exc:
                    if self.settings.save_dir is None:
                        raise
                    error = str(exc)  # the user asked to rewrite it; reported, then replaced
        profiler = OamProfiler(item, self.settings, marker_settings(item), baseline, path)
        profiler.baseline_error = error
        item.stash[_PROFILER_KEY] = profiler
        return profiler

    # -- the gate -------------------------------------------------------------------------------

    def gate_inputs(self, item: pytest.Item, profiler: OamProfiler) -> GateInputs:
        """The test's gate settings, as :func:`pytest_oam.evaluate.evaluate_gate` takes them."""
        return GateInputs(
            nodeid=item.nodeid,
            gating=self.settings.baseline_dir is not None,
            saving=self.settings.save_dir is not None,
            marker_thresholds=marker_settings(item).thresholds,
            cli_thresholds=self.settings.cli_thresholds,
            ini_thresholds=self.settings.ini_thresholds,
            strict=self.settings.strict,
            fail_on_improvement=self.settings.fail_on_improvement,
            disabled_rules=self.settings.disabled_rules,
            rule_thresholds=self.settings.rule_thresholds,
            baseline_path=self._display(profiler.baseline_path) if profiler.baseline_path else None,
            baseline_error=profiler.baseline_error,
            invocation_dir=str(self.config.invocation_params.dir),
            root_dir=str(self.config.rootpath),
        )

    def _evaluate(
        self, item: pytest.Item, profiler: OamProfiler, test_passed: bool = True
    ) -> tuple[dict[str, Any], str | None]:
        """Compare the test's profiled runs with its baseline: (gate result, failure text)."""
        from .evaluate import evaluate_gate

        return evaluate_gate(self.gate_inputs(item, profiler), profiler.profiles, profiler.baseline,
                             rules=self.settings.rules, test_passed=test_passed)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if self.unusable():
            return report
        report = self._gate_report(item, call, report)
        if report.when == "call":
            self._tuned_check(item, report)
            pending = self._pending_records.pop(item.nodeid, None)
            mode = self.settings.record
            if pending is not None and (mode == "all" or (mode == "failed" and report.failed)):
                self._record(item, *pending)  # after the tuned check, which can fail the test too
        return report

    def _gate_report(self, item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> pytest.TestReport:
        """The baseline gate of the test's profiled runs, attached to (and maybe failing) ``report``."""
        if report.when == "setup" and call.excinfo is not None:
            from .baseline import BaselineError

            if isinstance(call.excinfo.value, BaselineError):
                exc = call.excinfo.value
                report.longrepr = f"oam: invalid baseline: {exc}"
                report.oam_gate = {"report": {"nodeid": item.nodeid, "status": "invalid-baseline",
                                              "baseline_path": exc.path, "message": str(exc)}}
            return report
        if report.when != "call":
            return report
        profiler = item.stash.get(_PROFILER_KEY, None)
        if profiler is None:
            return self._unprofiled_with_baseline(item, report)
        if not profiler.profiles and profiler.baseline is None:
            return report
        if not profiler.profiles and not report.passed:
            return self._ended_before_profiling(item, report, profiler.baseline_path)
        try:
            result, text = self._evaluate(item, profiler, report.passed)
        except Exception:  # noqa: BLE001 - never crash the session: fail this test with the traceback
            import traceback

            report.outcome = "failed"
            report.longrepr = "oam: internal error while gating this test:\n" + traceback.format_exc()
            return report
        result["test_passed"] = report.passed
        body_outcome = report.outcome
        if self.wants_series:
            from .html_report import series_from_profile

            result["series"] = [series_from_profile(p).model_dump(mode="json") for p in profiler.profiles]
        report.oam_gate = result
        for d in result["report"].get("diagnosis", []):  # JUnit XML <property> entries (read at teardown)
            item.user_properties.append(
                ("oam_finding", (f"{d['severity']} {d['rule_id']} {d['op_type']} at {d['location'] or '-'}: "
                                 f"{d['description']} (a fix saves about {d['gain_s'] * 1e3:.3f} ms per step, "
                                 f"{d['step_share_frac'] * 100:.1f}%; {d['fix']})")))
        for f in result["report"].get("findings", []):  # the explanation of a regression, same scale
            sites = ", ".join(site for site, _ in f["call_sites"]) or "-"
            cost = ("" if f["op_type"] in MEMORY_ROWS else  # memory rows have no time of their own
                    f": +{f['delta_s'] * 1e3:.3f} ms per step ({f['step_share_frac'] * 100:.1f}% of the baseline step)")
            item.user_properties.append(
                ("oam_finding", f"{f['severity']} {f['kind']} {f['op_type']} at {sites}{cost}; {'; '.join(f['advice'])}"))
        if text is not None:
            self._fail(report, text)
        if profiler.profiles and self.settings.record != "none":
            self._pending_records[item.nodeid] = (profiler, result, text, body_outcome)
        return report

    # -- the tuned check: is each call near the tuned optimum of the knowledge base? ---------------

    def _knowledge_base(self):
        """The knowledge base, read once per process (a worker reads its own copy).

        Raises:
            KnowledgeBaseError: see :func:`_load_knowledge_base`.
        """
        if self._kb is None:
            self._kb = _load_knowledge_base(self.settings.knowledge_base)
        return self._kb

    def _tuned_check(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """Judge each profiled call of an op type that has a tuned limit (marker ``tuned``, then
        ``--oam-tuned-limit``, then the ``oam_tuned_limits`` ini key) against the knowledge base.
        A call more than its limit slower than the tuned optimum fails the test; a call with no
        current record is noted in the summary and skipped, or fails with ``--oam-strict``. A
        marker pattern that matches no op type the test ran fails a passing test."""
        marker = marker_settings(item).tuned if item.get_closest_marker("oam") is not None else {}
        layers = tuple((name, limits) for name, limits in (
            ("marker", marker), ("command line", self.settings.cli_tuned_limits),
            ("ini", self.settings.ini_tuned_limits)) if limits)
        if not layers:
            return
        from .knowledge_base import KnowledgeBaseError, check_near_tuned
        from .thresholds import LimitResolver

        resolver = LimitResolver(layers)
        profiler = item.stash.get(_PROFILER_KEY, None)
        profiles = profiler.profiles if profiler is not None else []
        failures: list[str] = []
        notes: list[str] = []
        checked = 0
        op_types = sorted({op for profile in profiles for op in profile.op_types})
        unmatched = [pattern for pattern in marker if not any(fnmatchcase(op, pattern) for op in op_types)]
        if unmatched and report.passed:
            failures.append(f"@pytest.mark.oam(tuned=...): {', '.join(unmatched)} matches no op type of the test's "
                            f"profiled runs (op types: {', '.join(op_types) or 'none: no oam_profile.run'})")
        try:
            kb = self._knowledge_base() if profiles else None
        except KnowledgeBaseError as exc:
            failures.append(f"the knowledge base cannot be used: {exc}")
            kb = None
        for index, profile in enumerate(profiles if kb is not None else []):
            run = f"run {index + 1}: " if len(profiles) > 1 else ""
            for op_type in profile.op_types:
                try:
                    limit = resolver.resolve(op_type)
                except LookupError:
                    continue
                try:
                    checks = check_near_tuned(profile, op_type, kb, limit_frac=limit.frac,
                                              config_text=profiler.run_configs[index]["arguments"] or None)
                except ValueError as exc:  # an ambiguous record match
                    failures.append(f"{run}{exc}")
                    continue
                for check in checks:
                    if check.status == "slower":
                        failures.append(f"{run}{check.message}")
                    elif check.status == "no-record":
                        (failures if self.settings.strict else notes).append(f"{run}{check.message}")
                    checked += check.status != "no-record"
        report.oam_tuned = {"checked": checked, "failures": failures, "notes": notes}
        gate = getattr(report, "oam_gate", None)
        if gate is not None:  # the reports (JSON, Markdown, HTML) carry the tuned check too
            gate["report"]["tuned_failures"] = failures
            gate["report"]["tuned_notes"] = notes
        if not failures:
            return
        if gate is not None:
            gate["test_passed"] = False  # no baseline is saved from a run that failed its tuned check
            gate["report"]["failed"] = True
        self._fail(report, f"oam tuned check: FAILED {item.nodeid}\n" + "\n".join(failures))

    def _record(self, item: pytest.Item, profiler: OamProfiler, result: dict[str, Any], text: str | None,
                body_outcome: str) -> None:
        """Write the test's record (``--oam-record``); the path or the error goes to the controller."""
        from .record import RunConfig, make_record, record_filename, write_record

        path = self.settings.record_dir / record_filename(item.nodeid)
        try:
            record = make_record(
                nodeid=item.nodeid, test_outcome=body_outcome,
                gate_inputs=self.gate_inputs(item, profiler).to_dict(), rules=sorted(self.settings.rules),
                baseline=profiler.baseline,
                runs=[(RunConfig(**c), p) for c, p in zip(profiler.run_configs, profiler.profiles)],
                gate=result["report"], failure_text=text,
            )
            write_record(path, record)
        except (OSError, ValueError) as exc:
            result["record_error"] = f"--oam-record: {self._display(path)} not written: {exc}"
            return
        result["record"] = self._display(path)

    @staticmethod
    def _fail(report: pytest.TestReport, text: str) -> None:
        """Fail ``report`` for the gate. A test that passed, skipped itself or was an expected
        failure after profiling fails all the same; a test that failed keeps its own error."""
        if report.failed:
            report.sections.append(("oam performance gate", text))
            return
        if hasattr(report, "wasxfail"):
            del report.wasxfail
        report.outcome = "failed"
        report.longrepr = text

    def _ended_before_profiling(self, item: pytest.Item, report: pytest.TestReport,
                                path: Path | None) -> pytest.TestReport:
        """A test that skipped itself (``pytest.skip``, ``importorskip``, ``skipTest``), was an
        expected failure, or failed before any profiled run: its own outcome and reason stand, it
        is not gated, and its baseline is kept (nothing is saved over it)."""
        from .report import GateReport

        if hasattr(report, "wasxfail"):
            how = "was an expected failure (xfail)"
        elif report.skipped:
            how = "skipped itself"
        else:
            how = "failed"
        reason = _outcome_reason(report)
        message = (f"the test {how} before any profiled run" + (f" ({reason})" if reason else "") + ": not gated"
                   + ("; its baseline is kept" if path is not None and path.is_file() else ""))
        gate = GateReport(nodeid=item.nodeid, status="not-gated", failed=False,
                          baseline_path=self._display(path) if path is not None else None, message=message)
        report.oam_gate = {"report": gate.model_dump(mode="json"), "op_types": []}
        return report

    def _unprofiled_with_baseline(self, item: pytest.Item, report: pytest.TestReport) -> pytest.TestReport:
        """A gated test that has a baseline but no longer uses ``oam_profile``: nothing compared."""
        if self.settings.baseline_dir is None:
            return report
        path = self.baseline_path(item.nodeid, self.settings.baseline_dir)
        if not path.is_file():
            return report
        if not report.passed:  # it skipped, xfailed or failed on its own: that outcome stands
            return self._ended_before_profiling(item, report, path)
        from .report import GateReport

        message = "the test no longer uses the oam_profile fixture, but it has a baseline: nothing was compared"
        gate = GateReport(nodeid=item.nodeid, status="missing-ops", failed=True,
                          baseline_path=self._display(path), message=message)
        report.oam_gate = {"report": gate.model_dump(mode="json"), "op_types": []}
        self._fail(report, f"oam performance gate: MISSING-OPS {item.nodeid}\nbaseline: {self._display(path)}\n"
                           f"note: {message}; remove the baseline file or profile the test again")
        return report

    # -- controller side --------------------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker or self.unusable():
            return
        if report.when == "teardown" and report.nodeid in self.pending_saves:
            baseline = self.pending_saves.pop(report.nodeid)
            if report.passed:
                self._save(report.nodeid, baseline)
            else:
                self.save_errors.append(f"{report.nodeid}: baseline not written: the test errored in teardown")
            return
        tuned = getattr(report, "oam_tuned", None)
        if tuned is not None and tuned["notes"]:
            self.tuned_notes[report.nodeid] = tuned["notes"]
        gate = getattr(report, "oam_gate", None)
        if gate is None:
            return
        self.results[report.nodeid] = gate["report"]
        if gate.get("record"):
            self.recorded.append(gate["record"])
        if gate.get("record_error"):
            self.save_errors.append(gate["record_error"])
        if "series" in gate:
            self.series[report.nodeid] = gate["series"]
        self.op_types_seen.update(gate.get("op_types", ()))
        baseline = gate.get("baseline")
        if baseline is not None and gate.get("test_passed") and self.settings.save_dir is not None:
            self.pending_saves[report.nodeid] = baseline  # written once teardown passed too

    def _save(self, nodeid: str, data: dict[str, Any]) -> None:
        from .baseline import BaselineFile, save_baseline

        path = self.baseline_path(nodeid, self.settings.save_dir)
        try:
            save_baseline(path, BaselineFile.model_validate(data))
        except (OSError, ValueError) as exc:
            self.save_errors.append(f"{path}: not written: {exc}")
            return
        self.written.append(str(path))

    def _display(self, path: Path) -> str:
        """``path`` relative to the invocation folder when it lies inside it."""
        try:
            return str(Path(path).relative_to(self.config.invocation_params.dir))
        except ValueError:
            return str(path)

    def unusable(self) -> bool:
        """Another ``simulator`` module hides ours and the options were never resolved: the
        tests that used the fixture errored with the reason; nothing else to do."""
        return self._settings is None and simulator_clash() is not None

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.is_worker or self.unusable():
            return
        self._tuned_summary(terminalreporter)
        if not (self.results or self.pruned or self.prune_refused or self.prune_kept or self.settings.report_paths
                or self.save_errors or self.recorded or self.unused_baselines):
            return
        from .report import fmt_value, summary_table

        tests = self._tests_in_order()
        tr = terminalreporter
        tr.write_sep("=", "oam performance gate")
        if tests:
            tr.write_line(summary_table(tests))  # its cells are made safe
        for t in tests:
            if t.status == "regressed":
                worst = [v for v in t.verdicts if v.status == "regressed"]
                runs = " in run {}" if len(t.runs) > 1 else ""
                detail = ", ".join(
                    f"{v.op_type}{runs.format(v.run + 1)} "
                    # no percentage from a baseline of zero (alloc_retries): its two values
                    + (f"{fmt_value(v.baseline_s, v.unit)} -> {fmt_value(v.current_s, v.unit)} ({v.limit_source})"
                       if v.change_frac is None else
                       f"{v.change_frac * 100:+.1f}% (limit {v.limit_frac * 100:.1f}%)") for v in worst)
                _line(tr, f"REGRESSED {t.nodeid}: {detail}", red=True, bold=True)
            elif t.status not in ("pass", "not-gated") or t.message:
                color = {"red": True, "bold": True} if t.failed else {"yellow": True}
                prefix = f"FAILED ({t.status})" if t.failed else f"oam: {t.status}"
                _line(tr, f"{prefix} {t.nodeid}" + (f": {t.message}" if t.message else ""), **color)
                for run in t.runs:
                    for reason in run.reasons:
                        _line(tr, f"    {reason}", **color)
        diagnosed = [t for t in tests if t.diagnosis]
        if diagnosed:
            from .report import diagnosis_text

            tr.write_sep("-", "oam diagnosis")
            for t in diagnosed:
                _line(tr, t.nodeid)
                tr.write_line(diagnosis_text(t.diagnosis, indent="    "))  # so are its fields
        if self.written:
            folder = self.settings.save_dir
            noun = "baseline" if len(self.written) == 1 else "baselines"
            _line(tr, f"oam: wrote {len(self.written)} {noun} to {self._display(folder)}")
            if self.config.get_verbosity() > 0:
                for path in self.written:
                    _line(tr, f"    {path}")
        patterns = {**self.settings.ini_thresholds, **self.settings.cli_thresholds}
        unmatched = sorted(p for p in patterns if not any(fnmatchcase(o, p) for o in self.op_types_seen))
        if unmatched:
            _line(
                tr,
                "oam: thresholds match no op type of this run: " + ", ".join(unmatched)
                + " (op types are case-sensitive: " + ", ".join(sorted(self.op_types_seen)) + ")",
                yellow=True,
            )
        tuned = {**self.settings.ini_tuned_limits, **self.settings.cli_tuned_limits}
        operators = sorted(self.op_types_seen - {STEP_ROW, *MEMORY_ROWS})  # the gate's rows that are operators
        unmatched = sorted(p for p in tuned if not any(fnmatchcase(o, p) for o in operators))
        if unmatched and operators:
            _line(
                tr,
                "oam: tuned limits match no op type of this run, nothing was checked against them: "
                + ", ".join(unmatched) + " (op types are case-sensitive: " + ", ".join(operators) + ")",
                yellow=True,
            )
        if self.recorded:
            noun = "test" if len(self.recorded) == 1 else "tests"
            folder = self._display(self.settings.record_dir)
            _line(tr, f"oam: recorded {len(self.recorded)} {noun} in {folder} (replay: oam replay "
                          f"{self.recorded[0]})")
            if self.config.get_verbosity() > 0:
                for path in self.recorded[1:]:
                    _line(tr, f"    {path}")
        for err in self.save_errors:
            _line(tr, f"oam: {err}", red=True)
        for line in self.pruned:
            _line(tr, f"oam: pruned stale baseline {line}")
        if self.prune_refused:
            _line(tr, f"oam: {self.prune_refused}", yellow=True)
        if self.prune_kept:
            n = len(self.prune_kept)
            _line(tr, f"oam: --oam-prune kept {n} baseline {'file' if n == 1 else 'files'} of tests this run did "
                          "not collect but that may still exist (their file is there and was not collected, or "
                          "their test function still is: collect_ignore, a parameter of another machine?):",
                          yellow=True)
            for line in self.prune_kept:
                _line(tr, f"    {line}", yellow=True)
        if self.unused_baselines:
            n = len(self.unused_baselines)
            _line(tr, f"oam: {n} baseline {'file' if n == 1 else 'files'} of tests this run did not collect "
                          "(renamed, moved or deleted? --oam-save-baseline --oam-prune deletes them):", yellow=True)
            for line in self.unused_baselines:
                _line(tr, f"    {line}", yellow=True)
        folder = self.settings.baseline_dir
        if (folder is not None and self.settings.save_dir is None and not folder.is_dir()
                and any(t.status == "no-baseline" for t in tests)):
            # Newcomer finding: run from another folder, a project without an ini file looks for
            # ./baselines there; every test was a quiet no-baseline
            where = (f"relative to the ini file {self.config.inipath}" if self.config.inipath else
                     f"without an ini file, relative to the rootdir {self.config.rootpath}, which depends on where "
                     "pytest runs: a pytest.ini in the project fixes it")
            _line(tr, f"oam: no baseline folder {folder} ({where}): no test was compared; --oam-save-baseline "
                          "creates it", yellow=True)
        for path in self.settings.report_paths:
            if path not in self.report_errors:
                _line(tr, f"oam: wrote report {self._display(path)}")
        for error in self.report_errors.values():
            _line(tr, f"oam: {error}", red=True)

    def _tuned_summary(self, tr) -> None:
        """Tuned checks skipped for want of a record, in test order: visible, never silent."""
        if not self.tuned_notes:
            return
        tr.write_sep("-", "oam tuned check")
        for nodeid in sorted(self.tuned_notes, key=lambda n: self.order.get(n, len(self.order))):
            _line(tr, f"oam: tuned check skipped in {nodeid} (--oam-strict fails it):", yellow=True)
            for note in self.tuned_notes[nodeid]:
                _line(tr, f"    {note}", yellow=True)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.is_worker or self.unusable():
            return
        if self.settings.prune:
            self._prune(session)
        elif self.settings.baseline_dir is not None and self._prune_refusal(session) is None:
            # a full gating run: say which baselines no test read (a renamed or moved test
            # silently reports no-baseline otherwise)
            self.unused_baselines = [f"{self._display(path)} ({nodeid})"
                                     for path, nodeid in self._stale_baselines(self.settings.baseline_dir)[0]]
        for path in self.settings.report_paths:
            problem = report_overwrite_problem(path)  # made while the tests ran?
            if problem is not None:
                self.report_errors[path] = f"--oam-report: not written: {problem}"
                continue
            try:
                self._write_report(path)
            except (OSError, ValueError) as exc:
                self.report_errors[path] = f"--oam-report: {path} not written: {exc}"
        if (self.save_errors or self.report_errors) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _prune_refusal(self, session: pytest.Session) -> str | None:
        """Why this run may not prune (a partial run would delete baselines of unseen tests)."""
        opt = self.config.option
        reasons = [flag for flag, given in (
            ("-k", getattr(opt, "keyword", "")), ("-m", getattr(opt, "markexpr", "")),
            ("--lf", getattr(opt, "lf", False)), ("--deselect", getattr(opt, "deselect", None)),
            ("--ignore", getattr(opt, "ignore", None)), ("--ignore-glob", getattr(opt, "ignore_glob", None)),
            ("--collect-only", getattr(opt, "collectonly", False)),
        ) if given]
        if any("::" in str(arg) for arg in self.config.args):
            reasons.append("a test id on the command line")
        reasons += sorted(self.partial)
        if session.shouldfail or session.shouldstop:
            reasons.append("the run stopped early")
        if session.exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR):
            reasons.append("the run was interrupted")
        if not self.collected:
            reasons.append("no test was collected")
        return ", ".join(reasons) or None

    def _stale_baselines(self, folder: Path | None) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
        """Baselines in ``folder`` of tests in the collected paths that this run did not collect,
        with their test ids, as ``(gone, kept)``. Gone, provably: the test file no longer exists,
        or it was collected and no test of that name is in it (a parametrized test counts by its
        function: ids that exist only on some machines, ``test_x[gpu]``, are kept while ``test_x``
        is collected). Kept: everything else, such as a file a conftest's ``collect_ignore`` left
        out. Unreadable files are left out of both: not ours to judge."""
        from .baseline import BaselineError, load_baseline

        if folder is None or not folder.is_dir():
            return [], []
        scopes = [Path(self.config.invocation_params.dir, str(arg)).resolve() for arg in self.config.args]
        root = self.config.rootpath
        collected_files = {nodeid.split("::")[0] for nodeid in self.collected}
        collected_tests = {_test_of(nodeid) for nodeid in self.collected}
        gone, kept = [], []
        for path in sorted(folder.glob("*.json")):
            try:
                nodeid = load_baseline(path).nodeid
            except BaselineError:
                continue
            file_part = nodeid.split("::")[0]
            test_file = (root / file_part).resolve()
            in_scope = any(test_file == scope or scope in test_file.parents for scope in scopes)
            if not in_scope or nodeid in self.collected:
                continue
            if not test_file.exists() or (file_part in collected_files and _test_of(nodeid) not in collected_tests):
                gone.append((path, nodeid))
            else:
                kept.append((path, nodeid))
        return gone, kept

    def _prune(self, session: pytest.Session) -> None:
        """Delete baselines of tests that are provably gone (see :meth:`_stale_baselines`)."""
        refusal = self._prune_refusal(session)
        if refusal:
            self.prune_refused = f"--oam-prune: not a full run ({refusal}); nothing deleted"
            return
        gone, kept = self._stale_baselines(self.settings.save_dir)
        self.prune_kept = [f"{self._display(path)} ({nodeid})" for path, nodeid in kept]
        for path, nodeid in gone:
            try:
                path.unlink()
            except OSError as exc:
                self.save_errors.append(f"{self._display(path)}: not pruned: {exc}")
                continue
            self.pruned.append(f"{self._display(path)} ({nodeid})")

    def _write_report(self, path: Path) -> None:
        import pytest_oam

        from .fileio import atomic_write_text
        from .report import OamReport, dump_report, markdown_report

        tests = self._tests_in_order()
        counts: dict[str, int] = {}
        for t in tests:
            counts[t.status] = counts.get(t.status, 0) + 1
        report = OamReport(
            pytest_oam_version=pytest_oam.__version__,
            baseline_dir=str(self.settings.baseline_dir) if self.settings.baseline_dir else None,
            tests=tests,
            status_counts=counts,
        )
        if path.suffix.lower() == ".html":
            from .html_report import html_report, spike_factor_of

            factor = spike_factor_of(self.settings.rules, self.settings.rule_thresholds)
            text = html_report(report, self.series, spike_factor=factor)
        else:
            text = markdown_report(report) if path.suffix.lower() == ".md" else dump_report(report)
        atomic_write_text(path, text)

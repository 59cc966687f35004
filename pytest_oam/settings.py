"""The plugin's options: ``--oam-*`` options and ``oam_*`` ini keys resolved once into frozen
:class:`OamSettings`, and every usage error they can cause (each names the option or key)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .judge.thresholds import ThresholdError, parse_entry

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


def usage_error(message: str) -> pytest.UsageError:
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


def check_hardware(name: str, where: str, folder: Path | str | None = None) -> str:
    """``name`` if it is a bundled spec; a hardware file's path (``./my-910b.json``, one
    ``oam calibrate`` wrote), relative to ``folder`` (None: the current folder), made absolute
    once it loads.

    Raises:
        pytest.UsageError: an unknown name, or a file that cannot be used (naming it and the field).
    """
    from simulator.costs import check_calibration
    from simulator.hardware import is_hardware_path, list_hardware, load_hardware

    if is_hardware_path(name):
        path = Path(folder or ".", name).absolute()
        try:
            check_calibration(load_hardware(str(path)))
        except ValueError as exc:
            raise usage_error(f"{where}: {exc}") from None
        return str(path)
    known = list_hardware()
    if name not in known:
        raise usage_error(f"{where}: unknown hardware {name!r}; known: {', '.join(known)}")
    return name


def check_devices(devices: int, hardware: str, where: str) -> None:
    from simulator.hardware import load_hardware

    try:
        load_hardware(hardware).interconnect.check_device_count(devices, hardware)
    except ValueError as exc:
        raise usage_error(f"{where}: {exc}") from None


def _check_matplotlib() -> None:
    """An HTML report draws its plots with matplotlib: refuse it at start when it is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise usage_error("--oam-report: an .html report draws its plots with matplotlib, which is not installed; "
                     "install it with pip install 'pytest-oam[plot]'")


def _parse_entries(entries: list[str], where: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for entry in entries:
        if not entry.strip():
            continue
        try:
            op, limit = parse_entry(entry)
        except ThresholdError as exc:
            raise usage_error(f"{where}: {exc}") from None
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
        raise usage_error(f"{key} (ini): {exc}; use true or false") from None


def _check_baseline_dir(folder: Path, must_exist: bool, source: str = "--oam-baseline") -> None:
    """Refuse a baseline folder that cannot be one: a file, a test folder, or (when only
    gating) a folder that does not exist, where every test would silently have no baseline.
    ``source`` names where the folder came from in messages."""
    if folder.exists() and not folder.is_dir():
        raise usage_error(f"{source}: {folder} is a file, not a baseline folder")
    if folder.is_dir():
        tests = _test_files(folder)
        if tests:
            raise usage_error(
                f"{source}: {folder} holds tests ({', '.join(sorted(tests)[:3])}), not baselines; "
                + ("write --oam-baseline=DIR, or put the option after the test paths" if source == "--oam-baseline"
                   else "name a folder of baselines")
            )
    elif must_exist:
        raise usage_error(
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
    if suffix == ".md":  # exactly the first lines markdown_report writes
        ours = re.match(r"## oam performance gate\n\n\*\*(FAILED|passed)\*\*: \d+ profiled tests \(", text) is not None
    elif suffix == ".html":  # exactly the head html_report writes
        ours = (text.startswith("<!DOCTYPE html>")
                and re.search(r"<title>oam performance gate: (FAILED|passed)</title>", text) is not None)
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
        raise usage_error("--oam-baseline=: the folder is empty; give a folder, or --oam-baseline alone for the ini default")
    if opt.oam_baseline is not None:
        value = opt.oam_baseline
        if value == "":
            baseline_dir = default_dir
        else:
            if value.endswith(".py") or "::" in value:
                raise usage_error(
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
        hardware = check_hardware(opt.oam_hardware, "--oam-hardware", config.invocation_params.dir)
    else:
        hardware = config.getini("oam_hardware") or "ascend910"
        if hardware != "ascend910":  # a file's path: relative to the ini file
            hardware = check_hardware(hardware, "oam_hardware (ini)",
                                      config.inipath.parent if config.inipath else config.rootpath)
    reports = tuple(Path(config.invocation_params.dir, p) for p in opt.oam_report or [])
    for report in reports:
        if report.is_dir():
            raise usage_error(f"--oam-report: {report} is a folder; give a file path such as oam.json")
        if report.suffix.lower() not in REPORT_FORMATS:
            raise usage_error(f"--oam-report: {report} must end in {' or '.join(REPORT_FORMATS)}")
        blocked = next((p for p in report.parents if p.exists() and not p.is_dir()), None)
        if blocked is not None:  # else found only when the run ends, after every test
            raise usage_error(f"--oam-report: {report} cannot be written: {blocked} is a file, not a folder")
    if any(r.suffix.lower() == ".html" for r in reports):
        _check_matplotlib()
    for report in reports:
        for folder in {baseline_dir, save_dir, default_dir} - {None}:
            if folder.resolve() in report.resolve().parents:
                raise usage_error(f"--oam-report: {report} is inside the baseline folder {folder}; write reports "
                             "elsewhere (a report there would replace a baseline or be taken for one)")
        problem = report_overwrite_problem(report)
        if problem is not None:
            raise usage_error(f"--oam-report: {problem}")
    prune = bool(opt.oam_prune)
    if prune and save_dir is None:
        raise usage_error("--oam-prune: deletes stale baselines only together with --oam-save-baseline")
    rules, disabled, rule_thresholds = _rule_settings(config)
    collect = opt.oam_collect or config.getini("oam_collect") or "auto"
    if collect not in ("auto", "offline", "online"):
        raise usage_error(f"oam_collect (ini): {collect!r} is not one of auto, offline, online")
    record = opt.oam_record or config.getini("oam_record") or "failed"
    if record not in ("failed", "all", "none"):
        raise usage_error(f"oam_record (ini): {record!r} is not one of failed, all, none")
    if opt.oam_record_dir is not None:
        record_dir = Path(config.invocation_params.dir, opt.oam_record_dir)
    else:
        ini_record = Path(config.getini("oam_record_dir") or ".oam/records")
        record_dir = ini_record if ini_record.is_absolute() else ini_dir / ini_record
    if record_dir.exists() and not record_dir.is_dir():
        raise usage_error(f"--oam-record-dir: {record_dir} exists and is not a folder")
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


def load_knowledge_base(path: Path):
    """The knowledge base of the tuned check.

    Raises:
        KnowledgeBaseError: the file does not exist (a typo in ``oam_knowledge_base`` must not
            turn every tuned check into a skipped one), is corrupt or of another schema version.
    """
    from .tuning.knowledge_base import KnowledgeBase, KnowledgeBaseError

    if not path.is_file():
        raise KnowledgeBaseError(path, "does not exist (the oam_knowledge_base ini key names it; write one with "
                                       "'oam tune JOB --save PATH')")
    return KnowledgeBase.load(path, missing_ok=False)


def _check_knowledge_base(path: Path, where: str) -> None:
    """A tuned-limit option needs a knowledge base that exists and reads (checked at start, so
    a typo in ``oam_knowledge_base`` is not a green run of skipped checks)."""
    from .tuning.knowledge_base import KnowledgeBaseError

    try:
        load_knowledge_base(path)
    except KnowledgeBaseError as exc:
        raise usage_error(f"{where}: {exc}") from None


def _rule_settings(config: pytest.Config) -> tuple[dict, tuple[str, ...], dict[str, dict[str, float]]]:
    """The session's diagnosis rules (built-ins plus ``pytest_oam_register_rules``), the ones
    switched off, and threshold overrides; checked now so a typo is a usage error."""
    from .judge.rules import RULES, check_rules, parse_rule_thresholds

    rules = dict(RULES)
    config.hook.pytest_oam_register_rules(rules=rules)
    try:
        check_rules(rules)
    except ValueError as exc:
        raise usage_error(f"pytest_oam_register_rules: {exc}") from None
    disabled = tuple(config.getini("oam_disable_rules"))
    try:
        thresholds = parse_rule_thresholds(config.getini("oam_rule_thresholds"))
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    unknown = sorted((set(disabled) | set(thresholds)) - set(rules))
    if unknown:
        raise usage_error(f"oam_disable_rules / oam_rule_thresholds: unknown diagnosis rule "
                     f"{', '.join(map(repr, unknown))}; known: {', '.join(sorted(rules))}")
    for rule_id, values in thresholds.items():
        bad = sorted(set(values) - set(rules[rule_id].thresholds))
        if bad:
            raise usage_error(f"oam_rule_thresholds: rule {rule_id!r} has no threshold {', '.join(map(repr, bad))}; "
                         f"its thresholds: {', '.join(sorted(rules[rule_id].thresholds)) or 'none'}")
    return rules, disabled, thresholds


"""The plugin's hooks: :class:`OamSession`, registered once per run (see :mod:`pytest_oam.plugin`).
Its options are in :mod:`.settings`, markers in :mod:`.markers`, the fixture's object in
:mod:`.profiler`, the terminal summary in :mod:`.summary`, pruning in :mod:`.prune`.

Data flow: the ``oam_profile`` fixture runs workloads (on an xdist worker or in-process) ->
the ``pytest_runtest_makereport`` hook compares the profiles with the baseline (then the tuned
check and ``--oam-record``, each returning a new result) and attaches the one
:class:`~pytest_oam.gate.result.GateResult`, as builtin types, to the test report
(``report.oam_gate``) -> the controller's ``pytest_runtest_logreport`` validates it, once,
collects results and writes baselines -> terminal summary and the reports at the end, which
take the typed results. Only the controller writes files (and a worker its records).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .gate.evaluate import GateInputs
from .judge.status import GateStatus
from .markers import marker_is_ours, marker_of, uses_oam_profile
from .profiler import PROFILER_KEY, OamProfiler
from .prune import prune_refusal, stale_baselines
from .settings import (
    OamSettings,
    check_devices,
    load_knowledge_base,
    report_overwrite_problem,
    settings_from_config,
    simulator_clash,
    usage_error,
)

#: Set on an item while its test function runs (pytest_runtest_call).
_IN_CALL = pytest.StashKey[bool]()

if TYPE_CHECKING:
    from .files.baseline import BaselineFile
    from .gate.result import GateResult
    from .report.html import RunSeries
    from .report.model import GateReport


class OamSession:
    """Registered once per pytest run as a plugin; holds the gate's state."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._settings: OamSettings | None = None
        #: The usage error of bad options or ini values, where it could not end the run (a worker,
        #: or a fixture requested at run time): each test that uses the plugin errors with it.
        self.settings_error: str | None = None
        self.is_worker = hasattr(config, "workerinput")
        self.bad_markers: dict[str, str] = {}  # nodeid -> message, on an xdist worker
        self.results: dict[str, GateResult] = {}  # validated once, on arrival (the controller)
        self.written: list[str] = []
        self.op_types_seen: set[str] = set()
        self.report_errors: dict[Path, str] = {}
        self.pruned: list[str] = []
        self.unused_baselines: list[str] = []  # gate mode, full run: files no collected test reads
        self.collected: set[str] = set()
        #: Test ids as collection found them, before any hook dropped some from the list (a
        #: conftest's ``items[:] = [...]`` says nothing to pytest_deselected); a worker's passed on.
        self.existing: set[str] = set()
        self.order: dict[str, int] = {}  # test id -> collection position, for reports in test order
        self.pending_saves: dict[str, BaselineFile] = {}
        #: Tests with a failed call report: their own, or a subtest's (not saved as baselines).
        self.failed_calls: set[str] = set()
        self.partial: set[str] = set()
        self.prune_refused: str | None = None
        self.save_errors: list[str] = []
        self.recorded: list[str] = []
        #: Per test id, the per-step series of its runs (for an HTML report), sent with the gate.
        self.series: dict[str, list[RunSeries]] = {}
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
                raise usage_error(problem)
            self._settings = settings_from_config(self.config)
        return self._settings

    @property
    def wants_series(self) -> bool:
        return any(p.suffix.lower() == ".html" for p in self.settings.report_paths)

    # -- collection: validate markers before any test runs --------------------------------------

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        self.existing.add(item.nodeid)  # before every pytest_collection_modifyitems, tryfirst or wrapper

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.note_collected(item.nodeid for item in session.items)
        if self.is_worker:
            self.config.workeroutput["oam_existing"] = sorted(self.existing)

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

    def tests_in_order(self) -> list[GateReport]:
        """The gated tests' reports in collection order (xdist finishes them in any order)."""
        ordered = sorted(self.results.items(), key=lambda kv: self.order.get(kv[0], len(self.order)))
        return [result.report for _, result in ordered]

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
        self.existing.update(getattr(node, "workeroutput", {}).get("oam_existing", ()))
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
        if self.settings_problem() is not None:
            if not self.is_worker:
                raise usage_error(self.settings_error)  # a bad ini value: a usage error before any test
            return  # a worker cannot end the session (see above): each test that uses us errors
        errors = {}
        for item in items:
            # a marker of a test that does not use the fixture is not ours to judge: it changes
            # nothing here, and may be another suite's own "oam" marker
            if item.get_closest_marker("oam") is not None and uses_oam_profile(item):
                problem = self.marker_problem(item)
                if problem is not None:
                    errors[item.nodeid] = problem
        if self.is_worker:
            self.bad_markers = errors
        elif len(errors) == 1:
            raise pytest.UsageError(next(iter(errors.values())))
        elif errors:
            raise pytest.UsageError(f"{len(errors)} bad @pytest.mark.oam markers:\n" + "\n".join(errors.values()))

    def marker_problem(self, item: pytest.Item) -> str | None:
        """What is wrong with the test's ``@pytest.mark.oam`` markers (``None``: nothing)."""
        try:
            marker = marker_of(item)
            if marker.devices is not None:  # a count HCCL does not support on that hardware's servers
                check_devices(marker.devices, marker.hardware or self.settings.hardware,
                              f"{item.nodeid}: @pytest.mark.oam")
        except pytest.UsageError as exc:
            return str(exc)
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.nodeid in self.bad_markers:
            pytest.fail(self.bad_markers[item.nodeid], pytrace=False)
        if self.settings_error is not None and uses_oam_profile(item):
            pytest.fail(f"oam: {self.settings_error}", pytrace=False)

    def settings_problem(self) -> str | None:
        """Resolve the settings now; the usage error they raise, kept (and then returned every
        time) where it cannot end the session: on an xdist worker, or once tests have run."""
        if self.settings_error is None and self._settings is None:
            try:
                self.settings  # noqa: B018
            except pytest.UsageError as exc:
                self.settings_error = str(exc)
        return self.settings_error

    # -- the fixture ----------------------------------------------------------------------------

    def baseline_path(self, nodeid: str, folder: Path) -> Path:
        from .files.baseline import baseline_filename

        return folder / baseline_filename(nodeid)

    def profiler_for(self, item: pytest.Item) -> OamProfiler:
        """Make the test's profiler, reading its baseline first (as it was before this run).

        Raises:
            BaselineError: in gate mode without ``--oam-save-baseline``, the test's baseline
                file exists but cannot be used (the test errors, naming the file).
        """
        from .files.baseline import BaselineError, baseline_state, load_baseline

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
        problem = self.marker_problem(item)  # not checked at collection: request.getfixturevalue("oam_profile")
        if problem is not None:
            pytest.fail(problem, pytrace=False)
        profiler = OamProfiler(item, self.settings, marker_of(item), baseline, path)
        profiler.baseline_error = error
        item.stash[PROFILER_KEY] = profiler
        return profiler

    # -- the gate -------------------------------------------------------------------------------

    def gate_inputs(self, item: pytest.Item, profiler: OamProfiler) -> GateInputs:
        """The test's gate settings, as :func:`pytest_oam.evaluate.evaluate_gate` takes them."""
        return GateInputs(
            nodeid=item.nodeid,
            gating=self.settings.baseline_dir is not None,
            saving=self.settings.save_dir is not None,
            marker_thresholds=marker_of(item).thresholds,
            cli_thresholds=self.settings.cli_thresholds,
            ini_thresholds=self.settings.ini_thresholds,
            strict=self.settings.strict,
            fail_on_improvement=self.settings.fail_on_improvement,
            disabled_rules=self.settings.disabled_rules,
            rule_thresholds=self.settings.rule_thresholds,
            baseline_path=self.display(profiler.baseline_path) if profiler.baseline_path else None,
            baseline_error=profiler.baseline_error,
            invocation_dir=str(self.config.invocation_params.dir),
            root_dir=str(self.config.rootpath),
        )

    def _evaluate(
        self, item: pytest.Item, profiler: OamProfiler, test_passed: bool = True
    ) -> tuple[GateResult, str | None]:
        """Compare the test's profiled runs with its baseline: (gate result, failure text)."""
        from .gate.evaluate import evaluate_gate

        return evaluate_gate(self.gate_inputs(item, profiler), profiler.profiles, profiler.baseline,
                             rules=self.settings.rules, test_passed=test_passed)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        # a call report made while the test runs is a subtest's (pytest's subtests make it
        # before wrapping it in a SubtestReport): see pytest_runtest_makereport
        item.stash[_IN_CALL] = True
        try:
            return (yield)
        finally:
            item.stash[_IN_CALL] = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if self.unusable() or (report.when == "call" and item.stash.get(_IN_CALL, False)):
            return report  # a subtest's report: the gate judges the whole test, on its call report
        result = self._gate_report(item, call, report)
        if report.when == "call":
            result = self._tuned_check(item, report, result)
            pending = self._pending_records.pop(item.nodeid, None)
            mode = self.settings.record
            if pending is not None and result is not None and (mode == "all" or (mode == "failed" and report.failed)):
                result = self._record(item, result, *pending)  # after the tuned check, which can fail the test too
        if result is not None:  # as builtin types: xdist sends the report's __dict__ as JSON
            report.oam_gate = result.model_dump(mode="json")
        return report

    def _gate_report(self, item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> GateResult | None:
        """The baseline gate of the test's profiled runs (failing ``report`` when it fails);
        ``None``: nothing to gate."""
        if report.when == "setup" and call.excinfo is not None:
            from .files.baseline import BaselineError

            if isinstance(call.excinfo.value, BaselineError):
                from .gate.result import GateResult
                from .report.model import GateReport

                exc = call.excinfo.value
                report.longrepr = f"oam: invalid baseline: {exc}"
                return GateResult(report=GateReport(nodeid=item.nodeid, status=GateStatus.INVALID_BASELINE,
                                                    baseline_path=exc.path, message=str(exc)))
            return None
        if report.when != "call":
            return None
        profiler = item.stash.get(PROFILER_KEY, None)
        if profiler is None:
            return self._unprofiled_with_baseline(item, report)
        if not profiler.profiles and profiler.baseline is None:
            return None
        if not profiler.profiles and not report.passed:
            return self._ended_before_profiling(item, report, profiler.baseline_path)
        try:
            result, text = self._evaluate(item, profiler, report.passed)
        except Exception:  # noqa: BLE001 - never crash the session: fail this test with the traceback
            import traceback

            report.outcome = "failed"
            report.longrepr = "oam: internal error while gating this test:\n" + traceback.format_exc()
            return None
        body_outcome = report.outcome
        if self.wants_series:
            from .report.html import series_from_profile

            result = result.model_copy(update={"series": [series_from_profile(p) for p in profiler.profiles]})
        from .summary import junit_properties

        item.user_properties.extend(junit_properties(result.report))  # JUnit XML <property> entries
        if text is not None:
            self._fail(report, text)
        if profiler.profiles and self.settings.record != "none":
            self._pending_records[item.nodeid] = (profiler, text, body_outcome)
        return result

    # -- the tuned check: is each call near the tuned optimum of the knowledge base? ---------------

    def _knowledge_base(self):
        """The knowledge base, read once per process (a worker reads its own copy).

        Raises:
            KnowledgeBaseError: see :func:`load_knowledge_base`.
        """
        if self._kb is None:
            self._kb = load_knowledge_base(self.settings.knowledge_base)
        return self._kb

    def _tuned_check(self, item: pytest.Item, report: pytest.TestReport,
                     result: GateResult | None) -> GateResult | None:
        """The tuned check of the test's profiled calls (:func:`pytest_oam.gate.tuned.tuned_check`),
        failing ``report`` when a call is too slow: the gate result with the check in its report
        (for the summary and the reports), a new one (:meth:`GateResult.with_tuned`)."""
        profiler = item.stash.get(PROFILER_KEY, None)
        # a tuned marker on a test that never profiled fails it (a forgotten fixture); another
        # suite's own oam marker, which does not parse as ours, is left alone
        ours = item.get_closest_marker("oam") is not None and (profiler is not None or marker_is_ours(item))
        marker = marker_of(item).tuned if ours else {}
        if not (marker or self.settings.cli_tuned_limits or self.settings.ini_tuned_limits):
            return result
        from .gate.tuned import tuned_check

        checked = tuned_check(
            profiler.profiles if profiler is not None else [],
            [c["arguments"] or None for c in profiler.run_configs] if profiler is not None else [],
            marker=marker, cli=self.settings.cli_tuned_limits, ini=self.settings.ini_tuned_limits,
            knowledge_base=self._knowledge_base, strict=self.settings.strict, test_passed=report.passed,
        )
        if result is not None:  # (no gate result: nothing profiled, so no notes to carry either)
            result = result.with_tuned(checked.failures, checked.notes)
        if checked.failures:
            self._fail(report, f"oam tuned check: FAILED {item.nodeid}\n" + "\n".join(checked.failures))
        return result

    def _record(self, item: pytest.Item, result: GateResult, profiler: OamProfiler, text: str | None,
                body_outcome: str) -> GateResult:
        """Write the test's record (``--oam-record``): the result names the file, or the error,
        for the controller's summary."""
        from .gate.record import RunConfig, make_record, record_filename, write_record

        path = self.settings.record_dir / record_filename(item.nodeid)
        try:
            record = make_record(
                nodeid=item.nodeid, test_outcome=body_outcome,
                gate_inputs=self.gate_inputs(item, profiler).to_dict(), rules=sorted(self.settings.rules),
                baseline=profiler.baseline,
                runs=[(RunConfig(**c), p) for c, p in zip(profiler.run_configs, profiler.profiles)],
                gate=result.report, failure_text=text,
            )
            write_record(path, record)
        except (OSError, ValueError) as exc:
            return result.model_copy(update={"record_error": f"--oam-record: {self.display(path)} not written: {exc}"})
        return result.model_copy(update={"record": self.display(path)})

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
                                path: Path | None) -> GateResult:
        """A test that skipped itself (``pytest.skip``, ``importorskip``, ``skipTest``), was an
        expected failure, or failed before any profiled run: its own outcome and reason stand, it
        is not gated, and its baseline is kept (nothing is saved over it)."""
        from .gate.result import GateResult
        from .report.model import GateReport

        if hasattr(report, "wasxfail"):
            how = "was an expected failure (xfail)"
        elif report.skipped:
            how = "skipped itself"
        else:
            how = "failed"
        from .summary import outcome_reason

        reason = outcome_reason(report)
        message = (f"the test {how} before any profiled run" + (f" ({reason})" if reason else "") + ": not gated"
                   + ("; its baseline is kept" if path is not None and path.is_file() else ""))
        gate = GateReport(nodeid=item.nodeid, status=GateStatus.NOT_GATED, failed=False,
                          baseline_path=self.display(path) if path is not None else None, message=message)
        return GateResult(report=gate, test_passed=report.passed)

    def _unprofiled_with_baseline(self, item: pytest.Item, report: pytest.TestReport) -> GateResult | None:
        """A gated test that has a baseline but no longer uses ``oam_profile``: nothing compared."""
        if self.settings.baseline_dir is None:
            return None
        path = self.baseline_path(item.nodeid, self.settings.baseline_dir)
        if not path.is_file():
            return None
        if not report.passed:  # it skipped, xfailed or failed on its own: that outcome stands
            return self._ended_before_profiling(item, report, path)
        from .gate.result import GateResult
        from .report.model import GateReport

        message = "the test no longer uses the oam_profile fixture, but it has a baseline: nothing was compared"
        gate = GateReport(nodeid=item.nodeid, status=GateStatus.MISSING_OPS, failed=True,
                          baseline_path=self.display(path), message=message)
        self._fail(report, f"oam performance gate: MISSING-OPS {item.nodeid}\nbaseline: {self.display(path)}\n"
                           f"note: {message}; remove the baseline file or profile the test again")
        return GateResult(report=gate)

    # -- controller side --------------------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker or self.unusable():
            return
        if report.when == "call" and report.failed and getattr(report, "context", None) is not None:
            # a failed subtest (pytest's subtests, unittest's subTest: a SubtestReport, with the
            # subtest's context): its test is not saved, whatever the gate of its call says
            self.failed_calls.add(report.nodeid)
        if report.when == "teardown" and report.nodeid in self.pending_saves:
            baseline = self.pending_saves.pop(report.nodeid)
            if not report.passed:
                self.save_errors.append(f"{report.nodeid}: baseline not written: the test errored in teardown")
            elif report.nodeid in self.failed_calls:
                self.save_errors.append(f"{report.nodeid}: baseline not written: a subtest failed")
            else:
                self._save(report.nodeid, baseline)
            return
        gate = getattr(report, "oam_gate", None)
        if gate is None:
            return
        from .gate.result import GateResult

        result = GateResult.model_validate(gate)  # the one validation of a worker's result
        self.results[report.nodeid] = result
        if result.report.tuned_notes:
            self.tuned_notes[report.nodeid] = result.report.tuned_notes
        if result.record:
            self.recorded.append(result.record)
        if result.record_error:
            self.save_errors.append(result.record_error)
        if result.series is not None:
            self.series[report.nodeid] = result.series
        self.op_types_seen.update(result.op_types)
        if result.baseline is not None and result.test_passed and self.settings.save_dir is not None:
            self.pending_saves[report.nodeid] = result.baseline  # written once teardown passed too

    def _save(self, nodeid: str, baseline: BaselineFile) -> None:
        from .files.baseline import save_baseline

        path = self.baseline_path(nodeid, self.settings.save_dir)
        try:
            save_baseline(path, baseline)
        except (OSError, ValueError) as exc:
            self.save_errors.append(f"{path}: not written: {exc}")
            return
        self.written.append(str(path))

    def display(self, path: Path) -> str:
        """``path`` relative to the invocation folder when it lies inside it."""
        try:
            return str(Path(path).relative_to(self.config.invocation_params.dir))
        except ValueError:
            return str(path)

    def unusable(self) -> bool:
        """Another ``simulator`` module hides ours and the options were never resolved: the
        tests that used the fixture errored with the reason; nothing else to do."""
        return self.settings_error is not None or (self._settings is None and simulator_clash() is not None)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.is_worker or self.unusable():
            return
        from .summary import write_summary

        write_summary(self, terminalreporter)


    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.is_worker or self.unusable():
            return
        if self.settings.prune:
            self._prune(session)
        elif self.settings.baseline_dir is not None and prune_refusal(self.config, session, self.partial, self.collected) is None:
            # a full gating run: say which baselines no test read (a renamed or moved test
            # silently reports no-baseline otherwise)
            self.unused_baselines = [f"{self.display(path)} ({nodeid})"
                                     for path, nodeid in stale_baselines(self.config, self.existing_tests(),
                                                                         self.settings.baseline_dir)[0]]
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

    def existing_tests(self) -> set[str]:
        """Every test id this run's collection found, those a conftest or plugin then dropped
        from the run included (they exist: their baselines are not stale)."""
        return self.collected | self.existing

    def _prune(self, session: pytest.Session) -> None:
        """Delete baselines of tests that are provably gone (see :func:`pytest_oam.prune.stale_baselines`)."""
        refusal = prune_refusal(self.config, session, self.partial, self.collected)
        if refusal:
            self.prune_refused = f"--oam-prune: not a full run ({refusal}); nothing deleted"
            return
        gone, kept = stale_baselines(self.config, self.existing_tests(), self.settings.save_dir)
        self.prune_kept = [f"{self.display(path)} ({nodeid})" for path, nodeid in kept]
        for path, nodeid in gone:
            try:
                path.unlink()
            except OSError as exc:
                self.save_errors.append(f"{self.display(path)}: not pruned: {exc}")
                continue
            self.pruned.append(f"{self.display(path)} ({nodeid})")

    def _write_report(self, path: Path) -> None:
        from .report.write import write_report

        spike = (self.settings.rules, self.settings.rule_thresholds)
        write_report(path, self.tests_in_order(), self.settings.baseline_dir, self.series, spike)

"""The pytest entry point (``pytest11`` name ``oam``): options, ini keys, marker, fixture.

Thin by design: the state lives in :class:`pytest_oam.session.OamSession`, registered once and
kept in ``config.stash``. The plugin autoloads in every pytest run of the environment, so a
suite that does not use it must not pay for it: unless an ``--oam-*`` option is given, only a
small watcher (:class:`_Dormant`) is registered, and the session (with the simulator, numpy
and pydantic behind it) loads when a collected test uses ``oam_profile`` or ``@pytest.mark.oam``,
or a test requests the fixture at run time; on an xdist controller, when the first report of a
gated test arrives from a worker.
"""

from __future__ import annotations

import pytest

OAM_SESSION_KEY = pytest.StashKey["object"]()
_DORMANT_KEY = pytest.StashKey["_Dormant"]()
#: ``config.option`` names of the plugin's command-line options; any of them given makes the
#: session load at start, so that a bad option is a usage error before any test.
OPTION_DESTS = (
    "oam_baseline", "oam_save_baseline", "oam_threshold", "oam_hardware", "oam_report", "oam_strict",
    "oam_fail_on_improvement", "oam_prune", "oam_collect", "oam_record", "oam_record_dir", "oam_tuned_limit",
)

MARKER_DOC = (
    "oam(thresholds=None, hardware=None, devices=None, tuned=None): per-test settings of the oam "
    "performance gate: thresholds maps an op type or glob to a limit ('5%' or 0.05), "
    "hardware names a simulated device (ascend910, ascend910b, ascend910b4), devices the number of cards, "
    "tuned maps an op type or glob to how much slower than its tuned optimum in the knowledge "
    "base each call may be ('5%')"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("oam", "performance regression gate on a simulated Ascend NPU")
    group.addoption(
        "--oam-baseline",
        action="store",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="Compare profiled tests with the baselines in DIR (default: the oam_baseline_dir ini value)",
    )
    group.addoption(
        "--oam-save-baseline",
        action="store_true",
        default=False,
        help="Write the baselines of the selected profiled tests (after comparing, when gating)",
    )
    group.addoption(
        "--oam-threshold",
        action="append",
        default=None,
        metavar="OP=LIMIT",
        help="Regression limit for an op type or glob, e.g. MatMul=5%% or 'FlashAttention*=0.02' (repeatable)",
    )
    group.addoption(
        "--oam-hardware",
        action="store",
        default=None,
        metavar="NAME_OR_FILE",
        help="Simulated hardware for profiled tests: a bundled spec (ascend910, ascend910b, ascend910b4) or a hardware file "
             "(./my-910b.json from oam calibrate); default: the oam_hardware ini value",
    )
    group.addoption(
        "--oam-report",
        action="append",
        default=None,
        metavar="PATH",
        help="Write a report of the gate: PATH.json (machine-readable), PATH.md (Markdown) or PATH.html "
             "(a self-contained page with plots; needs matplotlib); repeatable",
    )
    group.addoption(
        "--oam-strict",
        action="store_true",
        default=False,
        help="Fail tests whose gate status is no-baseline, incomparable or missing-ops, and tuned checks of "
             "calls with no knowledge base record",
    )
    group.addoption(
        "--oam-fail-on-improvement",
        action="store_true",
        default=False,
        help="Fail tests that got faster than their limit (the baseline is stale)",
    )
    group.addoption(
        "--oam-prune",
        action="store_true",
        default=False,
        help="With --oam-save-baseline on a full run: delete baselines of tests that no longer exist",
    )
    group.addoption(
        "--oam-collect",
        action="store",
        default=None,
        choices=("auto", "offline", "online"),
        help="How op records reach callbacks registered with register_op_callback: offline (after the run, "
             "no overhead), online (during the run, charging a per-op overhead), auto (offline when comparing "
             "with or saving baselines, online otherwise); default: the oam_collect ini value, auto",
    )
    group.addoption(
        "--oam-record",
        action="store",
        default=None,
        choices=("failed", "all", "none"),
        help="Write the full trace of failed (default), all or no profiled tests to --oam-record-dir, "
             "for 'oam replay'",
    )
    group.addoption(
        "--oam-record-dir",
        action="store",
        default=None,
        metavar="DIR",
        help="Folder of records (default: the oam_record_dir ini value, .oam/records under the rootdir)",
    )
    group.addoption(
        "--oam-tuned-limit",
        action="append",
        default=None,
        metavar="OP=LIMIT",
        help="Fail profiled tests whose calls of OP (an op type or glob) are more than LIMIT slower than the "
             "tuned optimum in the knowledge base, e.g. FlashAttention=5%% (repeatable); calls with no record "
             "are skipped with a note, or fail with --oam-strict",
    )
    parser.addini("oam_baseline_dir", "Folder of baseline files, relative to the ini file", default="baselines")
    parser.addini("oam_thresholds", "Regression limits, one OP=LIMIT per line", type="linelist", default=[])
    parser.addini("oam_hardware", "Simulated hardware for profiled tests", default="ascend910")
    parser.addini("oam_strict", "Same as --oam-strict", type="bool", default=False)
    parser.addini("oam_fail_on_improvement", "Same as --oam-fail-on-improvement", type="bool", default=False)
    parser.addini("oam_collect", "Same as --oam-collect", default="auto")
    parser.addini("oam_record", "Same as --oam-record", default="failed")
    parser.addini("oam_record_dir", "Same as --oam-record-dir, relative to the ini file", default=".oam/records")
    parser.addini("oam_disable_rules", "Diagnosis rules to switch off, one rule id per line", type="linelist",
                  default=[])
    parser.addini("oam_knowledge_base", "Tuned-results knowledge base file for the tuned check and "
                  "oam_profile.assert_near_tuned, relative to the ini file", default="tuned/knowledge_base.json")
    parser.addini("oam_tuned_limits", "Same as --oam-tuned-limit, one OP=LIMIT per line", type="linelist",
                  default=[])
    parser.addini("oam_rule_thresholds", "Diagnosis rule thresholds, one RULE.NAME = NUMBER per line",
                  type="linelist", default=[])


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspec

    pluginmanager.add_hookspecs(hookspec)


def _options_given(config: pytest.Config) -> bool:
    return any(getattr(config.option, dest, None) not in (None, False) for dest in OPTION_DESTS)


def activate(config: pytest.Config):
    """The run's :class:`~pytest_oam.session.OamSession`, made and registered on first use (its
    options are read later: :attr:`~pytest_oam.session.OamSession.settings`)."""
    session = config.stash.get(OAM_SESSION_KEY, None)
    if session is None:
        from .session import OamSession

        session = OamSession(config)
        config.stash[OAM_SESSION_KEY] = session
        config.pluginmanager.register(session, "oam-session")
        dormant = config.stash.get(_DORMANT_KEY, None)
        if dormant is not None:
            dormant.hand_over(session)
    return session


class _Dormant:
    """Registered instead of the session when no ``--oam-*`` option is given: it only watches
    collection, and makes the session when a test needs it (cheap per test: no other hook)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.partial: list[str] = []
        self.xdist_ids: list[str] = []
        self.items: list[pytest.Item] | None = None

    def hand_over(self, session) -> None:
        """Tell a session made after collection what collection saw."""
        self.config.pluginmanager.unregister(self)
        del self.config.stash[_DORMANT_KEY]
        session.partial.update(self.partial)
        session.note_collected(self.xdist_ids or [item.nodeid for item in self.items or []])

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        if items:
            self.partial.append("deselected tests")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        self.items = items
        if any("oam_profile" in getattr(item, "fixturenames", ())
               or (item.get_closest_marker("oam") is not None and _marker_is_ours(item)) for item in items):
            session = activate(config)
            session.pytest_collection_modifyitems(items)  # this hook call started before it existed

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        self.xdist_ids = ids  # the controller: its workers collect

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # the controller under xdist: a worker gated a test, so the results need a session here
        if hasattr(report, "oam_gate"):
            activate(self.config).pytest_runtest_logreport(report)


def _marker_is_ours(item: pytest.Item) -> bool:
    from .markers import marker_is_ours  # only a suite with an oam marker pays for the import

    return marker_is_ours(item)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_DOC)
    if _options_given(config):
        session = activate(config)
        # Reading the options imports the simulator. A process that collects tests reads them
        # after collection (the session's pytest_collection_modifyitems, still before any test),
        # once the tests' own imports ran: a module of theirs named simulator, in a test folder
        # that only collection puts on sys.path, is then found and errors only the tests that
        # use the fixture. An xdist controller collects nothing: it reads them now, so that a
        # bad option is one usage error before any worker starts.
        is_controller = not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no"
        if is_controller and not session.unusable():
            session.settings  # noqa: B018
    else:
        dormant = _Dormant(config)
        config.stash[_DORMANT_KEY] = dormant
        config.pluginmanager.register(dormant, "oam-dormant")


def pytest_unconfigure(config: pytest.Config) -> None:
    for key in (OAM_SESSION_KEY, _DORMANT_KEY):
        plugin = config.stash.get(key, None)
        if plugin is not None:
            config.pluginmanager.unregister(plugin)
            del config.stash[key]


@pytest.fixture
def oam_profile(request: pytest.FixtureRequest):
    """Profile workloads on the simulated NPU: ``profile = oam_profile.run(workload, ...)``.

    Each call runs ``workload(npu, *args, **kwargs)`` on the simulator and returns its
    :class:`simulator.Profile`; the profiles are kept in order and gated against the test's
    baseline when ``--oam-baseline`` is given. Op callbacks the test registers
    (``simulator.register_op_callback``) and leaves registered are removed when it ends: one
    left behind ran in every later test (and made their runs online).
    """
    from .settings import check_simulator_module

    check_simulator_module()  # before any import of it: another module named simulator may come first
    session = activate(request.config)
    problem = session.settings_problem()  # a bad option or ini value: this test errors, naming it
    if problem is not None:
        pytest.fail(f"oam: {problem}", pytrace=False)
    from simulator import callbacks

    before = callbacks.registered()
    yield session.profiler_for(request.node)
    callbacks.remove_all_but(before)

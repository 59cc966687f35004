"""The pytest entry point (``pytest11`` name ``oam``): options, ini keys, marker, fixture.

Thin by design: the state lives in :class:`pytest_oam.session.OamSession`, registered once and
kept in ``config.stash``. Nothing heavy is imported here; the simulator loads when a test
first profiles.
"""

from __future__ import annotations

import pytest

from .session import OAM_SESSION_KEY, OamSession, settings_from_config

MARKER_DOC = (
    "oam(thresholds=None, hardware=None, devices=None, tuned=None): per-test settings of the oam "
    "performance gate: thresholds maps an op type or glob to a limit ('5%' or 0.05), "
    "hardware names a simulated device (ascend910, ascend910b), devices the number of cards, "
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
        metavar="NAME",
        help="Simulated hardware for profiled tests (ascend910, ascend910b); default: the oam_hardware ini value",
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


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_DOC)
    settings = settings_from_config(config)  # raises pytest.UsageError on bad options
    session = OamSession(config, settings)
    config.stash[OAM_SESSION_KEY] = session
    config.pluginmanager.register(session, "oam-session")


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(OAM_SESSION_KEY, None)
    if session is not None:
        config.pluginmanager.unregister(session)
        del config.stash[OAM_SESSION_KEY]


@pytest.fixture
def oam_profile(request: pytest.FixtureRequest):
    """Profile workloads on the simulated NPU: ``profile = oam_profile.run(workload, ...)``.

    Each call runs ``workload(npu, *args, **kwargs)`` on the simulator and returns its
    :class:`simulator.Profile`; the profiles are kept in order and gated against the test's
    baseline when ``--oam-baseline`` is given. Op callbacks the test registers
    (``simulator.register_op_callback``) and leaves registered are removed when it ends: one
    left behind ran in every later test (and made their runs online).
    """
    from simulator import callbacks

    before = callbacks.registered()
    yield request.config.stash[OAM_SESSION_KEY].profiler_for(request.node)
    callbacks.remove_all_but(before)

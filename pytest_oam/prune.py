"""``--oam-prune``: which baselines belong to tests that are provably gone, and when a run sees
enough of the suite to say so."""

from __future__ import annotations

from pathlib import Path

import pytest


def function_id(nodeid: str) -> str:
    """A test id without its parameters: ``f.py::C::test_x[1-a]`` -> ``f.py::C::test_x``."""
    head, sep, _ = nodeid.partition("[")
    return head if sep else nodeid


def prune_refusal(config: pytest.Config, session: pytest.Session, partial: set[str], collected: set[str]) -> str | None:
    """Why this run may not prune (a partial run would delete baselines of unseen tests)."""
    opt = config.option
    reasons = [flag for flag, given in (
        ("-k", getattr(opt, "keyword", "")), ("-m", getattr(opt, "markexpr", "")),
        ("--lf", getattr(opt, "lf", False)), ("--deselect", getattr(opt, "deselect", None)),
        ("--ignore", getattr(opt, "ignore", None)), ("--ignore-glob", getattr(opt, "ignore_glob", None)),
        ("--collect-only", getattr(opt, "collectonly", False)),
    ) if given]
    if any("::" in str(arg) for arg in config.args):
        reasons.append("a test id on the command line")
    reasons += sorted(partial)
    if session.shouldfail or session.shouldstop:
        reasons.append("the run stopped early")
    if session.exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR):
        reasons.append("the run was interrupted")
    if not collected:
        reasons.append("no test was collected")
    return ", ".join(reasons) or None



def stale_baselines(config: pytest.Config, collected: set[str], folder: Path | None
                    ) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """Baselines in ``folder`` of tests in the collected paths that this run did not collect,
    with their test ids, as ``(gone, kept)``. Gone, provably: the test file no longer exists,
    or it was collected and no test of that name is in it (a parametrized test counts by its
    function: ids that exist only on some machines, ``test_x[gpu]``, are kept while ``test_x``
    is collected). Kept: everything else, such as a file a conftest's ``collect_ignore`` left
    out. Unreadable files are left out of both: not ours to judge."""
    from .files.baseline import BaselineError, load_baseline

    if folder is None or not folder.is_dir():
        return [], []
    scopes = [Path(config.invocation_params.dir, str(arg)).resolve() for arg in config.args]
    root = config.rootpath
    collected_files = {nodeid.split("::")[0] for nodeid in collected}
    collected_tests = {function_id(nodeid) for nodeid in collected}
    gone, kept = [], []
    for path in sorted(folder.glob("*.json")):
        try:
            nodeid = load_baseline(path).nodeid
        except BaselineError:
            continue
        file_part = nodeid.split("::")[0]
        test_file = (root / file_part).resolve()
        in_scope = any(test_file == scope or scope in test_file.parents for scope in scopes)
        if not in_scope or nodeid in collected:
            continue
        if not test_file.exists() or (file_part in collected_files and function_id(nodeid) not in collected_tests):
            gone.append((path, nodeid))
        else:
            kept.append((path, nodeid))
    return gone, kept

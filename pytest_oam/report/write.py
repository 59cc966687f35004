"""``--oam-report PATH``: the gate's report written as JSON, Markdown or HTML, by the name's suffix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .model import GateReport, OamReport, dump_report

if TYPE_CHECKING:
    from .html import RunSeries


def write_report(path: Path, tests: Sequence[GateReport], baseline_dir: Path | None,
                 series: Mapping[str, Sequence[RunSeries]], rules: tuple[Mapping, Mapping]) -> None:
    """Write the report of ``tests`` (in test order) to ``path``: ``.json`` (:class:`OamReport`),
    ``.md`` (a job summary) or ``.html`` (a page with plots of each test's ``series``; ``rules``,
    the session's diagnosis rules and rule thresholds, set what a spike is).

    Raises:
        OSError: the file cannot be written.
    """
    import pytest_oam

    from ..files.fileio import atomic_write_text
    from .text import markdown_report

    counts: dict[str, int] = {}
    for t in tests:
        counts[t.status] = counts.get(t.status, 0) + 1
    report = OamReport(
        pytest_oam_version=pytest_oam.__version__,
        baseline_dir=str(baseline_dir) if baseline_dir else None,
        tests=list(tests),
        status_counts=counts,
    )
    if path.suffix.lower() == ".html":
        from .html import html_report, spike_factor_of

        text = html_report(report, series, spike_factor=spike_factor_of(*rules))
    else:
        text = markdown_report(report) if path.suffix.lower() == ".md" else dump_report(report)
    atomic_write_text(path, text)

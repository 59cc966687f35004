"""One test's gate result, the one value that crosses from an xdist worker to the controller.

Built on the process that ran the test (:func:`pytest_oam.gate.evaluate.evaluate_gate`, then
the tuned check and ``--oam-record`` each return a new one), carried on the test report as
builtin types (``report.oam_gate = result.model_dump(mode="json")``: xdist sends a report's
``__dict__`` as JSON), and validated once, on the controller, with
:meth:`GateResult.model_validate`; the summary and the report writers take it typed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..files.baseline import BaselineFile
from ..report.html import RunSeries
from ..report.model import GateReport


class GateResult(BaseModel):
    """The gate of one test: its report, and what the controller does with it.

    ``report`` is what the JSON, Markdown and HTML reports and the terminal summary show;
    ``baseline`` the baseline to write with ``--oam-save-baseline`` (``None``: nothing to save,
    e.g. a run with fatal findings), written only when ``test_passed`` (the test body, its
    tuned check) and its teardown passed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    report: GateReport
    op_types: list[str] = Field(
        default_factory=list, description="The rows the test ran (op types, step, memory rows), for the "
        "summary's check that every --oam-threshold pattern matches one")
    baseline: BaselineFile | None = None
    test_passed: bool = True
    series: list[RunSeries] | None = Field(
        default=None, description="Per run, its per-step series (only when an HTML report is written)")
    record: str | None = Field(default=None, description="The --oam-record file written, as shown")
    record_error: str | None = Field(default=None, description="Why the --oam-record file was not written")

    def with_tuned(self, failures: list[str], notes: list[str]) -> GateResult:
        """This result with the tuned check's failures and notes in its report; a failure fails
        the test (its report says ``failed``) and no baseline is saved from it."""
        report = {"tuned_failures": list(failures), "tuned_notes": list(notes)}
        if not failures:
            return self.model_copy(update={"report": self.report.model_copy(update=report)})
        return self.model_copy(update={"report": self.report.model_copy(update={**report, "failed": True}),
                                       "test_passed": False})

"""The gate status of a profiled test: one enum that knows the order of severity and which
statuses fail a test (always, with ``--oam-strict``, with ``--oam-fail-on-improvement``)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class GateStatus(str, Enum):
    """A test's gate status, most severe first (the order :meth:`worst` uses). A member equals
    its value (``GateStatus.REGRESSED == "regressed"``), which is what files and reports hold.

    ``not-gated``: profiled without ``--oam-baseline``, or the test ended before profiling.
    """

    REGRESSED = "regressed"
    INVALID_BASELINE = "invalid-baseline"
    MISSING_OPS = "missing-ops"
    INCOMPARABLE = "incomparable"
    NO_BASELINE = "no-baseline"
    IMPROVED = "improved"
    PASS = "pass"
    NOT_GATED = "not-gated"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def worst(cls, statuses: Iterable[str]) -> GateStatus:
        """The most severe of ``statuses`` (``pass`` for none)."""
        order = list(cls)
        return min((cls(s) for s in statuses), key=order.index, default=cls.PASS)

    def fails(self, *, strict: bool = False, fail_on_improvement: bool = False) -> bool:
        """Does a test with this status fail? ``regressed`` always; ``no-baseline``,
        ``incomparable`` and ``missing-ops`` with ``strict``; ``improved`` with
        ``fail_on_improvement``. (A test where nothing could be compared fails whatever its
        status: the gate decides that, not the status.)"""
        return (self is GateStatus.REGRESSED
                or (strict and self in (GateStatus.NO_BASELINE, GateStatus.INCOMPARABLE, GateStatus.MISSING_OPS))
                or (fail_on_improvement and self is GateStatus.IMPROVED))


#: Every status, most severe first (the values, as files hold them).
STATUS_ORDER = tuple(status.value for status in GateStatus)

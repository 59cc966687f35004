"""The one severity scale of every finding: diagnosis rules and the explanation of a regression.

``fatal``: a correctness problem (NaN/Inf, fp16 overflow, shape mismatch, out-of-bounds access);
it fails the test even without a baseline. A performance finding is graded by the time it costs
(or a fix would save) as a share of the step time: ``serious`` from :data:`SERIOUS_STEP_FRAC`,
``warning`` from :data:`WARNING_STEP_FRAC`, ``info`` below that. The diagnosis rules do not
report ``info`` findings (a healthy run stays quiet); a regression that failed the gate is
always explained, and when it costs under 3% of the step (a FlashAttention op over its 2% limit,
say) its explanation is ``info``.

Pure data and one function; imports nothing of pytest or the simulator.
"""

from __future__ import annotations

from typing import Literal

Severity = Literal["fatal", "serious", "warning", "info"]
#: Most severe first; reports sort by it.
SEVERITY_ORDER: tuple[Severity, ...] = ("fatal", "serious", "warning", "info")
#: A performance finding that costs at least this share of the step is serious...
SERIOUS_STEP_FRAC = 0.05
#: ... at least this share a warning, and below it info.
WARNING_STEP_FRAC = 0.03


def grade_share(step_share_frac: float) -> Severity:
    """Severity of a performance finding that costs ``step_share_frac`` of the step time
    (a fraction: 0.05 is 5%)."""
    if step_share_frac >= SERIOUS_STEP_FRAC:
        return "serious"
    if step_share_frac >= WARNING_STEP_FRAC:
        return "warning"
    return "info"

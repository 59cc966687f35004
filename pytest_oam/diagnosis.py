"""Diagnosis of a regression: what regressed, which counters moved, where, how bad, what to do.

Pure functions over a :class:`~pytest_oam.compare.RunComparison` and the current profile.
Thresholds live in this module's constants.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.profile import Profile

from .baseline import OpStats
from .compare import CounterChange, RunComparison

#: Severity by the share of the baseline step time the regression costs.
SEVERITY_CRITICAL_STEP_FRAC = 0.05
SEVERITY_MAJOR_STEP_FRAC = 0.01
#: Call sites listed per regressed op type.
MAX_CALL_SITES = 3


@dataclass(frozen=True)
class Finding:
    """One regressed op type, explained."""

    op_type: str
    severity: str
    delta_s: float
    step_share_frac: float
    counters: list[CounterChange]
    call_sites: list[tuple[str, float]]
    advice: list[str]
    kind: str = "regressed"  # or "new": an op type the baseline does not have


def _severity(step_share: float) -> str:
    if step_share >= SEVERITY_CRITICAL_STEP_FRAC:
        return "critical"
    if step_share >= SEVERITY_MAJOR_STEP_FRAC:
        return "major"
    return "minor"


def memory_bound(mte2_ratio: float, mac_ratio: float, vec_ratio: float) -> float:
    """msprof's ``memory_bound``: ``mte2_ratio / max(mac_ratio, vec_ratio)`` (> 1: memory-bound)."""
    compute = max(mac_ratio, vec_ratio)
    return mte2_ratio / compute if compute > 0 else float("inf")


def _advice(
    op_type: str, counters: list[CounterChange], current: OpStats | None, baseline: OpStats | None = None
) -> list[str]:
    moved = {c.name: c for c in counters}
    flash = op_type.startswith("FlashAttention")
    tips = []
    if "count_per_step" in moved:
        tips.append(f"{op_type} now runs {moved['count_per_step'].current:g} times per step "
                    f"(was {moved['count_per_step'].baseline:g}): look for added or unfused calls")
    elif "flop" in moved and moved["flop"].current > moved["flop"].baseline:
        tips.append(f"{op_type} does more work: its input shapes changed; check the shapes at the call sites")
    more_bytes = "hbm_bytes" in moved and moved["hbm_bytes"].current > moved["hbm_bytes"].baseline
    more_dma = "dma_count" in moved and moved["dma_count"].current > moved["dma_count"].baseline
    if flash and (more_bytes or more_dma):
        tips.append("more K/V traffic: a smaller block_size re-reads K and V more often in more, smaller "
                    "DMA transfers, and fusion=False round-trips the score matrix through HBM; "
                    "restore the larger block_size / fusion")
    else:
        if more_bytes:
            tips.append("more HBM traffic: check tiling and fusion of this op")
        if more_dma:
            tips.append("more DMA transfers: smaller tiles pay the MTE start-up cost more often; "
                        "use larger tiles and sizes aligned to 512 bytes")
    if not tips:
        tips.append("same work and traffic but slower: the kernel lost DMA/compute overlap "
                    "(check pipeline_stages) or its implementation or launch cost changed")
    if current is not None and baseline is not None:
        bound = memory_bound(current.mte2_ratio, current.mac_ratio, current.vec_ratio)
        before = memory_bound(baseline.mte2_ratio, baseline.mac_ratio, baseline.vec_ratio)
        if bound > 1 >= before:
            tips.append(f"the op became memory-bound (memory_bound {before:.2f} -> {bound:.2f}): DMA no "
                        "longer hides behind compute")
    return tips


def _call_sites(profile: Profile | None, op_type: str) -> list[tuple[str, float]]:
    if profile is None:
        return []
    times: dict[str, float] = {}
    for op in profile.ops:
        if op.op_type == op_type and op.step == 0:
            key = op.source or "<unknown>"
            times[key] = times.get(key, 0.0) + op.duration_s
    return sorted(times.items(), key=lambda kv: -kv[1])[:MAX_CALL_SITES]


def diagnose(
    comparison: RunComparison,
    profile: Profile | None = None,
    current: dict[str, OpStats] | None = None,
    baseline: dict[str, OpStats] | None = None,
) -> list[Finding]:
    """Findings for each regressed op type and each new one, biggest time first.

    ``current`` and ``baseline`` (op type -> stats) add the check for an op that became
    memory-bound.
    """
    findings = []
    step_s = comparison.baseline_step_s
    for v in comparison.verdicts:
        if v.status != "regressed" or v.baseline_s is None or v.current_s is None or v.op_type == "step":
            continue
        delta = v.current_s - v.baseline_s
        share = delta / step_s if step_s > 0 else 0.0
        counters = comparison.counters.get(v.op_type, [])
        findings.append(
            Finding(
                op_type=v.op_type,
                severity=_severity(share),
                delta_s=delta,
                step_share_frac=share,
                counters=counters,
                call_sites=_call_sites(profile, v.op_type),
                advice=_advice(v.op_type, counters, (current or {}).get(v.op_type), (baseline or {}).get(v.op_type)),
            )
        )
    step_regressed = any(v.op_type == "step" and v.status == "regressed" for v in comparison.verdicts)
    for v in comparison.verdicts:
        if v.status != "new" or v.current_s is None:
            continue
        share = v.current_s / step_s if step_s > 0 else 0.0
        findings.append(
            Finding(
                op_type=v.op_type,
                severity=_severity(share) if step_regressed else "minor",
                delta_s=v.current_s,
                step_share_frac=share,
                counters=[],
                call_sites=_call_sites(profile, v.op_type),
                advice=[(f"{v.op_type} is new: the baseline has no such op type; remove the call if it "
                         "was not intended, or accept it with --oam-save-baseline")],
                kind="new",
            )
        )
    findings.sort(key=lambda f: -f.delta_s)
    return findings

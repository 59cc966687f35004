"""Diagnosis of a regression: what regressed, which counters moved, where, how bad, what to do.

Pure functions over a :class:`~pytest_oam.compare.RunComparison` and the current profile.
Thresholds live in this module's constants.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.profile import Profile

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


def _severity(step_share: float) -> str:
    if step_share >= SEVERITY_CRITICAL_STEP_FRAC:
        return "critical"
    if step_share >= SEVERITY_MAJOR_STEP_FRAC:
        return "major"
    return "minor"


def _advice(op_type: str, counters: list[CounterChange]) -> list[str]:
    moved = {c.name: c for c in counters}
    tips = []
    if "count_per_step" in moved:
        tips.append(f"{op_type} now runs {moved['count_per_step'].current:g} times per step "
                    f"(was {moved['count_per_step'].baseline:g}): look for added or unfused calls")
    elif "flop" in moved:
        tips.append(f"{op_type} does more work: its input shapes changed; check the shapes at the call sites")
    if "hbm_bytes" in moved and moved["hbm_bytes"].current > moved["hbm_bytes"].baseline:
        if op_type.startswith("FlashAttention"):
            tips.append("more HBM traffic: a smaller block_size re-reads K/V more often, and fusion=False "
                        "round-trips the score matrix through HBM")
        else:
            tips.append("more HBM traffic: check tiling and fusion of this op")
    if "dma_count" in moved and moved["dma_count"].current > moved["dma_count"].baseline:
        tips.append("more DMA transfers: smaller tiles or blocks pay the MTE start-up cost more often; "
                    "use larger blocks and sizes aligned to 512 bytes")
    if not tips:
        tips.append("same work and traffic but slower: the kernel lost DMA/compute overlap "
                    "(check pipeline_stages) or its implementation or launch cost changed")
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


def diagnose(comparison: RunComparison, profile: Profile | None = None) -> list[Finding]:
    """Findings for each regressed op type, biggest time lost first."""
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
                advice=_advice(v.op_type, counters),
            )
        )
    findings.sort(key=lambda f: -f.delta_s)
    return findings

"""Which baseline run each profiled run of a test is compared with."""

from __future__ import annotations

import math


def run_identity(run) -> tuple:
    """What a run must share with the baseline run it is compared with, beyond its workload:
    hardware, card count and whether memory was modelled (``run``: a ``RunBaseline``)."""
    return (run.hardware, run.devices, run.memory_reserved_peak_bytes is not None)


def match_runs(baseline_runs: list, fingerprints: list[str], work: list[dict] | None = None,
               identities: list[tuple | None] | None = None) -> list[int | None]:
    """Pair each current run with a baseline run: same workload fingerprint and same identity
    (``identities``: per current run, :func:`run_identity` of its summary, or None) first, in
    order; then the same fingerprint alone; then each remaining run with the remaining baseline
    run whose work is closest (``work``: per current run, its summary's ``ops``, compared with
    the baseline run's), in order, or by position without ``work``. Identity first: a test that
    runs one workload on two cards (or with and without memory modelling) in another order was
    compared across them (newcomer finding: a 3x slowdown passed as incomparable, and an
    unchanged memory-modelled run failed against the plain one). Work, not time: the run that
    does the same work is the one to compare with, and pairing by time would pair a slowed run
    with a slower one (newcomer finding: a changed run was compared with the first spare
    baseline run, a 4x larger workload, and a 3x slowdown passed). Returns, per current run, a
    baseline index or None."""
    used: set[int] = set()
    matched: list[int | None] = [None] * len(fingerprints)
    for same_identity in ((True, False) if identities is not None else (False,)):
        for i, fp in enumerate(fingerprints):
            if matched[i] is not None:
                continue
            for j, run in enumerate(baseline_runs):
                if j in used or run.workload_fingerprint != fp:
                    continue
                if same_identity and (identities[i] is None or run_identity(run) != identities[i]):
                    continue
                matched[i] = j
                used.add(j)
                break
    spare = [j for j in range(len(baseline_runs)) if j not in used]
    for i in range(len(fingerprints)):
        if matched[i] is None and spare:
            if work is not None:
                spare.sort(key=lambda j: (work_distance(work[i], baseline_runs[j].ops), j))
            matched[i] = spare.pop(0)
    return matched


def work_distance(current_ops: dict, baseline_ops: dict) -> float:
    """How unlike two runs' work is: the sum over op types of |log| of the ratios of their FLOP
    and of their HBM bytes per step in which the op ran (``OpStats``; +1, so that an op type one
    run lacks counts by its size; bytes tell apart the ops that do no FLOP: copies, collectives)."""
    total = 0.0
    for op in set(current_ops) | set(baseline_ops):
        now, was = current_ops.get(op), baseline_ops.get(op)
        for name in ("flop", "hbm_bytes"):
            total += abs(math.log((getattr(now, name, 0.0) + 1.0) / (getattr(was, name, 0.0) + 1.0)))
    return total


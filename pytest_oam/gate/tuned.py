"""The tuned check: is each profiled call of an op type near the tuned optimum that the
knowledge base records for its shapes, dtype and hardware?"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.profile import Profile

    from ..tuning.knowledge_base import KnowledgeBase


@dataclass(frozen=True)
class TunedCheck:
    """What the tuned check of one test found: calls checked against a record, failures (each
    one line: a call too slow, a marker pattern that matched nothing, an unusable knowledge
    base), and notes (calls with no record, skipped)."""

    checked: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def tuned_check(
    profiles: Sequence[Profile],
    configs: Sequence[str | None],
    *,
    marker: Mapping[str, float],
    cli: Mapping[str, float],
    ini: Mapping[str, float],
    knowledge_base: Callable[[], KnowledgeBase],
    strict: bool = False,
    test_passed: bool = True,
) -> TunedCheck:
    """Judge each profiled call of an op type that has a tuned limit (``marker``, the test's
    ``tuned=``, then ``cli``, ``--oam-tuned-limit``, then ``ini``, ``oam_tuned_limits``; op type
    or glob -> fraction) against the knowledge base. A call more than its limit slower than the
    tuned optimum is a failure; a call with no current record is a note, or a failure when
    ``strict``. A marker pattern that matches no op type the test ran fails a passing test.

    Args:
        profiles: the test's profiled runs, in order.
        configs: per run, its arguments as text (to pick between records of one shape), or None.
        knowledge_base: reads the knowledge base (called only when there are profiles).
    """
    from ..judge.thresholds import LimitResolver
    from ..tuning.knowledge_base import KnowledgeBaseError, check_near_tuned

    layers = tuple((name, limits) for name, limits in (
        ("marker", marker), ("command line", cli), ("ini", ini)) if limits)
    if not layers:
        return TunedCheck()
    resolver = LimitResolver(layers)
    failures: list[str] = []
    notes: list[str] = []
    checked = 0
    op_types = sorted({op for profile in profiles for op in profile.op_types})
    unmatched = [pattern for pattern in marker if not any(fnmatchcase(op, pattern) for op in op_types)]
    if unmatched and test_passed:
        failures.append(f"@pytest.mark.oam(tuned=...): {', '.join(unmatched)} matches no op type of the test's "
                        f"profiled runs (op types: {', '.join(op_types) or 'none: no oam_profile.run'})")
    try:
        kb = knowledge_base() if profiles else None
    except KnowledgeBaseError as exc:
        failures.append(f"the knowledge base cannot be used: {exc}")
        kb = None
    for index, profile in enumerate(profiles if kb is not None else []):
        run = f"run {index + 1}: " if len(profiles) > 1 else ""
        for op_type in profile.op_types:
            try:
                limit = resolver.resolve(op_type)
            except LookupError:
                continue
            try:
                checks = check_near_tuned(profile, op_type, kb, limit_frac=limit.frac, config_text=configs[index])
            except ValueError as exc:  # an ambiguous record match
                failures.append(f"{run}{exc}")
                continue
            for check in checks:
                if check.status == "slower":
                    failures.append(f"{run}{check.message}")
                elif check.status == "no-record":
                    (failures if strict else notes).append(f"{run}{check.message}")
                checked += check.status != "no-record"
    return TunedCheck(checked, failures, notes)

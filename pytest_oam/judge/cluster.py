"""Slow ranks of a job from every rank's step split (:mod:`pytest_oam.files.step_trace`), as
msprof-analyze's slow-rank analysis reads its ``cluster_step_trace_time.csv``: per rank,
computing, exposed communication and free time, and which of them makes a rank slower than the
others. Pure: no pytest, no reports, no simulator runtime.

Ranks are compared only within their pipeline stage: ranks of another stage run other layers,
so their times differ by design, and the stage that waits for the others to send (the pipeline
bubble: its ``Bubble`` time, the receives) is named once, not as slow ranks. The stages come
from the input (the file's ``PP Index`` column or ``stage`` rows, or each rank folder's
``profiler_metadata.json``); without them they are inferred from the bubble: ranks whose
receive time differs by more than the threshold (a share of the step) are in different stages.

A rank is slow, in one step, when its computing, its exposed communication without the
pipeline's receives (``Communication(Not Overlapped)`` - ``Bubble``; waiting for another stage is
not this rank's slowness) or its free time exceeds the median of the other ranks of its stage
by more than ``threshold_frac`` of the stage's median step time, or when its whole step does
(the others' median, not the stage's: of two ranks the stage's median is their midpoint, half
a slow rank's lead). The time over it is what the rank costs the others: in a synchronous job
they wait that long for it.
A stage of one rank has nothing to compare with.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field

from ..files.step_trace import ClusterTrace, RankStep

#: The parts of a step that make a rank slow (msprof-analyze's slow-rank dimensions: Computing,
#: Communication, Free), with what a rank slow in each should look at.
CAUSES = {
    "computing": ("computing", ("this rank computes longer than its stage's others: more work on it (uneven "
                  "sequence lengths or batch, a skewed expert or vocabulary split) or a slower card (npu-smi: "
                  "AI Core clock, temperature, HBM errors)")),
    "communication": ("communication", ("this rank's communication is exposed longer (pipeline receives left out): "
                      "slower links (check them in cluster_communication_matrix.json, hccn_tool) or it waits for a "
                      "rank of another group")),
    "free": ("free/host time", ("this rank's device idles longer: its host is slower (CPU contention or binding, "
             "data loading, Python garbage collection, synchronisation, operator dispatch)")),
}


#: The causes that are a rank's own work; exposed communication may be waiting for another rank.
_OWN_WORK = ("computing", "free")


def _part_s(step: RankStep, cause: str) -> float:
    """The time of ``cause`` in ``step``, seconds."""
    t = step.trace
    if cause == "computing":
        return t.computing_s
    if cause == "communication":
        return max(0.0, t.communication_exposed_s - t.bubble_s)
    return t.free_s


@dataclass(frozen=True)
class RankVerdict:
    """One rank in one step: its figures, its stage, and by how much it exceeds the medians of
    the other ranks of its stage (``excess_s``: per cause of :data:`CAUSES` and ``step``, seconds;
    negative below)."""

    step: RankStep
    stage: int
    excess_s: dict[str, float]
    slow_causes: list[str] = field(default_factory=list)

    @property
    def slow(self) -> bool:
        return bool(self.slow_causes)

    def others_median_s(self, cause: str) -> float:
        """The median of ``cause`` (of :data:`CAUSES`) over the other ranks of the stage, seconds."""
        return _part_s(self.step, cause) - self.excess_s[cause]


@dataclass(frozen=True)
class StageSummary:
    """A pipeline stage in one step: its ranks and their medians (seconds)."""

    index: int
    step_id: str
    ranks: tuple[int, ...]
    median_step_s: float
    median_s: dict[str, float]
    median_bubble_s: float


@dataclass(frozen=True)
class ClusterAnalysis:
    """The slow-rank analysis of a job (see the module's docstring)."""

    trace: ClusterTrace
    threshold_frac: float
    stage_source: str
    verdicts: list[RankVerdict]
    stages: list[StageSummary]

    @property
    def slow_ranks(self) -> list[int]:
        """Ranks slow in any step, ascending."""
        return sorted({v.step.rank for v in self.verdicts if v.slow})

    @property
    def bubble_stage(self) -> StageSummary | None:
        """The stage with the largest median bubble (its receives wait for the stages before
        it), over the steps; ``None`` when no stage has any."""
        with_bubble = [s for s in self.stages if s.median_bubble_s > 0]
        return max(with_bubble, key=lambda s: s.median_bubble_s / s.median_step_s if s.median_step_s else 0.0,
                   default=None)


def infer_stages(steps: list[RankStep], threshold_frac: float) -> list[tuple[int, ...]]:
    """Pipeline stages from the figures alone: the ranks ordered by their median bubble (the
    receive time, which a rank's stage decides) and split where two neighbours differ by more
    than ``threshold_frac`` of the median step time. All ranks without a bubble: one stage."""
    per_rank: dict[int, list[RankStep]] = {}
    for s in steps:
        per_rank.setdefault(s.rank, []).append(s)
    bubble = {r: statistics.median(s.trace.bubble_s for s in ss) for r, ss in per_rank.items()}
    gap_s = threshold_frac * statistics.median(s.trace.step_s for s in steps)
    ordered = sorted(bubble, key=lambda r: (bubble[r], r))
    groups: list[list[int]] = [[ordered[0]]]
    for previous, rank in itertools.pairwise(ordered):
        if bubble[rank] - bubble[previous] > gap_s:
            groups.append([])
        groups[-1].append(rank)
    return [tuple(sorted(g)) for g in groups]


def analyze_cluster(trace: ClusterTrace, threshold_frac: float) -> ClusterAnalysis:
    """Group the ranks by stage and name the slow ones, step by step.

    Raises:
        ValueError: ``threshold_frac`` negative, or a rank of the input in no stage of the
            input's stage list (naming it).
    """
    if not threshold_frac >= 0:
        raise ValueError(f"threshold must be >= 0, got {threshold_frac!r}")
    if trace.stages:
        stages, source = trace.stages, trace.stage_source or "the input"
    else:
        stages = infer_stages(trace.ranks, threshold_frac)
        source = ("the figures (inferred: the input names no stage, and every rank's bubble is alike: one stage)"
                  if len(stages) == 1 else "the ranks' bubble (receive) times (inferred: the input names no stage)")
    stage_of = {rank: i for i, stage in enumerate(stages) for rank in stage}
    unstaged = sorted({s.rank for s in trace.ranks} - set(stage_of))
    if unstaged:
        raise ValueError(f"{trace.path}: rank {unstaged[0]} is in no stage of {source} ({stages})")
    verdicts: list[RankVerdict] = []
    summaries: list[StageSummary] = []
    step_ids = list(dict.fromkeys(s.step_id for s in trace.ranks))
    for step_id in step_ids:
        for index, stage in enumerate(stages):
            members = [s for s in trace.ranks if s.step_id == step_id and s.rank in stage]
            if not members:
                continue
            median_s = {cause: statistics.median(_part_s(m, cause) for m in members) for cause in CAUSES}
            median_step_s = statistics.median(m.trace.step_s for m in members)
            summaries.append(StageSummary(index, step_id, tuple(sorted(m.rank for m in members)), median_step_s,
                                          median_s, statistics.median(m.trace.bubble_s for m in members)))
            limit_s = threshold_frac * median_step_s
            excesses = {}
            for m in members:
                # against the others of its stage, not a median it is part of: of two ranks the
                # median is their midpoint, which halved a slow rank's lead (and missed it)
                others = [o for o in members if o is not m] or [m]
                excess = {cause: _part_s(m, cause) - statistics.median(_part_s(o, cause) for o in others)
                          for cause in CAUSES}
                excess["step"] = m.trace.step_s - statistics.median(o.trace.step_s for o in others)
                excesses[m.rank] = excess
            # a rank slow by its own work (computing, host) makes the others of its group wait in
            # their collectives: their longer communication is that wait, not a slowness of theirs
            own_work_slow = any(excesses[m.rank][c] > limit_s for m in members for c in _OWN_WORK)
            for m in sorted(members, key=lambda m: m.rank):
                excess = excesses[m.rank]
                causes = [c for c in sorted(CAUSES, key=lambda c: -excess[c]) if excess[c] > limit_s]
                if not causes and excess["step"] > limit_s:  # slow in all, by no one part alone
                    causes = [c for c in sorted(CAUSES, key=lambda c: -excess[c]) if excess[c] > 0][:2]
                if own_work_slow and not any(c in _OWN_WORK for c in causes):
                    causes = []  # only waiting for the slow rank
                verdicts.append(RankVerdict(m, index, excess, causes if len(members) > 1 else []))
    return ClusterAnalysis(trace, threshold_frac, source, verdicts, summaries)

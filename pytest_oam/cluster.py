"""``oam cluster PATH``: every rank of a job side by side, the slow ranks named with why, and the
pipeline stage with the bubble (:mod:`pytest_oam.judge.cluster`), as text, Markdown or JSON.

PATH is msprof-analyze's ``cluster_step_trace_time.csv``, a folder holding it (or its
``cluster_analysis_output``), or a folder of torch_npu rank folders (``*_ascend_pt``)
(:func:`pytest_oam.files.step_trace.read_cluster`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .format import fmt_ms, fmt_percent, table_cell
from .judge.cluster import CAUSES, ClusterAnalysis, StageSummary, analyze_cluster

#: Version of :func:`cluster_json`'s output.
CLUSTER_SCHEMA_VERSION = 1
#: What to do about a pipeline bubble.
BUBBLE_ADVICE = ("more micro-batches per step, an interleaved (virtual pipeline) schedule, or layers moved "
                 "between stages so that they compute alike (each stage's median computing above)")


def cluster_analysis(path: str | Path, threshold_frac: float) -> ClusterAnalysis:
    """Read the job at ``path`` and analyse it (see the module's docstring).

    Raises:
        ImportError_: not a cluster file or rank folders, or a bad file (a ``ValueError``
            naming the file and what is wrong).
        ValueError: a negative threshold, or a rank in no stage.
    """
    from .files.step_trace import read_cluster

    return analyze_cluster(read_cluster(path), threshold_frac)


def ranks_text(ranks: tuple[int, ...] | list[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``"0-3, 8"``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)


def _stage_name(s: StageSummary) -> str:
    return f"stage {s.index} (ranks {ranks_text(s.ranks)})"


def cluster_text(analysis: ClusterAnalysis, fmt: str = "simple") -> str:
    """The per-rank table (``fmt``: a tabulate format, ``github`` for Markdown), the stages, the
    stage with the bubble and the slow ranks with why."""
    from tabulate import tabulate

    several_steps = len({v.step.step_id for v in analysis.verdicts}) > 1
    stage_of = {(s.step_id, s.index): s for s in analysis.stages}
    rows = []
    for v in analysis.verdicts:
        t, stage = v.step.trace, stage_of[(v.step.step_id, v.stage)]
        worst = max(CAUSES, key=lambda c: v.excess_s[c])
        over = (f"{CAUSES[worst][0]} +{fmt_percent(v.excess_s[worst] / stage.median_step_s, 1)}"
                if v.excess_s[worst] > 0 and stage.median_step_s > 0 and len(stage.ranks) > 1 else "-")
        rows.append([*([table_cell(v.step.step_id, fmt)] if several_steps else []), v.step.rank, v.stage,
                     fmt_ms(t.computing_s, 1), fmt_ms(t.communication_exposed_s, 1), fmt_ms(t.bubble_s, 1),
                     fmt_ms(t.overlapped_s, 1), fmt_ms(t.free_s, 1), fmt_ms(t.step_s, 1), over,
                     "SLOW: " + ", ".join(CAUSES[c][0] for c in v.slow_causes) if v.slow else ""])
    headers = [*(["step"] if several_steps else []), "rank", "stage", "computing", "comm. exposed", "bubble",
               "overlapped", "free", "step", "most over the others' median (of step)", "verdict"]
    ranks = sorted({v.step.rank for v in analysis.verdicts})
    stages = len({s.index for s in analysis.stages})
    lines = [(f"{table_cell(analysis.trace.path, fmt)}: {len(ranks)} rank{'s' if len(ranks) > 1 else ''}, {stages} "
             f"pipeline stage{'s' if stages > 1 else ''}; stages from {analysis.stage_source}"),
             tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True), ""]
    for s in analysis.stages:
        bubble = (f"bubble {fmt_ms(s.median_bubble_s, 1)} ({fmt_percent(s.median_bubble_s / s.median_step_s)})"
                  if s.median_bubble_s > 0 and s.median_step_s > 0 else "no bubble")
        lines.append(f"{_stage_name(s)}{f', step {s.step_id}' if several_steps else ''}: median step "
                     f"{fmt_ms(s.median_step_s, 1)}, computing {fmt_ms(s.median_s['computing'], 1)}, {bubble}")
    bubble_stage = analysis.bubble_stage
    if bubble_stage is None:
        lines.append("pipeline bubble: none (no stage waits to receive)")
    else:
        lines.append(f"pipeline bubble: {_stage_name(bubble_stage)} waits {fmt_ms(bubble_stage.median_bubble_s, 1)} "
                     f"per step ({fmt_percent(bubble_stage.median_bubble_s / bubble_stage.median_step_s)} of its step) "
                     f"to receive from the stage before it; what to do: {BUBBLE_ADVICE}")
    limit = fmt_percent(analysis.threshold_frac, None)
    slow = [v for v in analysis.verdicts if v.slow]
    if not slow:
        lines.append(f"slow ranks: none (no rank more than {limit} of its stage's median step over the median of the others of its stage)")
    for v in slow:
        stage = stage_of[(v.step.step_id, v.stage)]
        why = "; ".join(
            f"{CAUSES[c][0]} +{fmt_ms(v.excess_s[c], 1)} over the others' median {fmt_ms(v.others_median_s(c), 1)} "
            f"({fmt_percent(v.excess_s[c] / stage.median_step_s, 1)} of its {fmt_ms(stage.median_step_s, 1)} step)"
            for c in v.slow_causes)
        lines.append(f"SLOW rank {v.step.rank} ({_stage_name(stage)}{f', step {v.step.step_id}' if several_steps else ''}"
                     f"): {why}: {CAUSES[v.slow_causes[0]][1]}")
    return "\n".join(lines)


def cluster_json(analysis: ClusterAnalysis) -> str:
    """The analysis as JSON (seconds, fractions): ``slow_ranks`` (rank numbers), ``ranks`` (each
    rank's figures per step, its stage, its excess over the medians of the others of its stage and why it is slow),
    ``stages``, ``bubble_stage`` (a stage index or ``null``)."""
    bubble = analysis.bubble_stage
    data = {
        "schema_version": CLUSTER_SCHEMA_VERSION,
        "source": str(analysis.trace.path),
        "threshold_frac": analysis.threshold_frac,
        "stage_source": analysis.stage_source,
        "slow_ranks": analysis.slow_ranks,
        "bubble_stage": None if bubble is None else bubble.index,
        "stages": [{"stage": s.index, "step": s.step_id, "ranks": list(s.ranks), "median_step_s": s.median_step_s,
                    "median_bubble_s": s.median_bubble_s,
                    **{f"median_{cause}_s": value for cause, value in s.median_s.items()}} for s in analysis.stages],
        "ranks": [{"rank": v.step.rank, "step": v.step.step_id, "stage": v.stage,
                   **v.step.trace.model_dump(exclude={"step"}), "step_s": v.step.trace.step_s,
                   "excess_s": v.excess_s, "slow": v.slow, "why": v.slow_causes} for v in analysis.verdicts],
    }
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False)

"""How each step's time splits, per rank: the torch_npu profiler's ``step_trace_time.csv``
(``ASCEND_PROFILER_OUTPUT``, one rank) and msprof-analyze's ``cluster_step_trace_time.csv``
(``cluster_analysis_output``, every rank of a job), read into
:class:`~simulator.profile.StepTrace` records in seconds.

Columns, in microseconds in both files (msprof-analyze's names): ``Computing``,
``Communication(Not Overlapped)``, ``Overlapped``, ``Communication``, ``Free``, ``Stage``,
``Bubble`` (the time of the pipeline's receives), ``Communication(Not Overlapped and Exclude
Receive)`` and, in newer versions, ``Preparing``. A rank's step lasts Computing +
Communication(Not Overlapped) + Free (= Stage + Bubble). The cluster file adds ``Type`` (``rank``
rows, and ``stage`` rows whose ``Index`` lists the ranks of one pipeline stage) and, when the
job's ``profiler_metadata.json`` gave the parallel layout, ``PP Index`` (a rank's pipeline stage).

A job's rank folders (``*_ascend_pt``, each with ``ASCEND_PROFILER_OUTPUT/step_trace_time.csv``)
read as the cluster file would: a folder's rank comes from its ``profiler_info_<rank>.json``, its
pipeline stage from the ``pp`` group of ``profiler_metadata.json``'s ``parallel_group_info``
(the rank's place in its pipeline group), as msprof-analyze reads them.

Every problem is an :class:`~pytest_oam.files.realfile.ImportError_` (a ``ValueError``) naming the
file, what kind of file it should be, and the line or column at fault.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from simulator.profile import StepTrace
from simulator.units import S_PER_US

from .realfile import ImportError_, csv_rows, number, read_text, step_key

STEP_TRACE_FILE = "step_trace_time.csv"
CLUSTER_FILE = "cluster_step_trace_time.csv"
#: What each file is, for the messages.
STEP_TRACE_KIND = "a torch_npu step_trace_time.csv"
CLUSTER_KIND = "an msprof-analyze cluster_step_trace_time.csv"
#: :class:`~simulator.profile.StepTrace` field -> the column it is read from (microseconds).
COLUMNS = {
    "computing_s": "Computing",
    "communication_exposed_s": "Communication(Not Overlapped)",
    "overlapped_s": "Overlapped",
    "communication_s": "Communication",
    "free_s": "Free",
    "bubble_s": "Bubble",
    "preparing_s": "Preparing",
}
#: The columns every version of both files has; the others are 0 when absent.
REQUIRED = ("computing_s", "communication_exposed_s", "free_s")


@dataclass(frozen=True)
class RankStep:
    """One rank's split of one step of a job. ``step_id`` is the profiler's step number as the
    file gives it (text; empty when the run marked no steps); ``pp_stage`` the rank's pipeline
    stage when the file or the rank's metadata says (``None`` otherwise)."""

    rank: int
    step_id: str
    trace: StepTrace
    pp_stage: int | None = None


@dataclass(frozen=True)
class ClusterTrace:
    """Every rank's step split of a job, and its pipeline stages when known.

    ``stages`` are the ranks of each stage, first stage first; ``stage_source`` says where they
    came from (``None`` when nothing in the input names them: the analysis infers them).
    """

    path: Path
    ranks: list[RankStep]
    stages: list[tuple[int, ...]]
    stage_source: str | None


# -- reading the CSV text -----------------------------------------------------------------------


def _text(path: Path, kind: str) -> str:
    """The file's text (UTF-8, with or without a byte-order mark); an empty, mis-encoded, cut
    or other kind of file is said as :mod:`.file_kinds` says it for every profiler file."""
    from .file_kinds import csv_problem

    text = read_text(path)
    problem = csv_problem(path, text, {kind}) if path.suffix.lower() == ".csv" else None
    if problem:
        raise ImportError_(problem)
    if not text.strip():
        raise ImportError_(f"{path}: is empty; expected {kind}")
    return text


def _rows(path: Path, kind: str, required: list[str]) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """(header, [(line, row)]) of a CSV that must have the ``required`` columns and a row."""
    header, rows = csv_rows(path, _text(path, kind), kind)
    missing = [c for c in required if c not in header]
    if missing:
        raise ImportError_(f"{path}: no {', '.join(map(repr, missing))} column: not {kind} "
                           f"(columns: {', '.join(header[:8])}{' ...' if len(header) > 8 else ''})")
    if not rows:
        raise ImportError_(f"{path}: holds no step rows; {kind} has one row per step")
    return header, rows


def _trace(path: Path, line: int, row: dict[str, str], header: list[str], step: int) -> StepTrace:
    values = {}
    for field, column in COLUMNS.items():
        if column not in header:
            continue
        where = f"line {line}, column {column!r}"
        value = number(row[column], path, where, None if field in REQUIRED else 0.0)
        if value < 0:
            raise ImportError_(f"{path}: {where}: negative time {value:g} us")
        values[field] = value * S_PER_US  # not display: the file's microseconds read into seconds
    return StepTrace(step=step, **values)


# -- one rank ---------------------------------------------------------------------------------


def read_step_trace(path: str | Path) -> list[tuple[str, StepTrace]]:
    """The steps of one rank's ``step_trace_time.csv``: (the file's step id, the split), in step
    order, ``StepTrace.step`` numbered from 0 in that order (as the kernel importers number
    ``Step Id``). A file without a ``Step`` column is one step.

    Raises:
        ImportError_: unreadable, empty, not UTF-8, a required column missing, a truncated row,
            a number that is not one, a negative time, or a step given twice.
    """
    path = Path(path)
    header, rows = _rows(path, STEP_TRACE_KIND, [COLUMNS[f] for f in REQUIRED])
    ids = [row["Step"].strip() if "Step" in header else "" for _, row in rows]
    repeated = sorted({s for s in ids if ids.count(s) > 1})
    if repeated:
        raise ImportError_(f"{path}: step {repeated[0] or '(empty)'} appears in more than one row; {STEP_TRACE_KIND} "
                           "has one row per step (a cluster_step_trace_time.csv goes to oam cluster)")
    order = sorted(range(len(rows)), key=lambda i: step_key(ids[i]))
    return [(ids[i], _trace(path, rows[i][0], rows[i][1], header, k)) for k, i in enumerate(order)]


def step_trace_for(kernel_step_ids: list[str] | None, path: str | Path) -> list[StepTrace]:
    """The splits of the ``step_trace_time.csv`` at ``path`` numbered as the kernel importer
    numbered the steps of its ``kernel_details.csv``, whose ``Step Id`` of step ``k`` is
    ``kernel_step_ids[k]`` (:attr:`.importers.AscendCsv.step_ids`): by matching ``Step Id``, or
    in order when the kernel file has no such column (``None``). Steps the kernels did not run
    in are left out.

    Raises:
        ImportError_: see :func:`read_step_trace`; or no step of the file is one the kernels ran in.
    """
    steps = read_step_trace(path)
    if kernel_step_ids is None:
        return [trace for _, trace in steps]
    index = {step_id: i for i, step_id in enumerate(kernel_step_ids)}
    kept = [trace.model_copy(update={"step": index[step_id]}) for step_id, trace in steps if step_id in index]
    if not kept and steps:
        if len(steps) == len(kernel_step_ids) == 1:  # one step each: the same step, however numbered
            return [steps[0][1].model_copy(update={"step": 0})]
        raise ImportError_(f"{path}: steps {', '.join(s for s, _ in steps)} are none of the kernel file's steps "
                           f"({', '.join(kernel_step_ids)}): not the same collection")
    return kept


# -- a job: the cluster file or the rank folders ------------------------------------------------------


def _ranks_of(text: str, path: Path, line: int) -> tuple[int, ...]:
    ranks = tuple(int(r) for r in re.findall(r"\d+", text))
    if not ranks:
        raise ImportError_(f"{path}: line {line}: a stage row whose Index {text!r} lists no rank")
    return ranks


def read_cluster_file(path: str | Path) -> ClusterTrace:
    """msprof-analyze's ``cluster_step_trace_time.csv``: its ``rank`` rows, its pipeline stages
    from the ``PP Index`` column when it has one, else from its ``stage`` rows.

    Raises:
        ImportError_: unreadable, empty, not UTF-8, not that file (no ``Type`` / ``Index``
            column, no rank row), a truncated row, a bad number, a rank given twice for a step.
    """
    path = Path(path)
    header, rows = _rows(path, CLUSTER_KIND, ["Type", "Index", *(COLUMNS[f] for f in REQUIRED)])
    ranks: list[RankStep] = []
    stage_rows: list[tuple[int, ...]] = []
    seen: set[tuple[str, int]] = set()
    step_ids = sorted({row.get("Step", "").strip() for _, row in rows}, key=step_key)
    for line, row in rows:
        kind, index = row["Type"].strip().lower(), row["Index"].strip()
        step_id = row["Step"].strip() if "Step" in header else ""
        if kind == "stage":
            stage = _ranks_of(index, path, line)
            if stage not in stage_rows:
                stage_rows.append(stage)
            continue
        if kind != "rank":
            raise ImportError_(f"{path}: line {line}: Type {row['Type']!r} is neither 'rank' nor 'stage'")
        if not re.fullmatch(r"\d+", index):
            raise ImportError_(f"{path}: line {line}: rank row with Index {index!r}, not a rank number")
        if (step_id, int(index)) in seen:
            raise ImportError_(f"{path}: line {line}: rank {index} appears twice for step {step_id or '(none)'}")
        seen.add((step_id, int(index)))
        pp = row.get("PP Index", "").strip()
        ranks.append(RankStep(rank=int(index), step_id=step_id,
                              trace=_trace(path, line, row, header, step_ids.index(step_id)),
                              pp_stage=int(pp) if re.fullmatch(r"\d+", pp) else None))
    if not ranks:
        raise ImportError_(f"{path}: holds no 'rank' row; {CLUSTER_KIND} has one per rank and step")
    if all(r.pp_stage is not None for r in ranks):
        return ClusterTrace(path, ranks, _stages_of(ranks), "the file's PP Index column")
    stages = sorted(stage_rows, key=min)
    listed = [r for stage in stages for r in stage]
    if stages and len(listed) != len(set(listed)):
        raise ImportError_(f"{path}: a rank is in two stage rows: {stages}")
    return ClusterTrace(path, ranks, stages, "the file's stage rows" if stages else None)


def _stages_of(ranks: list[RankStep]) -> list[tuple[int, ...]]:
    by_stage: dict[int, set[int]] = {}
    for r in ranks:
        by_stage.setdefault(r.pp_stage, set()).add(r.rank)
    return [tuple(sorted(by_stage[s])) for s in sorted(by_stage)]


def _rank_of(folder: Path) -> int:
    """A rank folder's rank: its ``profiler_info_<rank>.json`` (msprof-analyze's source), else
    ``profiler_metadata.json``'s ``distributed_args.rank``."""
    found = sorted(int(m.group(1)) for p in folder.glob("profiler_info_*.json")
                   if (m := re.fullmatch(r"profiler_info_(\d+)\.json", p.name)))
    if len(found) == 1:
        return found[0]
    rank = profiler_metadata(folder).get("distributed_args", {}).get("rank") if not found else None
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return rank
    what = "several profiler_info_<rank>.json files" if found else "no profiler_info_<rank>.json"
    raise ImportError_(f"{folder}: {what}, and no distributed_args.rank in profiler_metadata.json: "
                       "cannot tell which rank this torch_npu output folder is")


def profiler_metadata(folder: str | Path) -> dict:
    """The folder's ``profiler_metadata.json`` (``{}`` without one).

    Raises:
        ImportError_: not UTF-8 or not valid JSON, naming the file.
    """
    folder = Path(folder)
    path = folder / "profiler_metadata.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(_text(path, "a torch_npu profiler_metadata.json"))
    except (ValueError, RecursionError) as exc:
        raise ImportError_(f"{path}: is not valid JSON ({exc}); expected a torch_npu profiler_metadata.json") from None
    return data if isinstance(data, dict) else {}


def _pp_stage(folder: Path) -> int | None:
    """The rank's pipeline stage: its place (``group_rank``) in its ``pp`` group of
    ``parallel_group_info`` (Megatron names the group ``pp``); ``None`` without one."""
    groups = profiler_metadata(folder).get("parallel_group_info")
    if not isinstance(groups, dict):
        return None
    for group in groups.values():
        if isinstance(group, dict) and group.get("group_name") == "pp":
            stage = group.get("group_rank")
            return stage if isinstance(stage, int) and not isinstance(stage, bool) and stage >= 0 else None
    return None


def _rank_folders(path: Path) -> list[Path]:
    """The torch_npu output folders directly under ``path`` that hold a step_trace_time.csv."""
    found = []
    for child in sorted(p for p in path.iterdir() if p.is_dir()):
        if (child / "ASCEND_PROFILER_OUTPUT" / STEP_TRACE_FILE).is_file():
            found.append(child)
        elif child.name.endswith("_ascend_pt"):
            raise ImportError_(f"{child}: a torch_npu output folder without ASCEND_PROFILER_OUTPUT/{STEP_TRACE_FILE} "
                               "(export the profile as text, with torch_npu's step marking)")
    return found


def read_cluster(path: str | Path) -> ClusterTrace:
    """A job's step splits from ``path``: a ``cluster_step_trace_time.csv``, a folder holding
    one (or its ``cluster_analysis_output``), or a folder of rank folders (``*_ascend_pt``).

    Raises:
        ImportError_: nothing of the kind there, a bad file (see :func:`read_cluster_file`,
            :func:`read_step_trace`), a rank folder whose rank cannot be told, a rank twice.
    """
    path = Path(path)
    if not path.exists():
        raise ImportError_(f"{path}: no such file or folder")
    if not path.is_dir():
        if path.name == STEP_TRACE_FILE:
            raise ImportError_(f"{path}: is one rank's step_trace_time.csv; oam cluster reads the job's "
                               f"{CLUSTER_FILE} (msprof-analyze cluster) or the folder of its rank folders")
        return read_cluster_file(path)
    for candidate in (path / CLUSTER_FILE, path / "cluster_analysis_output" / CLUSTER_FILE):
        if candidate.is_file():
            return read_cluster_file(candidate)
    folders = _rank_folders(path)
    if not folders:
        raise ImportError_(f"{path}: a folder without {CLUSTER_FILE} and without rank folders (*_ascend_pt with "
                           f"ASCEND_PROFILER_OUTPUT/{STEP_TRACE_FILE})")
    ranks: list[RankStep] = []
    where: dict[int, Path] = {}
    for folder in folders:
        rank = _rank_of(folder)
        if rank in where:
            raise ImportError_(f"{folder}: rank {rank} again (also {where[rank]})")
        where[rank] = folder
        stage = _pp_stage(folder)
        ranks += [RankStep(rank, step_id, trace, stage)
                  for step_id, trace in read_step_trace(folder / "ASCEND_PROFILER_OUTPUT" / STEP_TRACE_FILE)]
    if all(r.pp_stage is not None for r in ranks):
        return ClusterTrace(path, ranks, _stages_of(ranks), "each rank's profiler_metadata.json (pp group)")
    return ClusterTrace(path, ranks, [], None)

"""``oam cluster``: every rank of a job side by side from msprof-analyze's
cluster_step_trace_time.csv (or a folder of rank folders), the pipeline stage with the bubble,
and the slow ranks named with why, each rank compared only within its pipeline stage.

Data: the real 16-rank, 2-stage cluster output of tests/data/realdata (SOURCES.md 12a), and copies
of it (one rank's free time doubled; the stage rows left out; the ranks as torch_npu rank folders).
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from pytest_oam.cli import main
from pytest_oam.cluster import cluster_analysis, ranks_text
from pytest_oam.files.step_trace import read_cluster
from pytest_oam.judge.cluster import analyze_cluster

DATA = Path(__file__).parent / "data" / "realdata"
CLUSTER = DATA / "ascend-msinsight-cluster16-analysis" / "cluster_step_trace_time.csv"
METADATA = DATA / "ascend-msinsight-llm-pp2dp2-level2-rank0" / "profiler_metadata.json"


def rows() -> list[list[str]]:
    with CLUSTER.open(newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def write(path: Path, table: list[list[str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\n").writerows(table)
    return path


def doubled_free(tmp_path: Path, rank: int = 13, keep_stage_rows: bool = True) -> Path:
    """The cluster file with ``rank``'s Free doubled (and its stage rows, or not)."""
    table = rows()
    free = table[0].index("Free")
    for row in table[1:]:
        if row[1] == "rank" and row[2] == str(rank):
            row[free] = repr(2 * float(row[free]))
    return write(tmp_path / "cluster_step_trace_time.csv",
                 [r for r in table if keep_stage_rows or r[1] != "stage"])


def test_the_real_cluster_prints_every_rank_names_the_bubble_and_no_slow_rank(capsys) -> None:
    assert main(["cluster", str(CLUSTER)]) == 0
    out = capsys.readouterr().out
    assert "16 ranks, 2 pipeline stages; stages from the file's stage rows" in out
    table = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [int(cells[0]) for cells in table] == list(range(16))
    assert [int(cells[1]) for cells in table] == [0] * 8 + [1] * 8
    # rank 8: Computing 80072.45, Communication(Not Overlapped) 216680.96, Bubble 178320.26, Free 77320.24 (us)
    assert " ".join(table[8][2:12]) == "80.1 ms 216.7 ms 178.3 ms 7.9 ms 77.3 ms"
    # stage 1's Bubble: the median of ranks 8-15 = (179363.10 + 179892.01) / 2 us = 179.6 ms; its median
    # step (Computing + Communication(Not Overlapped) + Free, rank 10's and 12's) = (380463.88 + 380913.22) / 2 us
    # = 380.7 ms; 179.6 / 380.7 = 47%
    assert "pipeline bubble: stage 1 (ranks 8-15) waits 179.6 ms per step (47% of its step)" in out
    assert "stage 0 (ranks 0-7): median step 293.1 ms, computing 75.4 ms, no bubble" in out
    assert "slow ranks: none" in out


def test_a_rank_with_doubled_free_time_is_named_slow_for_its_host(tmp_path, capsys) -> None:
    path = doubled_free(tmp_path)
    assert main(["cluster", str(path)]) == 1
    out = capsys.readouterr().out
    # rank 13's Free 92698.58 us doubled is 185397.16 us; the median Free of the 7 others of stage 1
    # is their 4th, 83428.83 us: +101968.33 us, 26.8% of the stage's median step of 380.7 ms
    assert ("SLOW rank 13 (stage 1 (ranks 8-15)): free/host time +102.0 ms over the others' median 83.4 ms "
            "(26.8% of its 380.7 ms step): this rank's device idles longer: its host is slower") in out
    assert out.count("SLOW") == 2  # its table row and its line
    assert main(["cluster", str(path), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["slow_ranks"] == [13] and data["bubble_stage"] == 1
    rank13 = next(r for r in data["ranks"] if r["rank"] == 13)
    assert rank13["why"] == ["free"] and rank13["excess_s"]["free"] == pytest.approx(0.10196833, abs=1e-8)
    assert rank13["free_s"] == pytest.approx(0.18539716, abs=1e-8) and rank13["stage"] == 1
    assert {r["rank"] for r in data["ranks"]} == set(range(16))
    assert main(["cluster", str(path), "--threshold", "30%"]) == 0  # 26.8% is within 30%
    assert "slow ranks: none" in capsys.readouterr().out


def test_ranks_are_compared_within_their_stage_only() -> None:
    trace = read_cluster(CLUSTER)
    assert analyze_cluster(trace, 0.10).slow_ranks == []
    # As one group every rank would be "slow": stage 1's for their steps (374-394 ms: that stage waits
    # 180 ms in its bubble) far above the 16 ranks' median, stage 0's for their exposed communication
    # (143-161 ms against 29-38 ms in stage 1, whose exposed communication is mostly receives)
    whole = analyze_cluster(type(trace)(trace.path, trace.ranks, [tuple(range(16))], "one group"), 0.10)
    assert whole.slow_ranks == list(range(16))
    assert {c for v in whole.verdicts if v.stage == 0 and v.step.rank < 8 for c in v.slow_causes} == {"communication"}


def test_without_stage_rows_the_stages_are_inferred_from_the_bubble(tmp_path, capsys) -> None:
    path = doubled_free(tmp_path, keep_stage_rows=False)
    analysis = cluster_analysis(path, 0.10)
    assert "inferred" in analysis.stage_source
    assert [s.ranks for s in analysis.stages] == [tuple(range(8)), tuple(range(8, 16))]
    assert analysis.slow_ranks == [13]


def rank_folders(tmp_path: Path, table: list[list[str]], metadata: bool) -> Path:
    """The cluster file's rank rows as a job's torch_npu rank folders (one step_trace_time.csv
    each, with the columns torch_npu writes) and, with ``metadata``, each rank's pipeline stage in
    the real profiler_metadata.json's form (stage = rank // 8 for 2 stages of 8)."""
    header = table[0]
    job = tmp_path / "job"
    for row in table[1:]:
        if row[1] != "rank":
            continue
        rank = int(row[2])
        output = job / f"node{rank // 8}_{1000 + rank}_20250101_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
        output.mkdir(parents=True)
        write(output / "step_trace_time.csv", [["Device_id", "Step", *header[3:]], [str(rank % 8), row[0], *row[3:]]])
        (output.parent / f"profiler_info_{rank}.json").write_text("{}")
        if metadata:
            data = json.loads(METADATA.read_text())
            data["parallel_group_info"]["group_name_19"]["group_rank"] = rank // 8
            (output.parent / "profiler_metadata.json").write_text(json.dumps(data))
    return job


@pytest.mark.parametrize("metadata", [True, False], ids=["pp-groups", "inferred"])
def test_a_folder_of_rank_folders_reads_as_the_cluster_file(tmp_path, capsys, metadata) -> None:
    table = rows()
    job = rank_folders(tmp_path, table, metadata)
    analysis = cluster_analysis(job, 0.10)
    assert analysis.stage_source == ("each rank's profiler_metadata.json (pp group)" if metadata
                                     else "the ranks' bubble (receive) times (inferred: the input names no stage)")
    file_analysis = cluster_analysis(CLUSTER, 0.10)
    assert [v.step.trace for v in analysis.verdicts] == [v.step.trace for v in file_analysis.verdicts]
    assert analysis.bubble_stage.ranks == tuple(range(8, 16))
    free = table[0].index("Free")
    split = next(job.glob("*_1013_*")) / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
    rank13 = next(r for r in table if r[1:3] == ["rank", "13"])
    write(split, [["Device_id", "Step", *table[0][3:]],
                  ["5", "2", *rank13[3:free], repr(2 * float(rank13[free])), *rank13[free + 1:]]])
    assert main(["cluster", str(job), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["slow_ranks"] == [13]


def test_the_cluster_folder_is_read_too(capsys) -> None:
    assert main(["cluster", str(CLUSTER.parent)]) == 0
    assert "pipeline bubble: stage 1 (ranks 8-15)" in capsys.readouterr().out


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p.write_bytes(b""), "an msprof-analyze cluster_step_trace_time.csv that is empty (0 bytes)"),
    (lambda p: p.write_bytes(CLUSTER.read_bytes()[:700]), ("an msprof-analyze cluster_step_trace_time.csv, cut off in "
     "line 6 (8 of 11 fields)")),
    (lambda p: p.write_bytes(CLUSTER.read_bytes().replace(b"Step,", "迭代,".encode("gbk"))),
     "an msprof-analyze cluster_step_trace_time.csv that is not UTF-8 text: byte 0xb5 in line 1 reads as GBK"),
    (lambda p: p.write_bytes(b"Step Id,Name,Type,Start Time(us),Duration(us)\n1,a,b,1,2\n"),
     ("holds torch_npu kernel_details.csv (columns Step Id, Name, Type, Start Time(us) ...), not an msprof-analyze "
     "cluster_step_trace_time.csv")),
    (lambda p: p.write_bytes(CLUSTER.read_bytes().replace(b"2,rank,13,", b"2,rank,12,")),
     "line 15: rank 12 appears twice for step 2"),
    (lambda p: p.write_bytes(CLUSTER.read_bytes().replace(b"2,rank,13,79832.9", b"2,rank,13,-79832.9")),
     "line 15, column 'Computing': negative time -79833 us"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, message) -> None:
    path = tmp_path / "cluster_step_trace_time.csv"
    make(path)
    assert main(["cluster", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"oam cluster: error: {path}: ") and message in captured.err


def test_a_byte_order_mark_is_fine_and_other_inputs_are_refused(tmp_path, capsys) -> None:
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + CLUSTER.read_bytes())
    assert main(["cluster", str(bom)]) == 0
    capsys.readouterr()
    split = DATA / "ascend-msinsight-llm-pp2dp2-level2-rank0" / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
    for path, message in [
        (split, "is one rank's step_trace_time.csv; oam cluster reads the job's cluster_step_trace_time.csv"),
        (tmp_path, "a folder without cluster_step_trace_time.csv and without rank folders"),
        (tmp_path / "missing.csv", "no such file or folder"),
    ]:
        assert main(["cluster", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert main(["cluster", str(CLUSTER), "--threshold", "ten"]) == 2
    assert "--threshold: limit 'ten' is not a percentage" in capsys.readouterr().err
    folder = tmp_path / "a_ascend_pt"
    shutil.copytree(DATA / "ascend-msinsight-llm-pp2dp2-level2-rank0", folder)
    assert main(["cluster", str(tmp_path)]) == 0  # one rank: its profiler_metadata.json says rank 0
    assert "1 rank, 1 pipeline stage; stages from each rank's profiler_metadata.json (pp group)" in capsys.readouterr().out
    (folder / "profiler_metadata.json").unlink()
    assert main(["cluster", str(tmp_path)]) == 2  # no profiler_info_<rank>.json and no metadata: no rank
    assert "cannot tell which rank this torch_npu output folder is" in capsys.readouterr().err


def test_rank_ranges_read_short() -> None:
    assert ranks_text((0, 1, 2, 3, 8)) == "0-3, 8"
    assert ranks_text([5, 6]) == "5, 6"


def test_a_rank_waiting_for_a_slow_one_is_not_named(tmp_path) -> None:
    """Two ranks of one stage (a reviewer's case): rank 0 computes 130 ms and waits 10 ms in its
    collectives; rank 1 computes 80 ms and so waits 60 ms for rank 0. Rank 0 is slow for its
    computing; rank 1's longer communication is the wait, not a slowness of its own."""
    header = rows()[0]
    table = [header]
    for rank, computing_us, exposed_us in ((0, 130_000.0, 10_000.0), (1, 80_000.0, 60_000.0)):
        row = dict.fromkeys(header, "0")
        row.update({"Step": "1", "Type": "rank", "Index": str(rank), "Computing": repr(computing_us),
                    "Communication(Not Overlapped)": repr(exposed_us), "Communication": repr(exposed_us),
                    "Free": "5000.0", "Stage": repr(computing_us + exposed_us + 5000.0), "Bubble": "0.0",
                    "Communication(Not Overlapped and Exclude Receive)": repr(exposed_us)})
        table.append([row[h] for h in header])
    analysis = cluster_analysis(write(tmp_path / "cluster_step_trace_time.csv", table), 0.10)
    assert analysis.slow_ranks == [0]


def test_of_two_ranks_the_slow_one_is_measured_against_the_other(tmp_path) -> None:
    """Newcomer: of two ranks the stage's median is their midpoint, so a rank 15 ms slower in its
    host time than the other showed +7.5 ms, under the 10% limit of a 100 ms step: not named.
    Against the other rank it is +15 ms, what the other waits for it each step."""
    header = rows()[0]
    table = [header]
    for rank, free_us in ((0, 5_000.0), (1, 20_000.0)):
        row = dict.fromkeys(header, "0")
        row.update({"Step": "1", "Type": "rank", "Index": str(rank), "Computing": "80000.0",
                    "Communication(Not Overlapped)": "10000.0", "Communication": "10000.0", "Free": repr(free_us),
                    "Stage": repr(90_000.0 + free_us), "Bubble": "0.0",
                    "Communication(Not Overlapped and Exclude Receive)": "10000.0"})
        table.append([row[h] for h in header])
    analysis = cluster_analysis(write(tmp_path / "cluster_step_trace_time.csv", table), 0.10)
    assert analysis.slow_ranks == [1]
    slow = next(v for v in analysis.verdicts if v.slow)
    assert slow.excess_s["free"] == pytest.approx(0.015) and slow.others_median_s("free") == pytest.approx(0.005)

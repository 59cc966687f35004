"""torch_npu's step_trace_time.csv: each step's split (computing, exposed communication,
overlapped, free, bubble) imported with a torch_npu output folder, compared as ``step.*`` rows
of the gate, and read by the diagnosis (exposed communication, free time); bad files refused with
one line naming the file and what it should be.

Data: the real LLM step of tests/data/realdata (SOURCES.md 10a, 10b).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import pytest_oam as oam
from pytest_oam.cli import main
from pytest_oam.files.importers import import_profile
from pytest_oam.files.realfile import ImportError_
from pytest_oam.files.step_trace import read_step_trace
from pytest_oam.judge.compare import summarize
from pytest_oam.judge.rules import run_rules

LLM = Path(__file__).parent / "data" / "realdata" / "ascend-msinsight-llm-pp2dp2-level2-rank0"
SPLIT = LLM / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"


def test_the_real_split_is_read_in_seconds() -> None:
    ((step_id, t),) = read_step_trace(SPLIT)
    # the file's row: Step 13, Computing 231290.1, Communication(Not Overlapped) 420174.26,
    # Overlapped 0.0, Communication 420174.26, Free 158558.0, Stage 810022.25, Bubble 0, Preparing 206.25 (us)
    assert step_id == "13"
    assert (t.step, t.computing_s, t.communication_exposed_s, t.free_s) == pytest.approx((0, 0.2312901, 0.42017426,
                                                                                          0.158558))
    assert (t.overlapped_s, t.bubble_s, t.preparing_s) == pytest.approx((0.0, 0.0, 206.25e-6))
    # computing + exposed communication + free = 810022.36 us, the file's Stage (810022.25) + Bubble (0)
    assert t.step_s == pytest.approx(0.81002225, abs=0.2e-6)


def test_the_folder_import_carries_the_split_and_the_baseline_its_medians() -> None:
    profile = import_profile(LLM)
    assert [t.step for t in profile.step_trace] == [0]  # Step Id 13 of kernel_details.csv, renumbered as its step 0
    assert profile.step_trace[0].step_s == pytest.approx(profile.step_time_s, rel=1e-6)  # the kernels' span: 810.02 ms
    assert summarize(profile).step_trace_s == pytest.approx(
        {"computing": 0.2312901, "communication_exposed": 0.42017426, "free": 0.158558, "bubble": 0.0})
    assert import_profile(LLM / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").step_trace == []


def copy_with(tmp_path: Path, name: str, column: str, factor: float) -> Path:
    """A copy of the LLM folder whose step split has ``column`` times ``factor``."""
    folder = tmp_path / name
    shutil.copytree(LLM, folder)
    split = folder / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
    header, row = split.read_text().splitlines()
    cells = row.split(",")
    i = header.split(",").index(column)
    cells[i] = repr(float(cells[i]) * factor)
    split.write_text(f"{header}\n{','.join(cells)}\n")
    return folder


def test_the_gate_compares_the_split_and_names_a_free_time_regression(tmp_path, capsys) -> None:
    same = oam.compare_profiles(import_profile(LLM), import_profile(LLM))
    rows = {v.op_type: v.status for v in same.comparison.verdicts if v.op_type.startswith("step.")}
    # Bubble is 0 in the baseline: no relative change to judge, so no row
    assert rows == {"step.computing": "pass", "step.communication_exposed": "pass", "step.free": "pass"}
    assert same.passed

    slower = copy_with(tmp_path, "free", "Free", 1.2)  # 158.56 ms -> 190.27 ms idle
    assert main(["compare", str(LLM), str(slower)]) == 1
    out = capsys.readouterr().out
    assert "step.free" in out and "+20.0%" in out and "REGRESSED" in out
    assert "the device idles longer: the host feeds it slower" in out  # what to do about it
    report = oam.compare_profiles(import_profile(LLM), import_profile(slower), thresholds={"step.free": "25%"})
    assert report.passed  # a threshold names the row like an op type


def test_a_baseline_without_the_split_is_not_silently_ungated(tmp_path) -> None:
    folder = tmp_path / "no-split"
    shutil.copytree(LLM, folder)
    (folder / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv").unlink()
    report = oam.compare_profiles(import_profile(folder), import_profile(LLM))
    assert not any(v.op_type.startswith("step.") for v in report.comparison.verdicts)
    assert any("no step split" in r and "step.* rows not compared" in r for r in report.comparison.reasons)


def test_the_diagnosis_reads_the_split() -> None:
    findings = {f.rule_id: f for f in run_rules(import_profile(LLM), None)}
    free = findings["step-free"]
    # Free 158.558 ms of the 810.022 ms step = 19.6%: at least 5% of the step is serious
    assert (free.severity, free.op_type, free.gain_s) == ("serious", "step.free", pytest.approx(0.158558))
    assert free.step_share_frac == pytest.approx(0.158558 / 0.81002236, rel=1e-6)
    assert "host-bound" in free.description and "DataLoader workers" in free.fix
    exposed = findings["step-communication-exposed"]
    # Communication(Not Overlapped) 420.174 ms - Bubble 0 of 810.022 ms = 51.9%, none of it overlapped
    assert exposed.gain_s == pytest.approx(0.42017426)
    assert "52%" in exposed.description and "overlap-grad-reduce" in exposed.fix


def test_a_busy_device_with_hidden_communication_gets_no_step_finding() -> None:
    profile = import_profile(LLM)
    t = profile.step_trace[0]
    # the same 810 ms step with 95% of its communication overlapped and 2% free: below both rules' shares
    healthy = t.model_copy(update={"computing_s": 0.77, "communication_exposed_s": 0.024, "overlapped_s": 0.396,
                                   "free_s": 0.016})
    findings = {f.rule_id for f in run_rules(profile.model_copy(update={"step_trace": [healthy]}), None)}
    assert not findings & {"step-free", "step-communication-exposed"}


def test_with_communication_json_the_collectives_rules_speak_instead() -> None:
    from simulator.profile import CommInfo

    profile = import_profile(LLM)
    comm = CommInfo(bytes=1 << 20, algorithm="unrecorded", algbw_bytes_per_s=1e9, busbw_bytes_per_s=1e9)
    ops = [op.model_copy(update={"comm": comm}) if op.stream == "hccl" else op for op in profile.ops]
    findings = {f.rule_id for f in run_rules(profile.model_copy(update={"ops": ops}), None)}
    assert "step-communication-exposed" not in findings and "comm-share" in findings
    assert "step-free" in findings  # free time has no other rule


@pytest.mark.parametrize(("content", "message"), [
    # the words every profiler file's damage is said in (pytest_oam/files/file_kinds.py)
    (b"", "a torch_npu step_trace_time.csv that is empty (0 bytes)"),
    (SPLIT.read_bytes()[:200], "a torch_npu step_trace_time.csv, cut off in line 2 (5 of 11 fields)"),
    ("Step,Computing,通信,Free\n1,2,3,4\n".encode("gbk"), ("a torch_npu step_trace_time.csv that is not UTF-8 text: byte "
     "0xd0 in line 1 reads as GBK")),
    (b"Step Id,Name,Type\n1,a,b\n", ("no 'Computing', 'Communication(Not Overlapped)', 'Free' column: not a torch_npu "
     "step_trace_time.csv")),
    (SPLIT.read_bytes().replace(b"158558", b"-158558"), "column 'Free': negative time -158558"),
    (SPLIT.read_bytes() + SPLIT.read_bytes().splitlines(keepends=True)[1], "step 13 appears in more than one row"),
])
def test_a_bad_split_is_named_in_one_line(tmp_path, capsys, content, message) -> None:
    folder = tmp_path / "rank0_ascend_pt"
    shutil.copytree(LLM, folder)
    split = folder / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
    split.write_bytes(content)
    with pytest.raises(ImportError_, match="step_trace_time.csv: ") as info:
        import_profile(folder)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert main(["compare", str(LLM), str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_split_with_a_byte_order_mark_reads(tmp_path) -> None:
    split = tmp_path / "step_trace_time.csv"
    split.write_bytes(b"\xef\xbb\xbf" + SPLIT.read_bytes())
    assert read_step_trace(split) == read_step_trace(SPLIT)


def test_a_split_alone_is_not_a_profile(capsys) -> None:
    assert main(["compare", str(SPLIT), str(SPLIT)]) == 2
    assert "splits the step time but has no operators: give its torch_npu output folder" in capsys.readouterr().err
    cluster = LLM.parent / "ascend-msinsight-cluster16-analysis" / "cluster_step_trace_time.csv"
    assert main(["compare", str(cluster), str(cluster)]) == 2
    assert "is a job's per-rank step split, not a profile: oam cluster reads it" in capsys.readouterr().err

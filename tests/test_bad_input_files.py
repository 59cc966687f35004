"""Damaged real profiler files (issue 24): every kind of file the importers read, truncated,
empty, mis-encoded (GBK; UTF-8 with a byte order mark, which is simply read) or holding another
kind, gives one line naming the file, what it is and what is wrong; ``oam`` exits 2 with it, no
traceback.

Each kind starts from a real file of tests/data/realdata (SOURCES.md); the op_summary CSV is the
Level1 kernel_details.csv under msprof's op_summary column names (no real op_summary is bundled).
"""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_oam.cli import main
from pytest_oam.files.step_trace import read_cluster_file
from pytest_oam.importers import ImportError_, import_profile

DATA = Path(__file__).parent / "data" / "realdata"
LEVEL0 = DATA / "ascend-msinsight-alexnet2p-level0-rank0"
LEVEL1 = DATA / "ascend-msinsight-alexnet2p-level1-rank0"
KINETO = DATA / "hta-critical-path-alexnet-run1" / "benchmark_result_493459_1694039959_trace.json.gz"
ADVISOR_TRACE = DATA / "ascend-msprof-analyze-advisor-ut" / "trace_view.json"
CLUSTER = DATA / "ascend-msinsight-cluster16-analysis" / "cluster_step_trace_time.csv"
#: msprof's op_summary names for kernel_details.csv's columns
OP_SUMMARY_COLUMNS = {"Name": "Op Name", "Type": "OP Type", "Accelerator Core": "Task Type",
                      "Start Time(us)": "Task Start Time(us)", "Duration(us)": "Task Duration(us)"}


def op_summary() -> bytes:
    header, rest = (LEVEL1 / "kernel_details.csv").read_bytes().split(b"\n", 1)
    columns = [OP_SUMMARY_COLUMNS.get(c, c) for c in header.decode().split(",")]
    return ",".join(columns).encode() + b"\n" + rest


@dataclass(frozen=True)
class Kind:
    """A kind of file: what the messages must call it, its real content, the other files of its
    folder (when it is read as part of one), the content of another kind, and how it is read."""

    phrase: str
    name: str
    content: Callable[[], bytes]
    other: Callable[[], bytes]
    folder: dict[str, Path] | None = None
    gzipped: bool = False
    read: Callable[[Path], object] = import_profile
    command: str = "compare"


KINDS = {
    "kernel_details.csv": Kind("a torch_npu kernel_details.csv", "kernel_details.csv",
                               (LEVEL1 / "kernel_details.csv").read_bytes,
                               (LEVEL0 / "step_trace_time.csv").read_bytes),
    "op_summary": Kind("an msprof op_summary CSV", "op_summary_0_1.csv", op_summary,
                       (LEVEL1 / "operator_memory.csv").read_bytes),
    "trace_view.json": Kind("a torch_npu trace_view.json", "trace_view.json",
                            lambda: gzip.decompress((LEVEL0 / "trace_view.json.gz").read_bytes()),
                            (LEVEL1 / "communication.json").read_bytes),
    "kineto": Kind("a Kineto trace", "alexnet.pt.trace.json", lambda: gzip.decompress(KINETO.read_bytes()),
                   (LEVEL1 / "kernel_details.csv").read_bytes),
    "kineto.gz": Kind("a Kineto trace", "alexnet.pt.trace.json.gz", lambda: gzip.decompress(KINETO.read_bytes()),
                      (LEVEL1 / "kernel_details.csv").read_bytes, gzipped=True),
    "step_trace_time.csv": Kind("a torch_npu step_trace_time.csv", "step_trace_time.csv",
                                (LEVEL0 / "step_trace_time.csv").read_bytes,
                                (LEVEL0 / "kernel_details.csv").read_bytes,
                                folder={"kernel_details.csv": LEVEL0 / "kernel_details.csv"}),
    "operator_memory.csv": Kind("a torch_npu operator_memory.csv", "operator_memory.csv",
                                (LEVEL1 / "operator_memory.csv").read_bytes,
                                (LEVEL0 / "step_trace_time.csv").read_bytes,
                                folder={"kernel_details.csv": LEVEL1 / "kernel_details.csv"}),
    "communication.json": Kind("a torch_npu communication.json", "communication.json",
                               (LEVEL1 / "communication.json").read_bytes, ADVISOR_TRACE.read_bytes,
                               folder={"kernel_details.csv": LEVEL1 / "kernel_details.csv"}),
    "cluster_step_trace_time.csv": Kind("an msprof-analyze cluster_step_trace_time.csv",
                                        "cluster_step_trace_time.csv", CLUSTER.read_bytes,
                                        (LEVEL0 / "step_trace_time.csv").read_bytes, read=read_cluster_file,
                                        command="cluster"),
}


def truncated(data: bytes) -> bytes:
    """Cut in the middle of a line 60% into the file (a profiler killed while writing)."""
    start = data.rfind(b"\n", 0, int(len(data) * 0.6)) + 1
    end = data.find(b"\n", start)
    end = len(data) if end < 0 else end
    assert end - start >= 2, "the cut must fall inside a line"
    return data[:(start + end) // 2]


def gbk(data: bytes) -> bytes:
    """The file as a Chinese-locale Windows program saves it after a Chinese word went in: a
    note in a CSV's last line, a step name with Chinese in a JSON."""
    text = data.decode("utf-8")
    if text.lstrip()[:1] in ("[", "{"):
        if '"name": "' in text:
            text = text.replace('"name": "', '"name": "前向传播 ', 1)
        else:
            text = text.replace("{", '{"备注": "第二次采集", ', 1)
    else:
        text += "备注,第二次采集\n"
    return text.encode("gbk")


#: damage -> (what it does to the file's text, a word the message must have)
DAMAGES = {
    "truncated": (truncated, ("unclosed", "cut off", "truncated")),
    "empty": (lambda data: b"", ("is empty",)),
    "gbk": (gbk, ("reads as GBK",)),
    "wrong-kind": (None, ("holds",)),
}


def make(tmp_path: Path, kind: Kind, content: bytes, *, compress: bool = True) -> tuple[Path, Path]:
    """(the file, what to read): the file alone, or in a torch_npu output folder."""
    if kind.folder is None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        target = entry = tmp_path / kind.name
    else:
        entry = tmp_path / "rank0_ascend_pt"
        folder = entry / "ASCEND_PROFILER_OUTPUT"
        folder.mkdir(parents=True)
        for name, source in kind.folder.items():
            shutil.copyfile(source, folder / name)
        target = folder / kind.name
    target.write_bytes(gzip.compress(content) if kind.gzipped and compress else content)
    return target, entry


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("kind_id", sorted(KINDS))
def test_a_damaged_file_is_named_in_one_line(tmp_path, capsys, kind_id, damage) -> None:
    kind = KINDS[kind_id]
    change, words = DAMAGES[damage]
    if damage == "wrong-kind":
        content = kind.other()
    elif damage == "truncated" and kind.gzipped:
        content = truncated(gzip.compress(kind.content()))  # the compressed stream is cut
    else:
        content = change(kind.content())
    target, entry = make(tmp_path, kind, content, compress=not (damage == "truncated" and kind.gzipped))
    with pytest.raises(ImportError_) as info:
        kind.read(entry)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{target}: ")
    assert kind.phrase in message, message
    assert any(word in message for word in words), message
    arguments = [kind.command, str(entry)] + ([str(entry)] if kind.command == "compare" else [])
    assert main(arguments) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and str(target) in err and "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize("kind_id", sorted(KINDS))
def test_utf8_with_a_byte_order_mark_is_simply_read(tmp_path, kind_id) -> None:
    kind = KINDS[kind_id]
    _, plain = make(tmp_path / "plain", kind, kind.content())
    _, marked = make(tmp_path / "bom", kind, b"\xef\xbb\xbf" + kind.content())
    def read(entry: Path) -> object:
        result = kind.read(entry)
        return (result.ranks, result.stages) if kind.read is read_cluster_file else result  # not its path

    assert read(marked) == read(plain)


def test_the_interrupted_trace_view_says_so(tmp_path) -> None:
    target, _ = make(tmp_path, KINDS["trace_view.json"], truncated(KINDS["trace_view.json"].content()))
    with pytest.raises(ImportError_) as info:
        import_profile(target)
    assert str(info.value).startswith(
        f"{target}: a torch_npu trace_view.json, an unclosed array: the profiler was interrupted")


def test_a_trace_is_known_by_its_content_whatever_its_name(tmp_path) -> None:
    # HTA's file name says nothing; its first bytes say Kineto (deviceProperties, schemaVersion)
    cut = tmp_path / KINETO.name.removesuffix(".gz")
    cut.write_bytes(truncated(gzip.decompress(KINETO.read_bytes())))
    with pytest.raises(ImportError_, match=r"a Kineto trace, an unclosed object: the profiler was interrupted"):
        import_profile(cut)
    # and a torch_npu timeline by its string timestamps
    view = tmp_path / "rank0.json"
    view.write_bytes(truncated(ADVISOR_TRACE.read_bytes()))
    with pytest.raises(ImportError_, match=r"a torch_npu trace_view.json, an unclosed array"):
        import_profile(view)


def test_communication_json_alone_points_to_its_folder(tmp_path, capsys) -> None:
    alone = tmp_path / "communication.json"
    shutil.copyfile(LEVEL1 / "communication.json", alone)
    assert main(["compare", str(alone), str(alone)]) == 2
    assert "read as part of its torch_npu output folder" in capsys.readouterr().err

"""What a real profiler file is, and what is wrong with a damaged one, in one line for its user.

The importers read torch_npu's ``kernel_details.csv``, ``operator_memory.csv``,
``step_trace_time.csv``, ``communication.json`` and ``trace_view.json``, msprof's
``op_summary_*.csv``, msprof-analyze's ``cluster_step_trace_time.csv`` and PyTorch Kineto
traces. A file is known by its content when enough of it is readable (a CSV's header, the
first bytes of a JSON), else by its name. Damage is said in the words of the file's kind::

    run/trace_view.json: a torch_npu trace_view.json, an unclosed array: the profiler was
    interrupted while it wrote the file, or the file was cut short

* empty (nothing, or only white space);
* another encoding than UTF-8: GBK (what a Chinese-locale Windows program such as Excel
  saves), UTF-16, or binary data. UTF-8 with a byte order mark is read as UTF-8;
* truncated: an unclosed JSON array or object, a CSV whose last line stops short of its
  columns, a cut gzip stream;
* of another kind than its name says (a ``step_trace_time.csv`` saved as
  ``kernel_details.csv``, CSV text in a ``.json`` file).

Functions return the message; the importers raise it as their error (``ImportError_``, the
API's ``ProfileFileError``), which the ``oam`` command prints as one line with exit 2.
"""

from __future__ import annotations

import csv
import io
import json
import re
import zlib
from pathlib import Path

#: File name (lower case, without ``.gz``) -> what the file is.
NAME_KINDS = (
    (re.compile(r"kernel_details(_\d+)?\.csv"), "a torch_npu kernel_details.csv"),
    (re.compile(r"op_summary\w*\.csv"), "an msprof op_summary CSV"),
    (re.compile(r"cluster_step_trace_time\.csv"), "an msprof-analyze cluster_step_trace_time.csv"),
    (re.compile(r"step_trace_time\.csv"), "a torch_npu step_trace_time.csv"),
    (re.compile(r"operator_memory\.csv"), "a torch_npu operator_memory.csv"),
    (re.compile(r"memory_record\.csv"), "a torch_npu memory_record.csv"),
    (re.compile(r"op_statistic\.csv"), "a torch_npu op_statistic.csv"),
    (re.compile(r"communication\.json"), "a torch_npu communication.json"),
    (re.compile(r"communication_matrix\.json"), "a torch_npu communication_matrix.json"),
    (re.compile(r"trace_view\.json"), "a torch_npu trace_view.json"),
    (re.compile(r".+\.pt\.trace\.json"), "a Kineto trace"),
)
#: CSV header columns -> what the file is; the first whose columns are all in the header wins.
HEADER_KINDS = (
    (("Type", "Index", "Computing", "Communication(Not Overlapped)"), "an msprof-analyze cluster_step_trace_time.csv"),
    (("Step", "Computing", "Communication(Not Overlapped)"), "a torch_npu step_trace_time.csv"),
    (("Name", "Size(KB)", "Allocation Time(us)"), "a torch_npu operator_memory.csv"),
    (("Component", "Timestamp(us)", "Total Allocated(MB)"), "a torch_npu memory_record.csv"),
    (("Component", "Timestamp(us)", "Total Reserved(MB)"), "a torch_npu npu_module_mem.csv"),
    (("OP Type", "Core Type", "Count", "Total Time(us)"), "a torch_npu op_statistic.csv"),
    (("API Name", "Time(us)", "Count"), "a torch_npu api_statistic.csv"),
    (("Name", "Type", "Start Time(us)", "Duration(us)"), "a torch_npu kernel_details.csv"),
    (("Op Name", "Task Start Time(us)"), "an msprof op_summary CSV"),
    (("Op Name", "OP Type"), "an msprof op_summary CSV"),
)
#: Kinds one reader accepts as each other (kernel_details.csv and op_summary share a reader).
SAME_READER = ({"a torch_npu kernel_details.csv", "an msprof op_summary CSV"},)
_WHY_CUT = "the profiler was interrupted while it wrote the file, or the file was cut short"
_HEAD_BYTES = 4096


def kind_by_name(path: Path) -> str | None:
    """What a file is by its name (``trace_view.json.gz`` as ``trace_view.json``); ``None``
    for a name that says nothing."""
    name = path.name.lower().removesuffix(".gz")
    return next((kind for pattern, kind in NAME_KINDS if pattern.fullmatch(name)), None)


def kind_by_header(header: list[str]) -> str | None:
    """What a CSV is by its header's columns; ``None`` for columns of no known file."""
    columns = {h.strip() for h in header}
    return next((kind for needed, kind in HEADER_KINDS if set(needed) <= columns), None)


def kind_by_text(text: str) -> str | None:
    """What a file is by its first characters (a JSON's opening, a CSV's header)."""
    head = text.lstrip("\ufeff \t\r\n")[:_HEAD_BYTES]
    if head.startswith("["):
        if '"ph"' in head or '"ts"' in head:
            # torch_npu writes timestamps as strings and names its lanes; Kineto writes numbers
            if re.search(r'"ts":\s*"', head) or "Ascend Hardware" in head:
                return "a torch_npu trace_view.json"
            return "a Chrome trace (a JSON array of events)"
        return None
    if head.startswith("{"):
        if '"traceEvents"' in head or '"schemaVersion"' in head or '"deviceProperties"' in head:
            return "a Kineto trace"
        if re.match(r'\{\s*"step\w*":\s*\{\s*"(collective|p2p)"', head):
            return "a torch_npu communication.json"
        return None
    first = head.splitlines()[0] if head else ""
    if "," in first:
        try:
            return kind_by_header(next(csv.reader([first])))
        except csv.Error:
            return None
    return None


def kind_by_json(data: object) -> str | None:
    """What a parsed JSON file is: a trace, a torch_npu communication.json, a pytest-oam file."""
    if isinstance(data, list):
        if any(isinstance(e, dict) and e.get("ph") == "M" and isinstance(e.get("args"), dict)
               and e["args"].get("name") == "Ascend Hardware" for e in data):
            return "a torch_npu trace_view.json"
        return "a Chrome trace (a JSON array of events)" if any(isinstance(e, dict) and "ph" in e for e in data) else None
    if not isinstance(data, dict):
        return None
    if "traceEvents" in data:
        return "a Kineto trace"
    if data.get("kind") == "pytest-oam-record":
        return "a pytest-oam record (pytest --oam-record)"
    if "runs" in data:
        return "a pytest-oam baseline file"
    if "ops" in data:
        return "a pytest-oam profile"
    if data and all(isinstance(v, dict) and {"collective", "p2p"} & set(v) for v in data.values()):
        return "a torch_npu communication.json (or communication_matrix.json)"
    return None


def _what(path: Path, content_kind: str | None = None) -> str:
    return content_kind or kind_by_name(path) or "a file"


def _gzip_head(raw: bytes) -> str:
    """The text a (possibly cut) gzip stream starts with, for telling what it held."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, _HEAD_BYTES).decode("utf-8", "replace")
    except zlib.error:
        return ""


def input_problem(path: Path, problem: str) -> str:
    """The message for a file that cannot be read as bytes (``fileio.InputFileError``'s
    ``problem``); for a cut or damaged gzip stream, what the file is when its name or its
    readable start tell."""
    if "gzip" not in problem:
        return f"{path}: {problem}"
    kind = kind_by_name(path)
    try:
        with path.open("rb") as fh:
            kind = kind_by_text(_gzip_head(fh.read(1 << 20))) or kind
    except OSError:
        pass
    return f"{path}: {kind} (gzip-compressed) that {problem}: {_WHY_CUT}" if kind else f"{path}: {problem}"


def text_problem(path: Path, raw: bytes) -> str | None:
    """Why ``raw`` (a file's bytes) is not text the importers read, or ``None`` when it is UTF-8
    (with or without a byte order mark)."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return (f"{path}: {_what(path)} that is not UTF-8 text but UTF-16 (as Excel's 'Unicode text' saves it); "
                "the profiler writes UTF-8: export it again, or save it as UTF-8")
    try:
        raw.decode("utf-8-sig")
        return None
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        where = f"byte 0x{raw[exc.start]:02x} in line {line}"
    kind = _what(path)
    if b"\x00" in raw[:_HEAD_BYTES]:
        return f"{path}: {kind} that is not UTF-8 text ({where}, and NUL bytes): a binary file?"
    try:
        raw.decode("gb18030")
    except UnicodeDecodeError:
        return f"{path}: {kind} that is not UTF-8 text ({where}): binary data, or another encoding?"
    return (f"{path}: {kind} that is not UTF-8 text: {where} reads as GBK, the encoding a Chinese-locale Windows "
            "program such as Excel saves in; the profiler writes UTF-8: export it again, or save it as UTF-8")


def empty_problem(path: Path, text: str) -> str | None:
    """``None`` unless the file holds nothing but white space."""
    if text.strip("\ufeff \t\r\n"):
        return None
    size = "0 bytes" if not text else "only white space"
    return (f"{path}: {_what(path)} that is empty ({size}): the profiler stopped before it wrote it, or the "
            "copy failed")


def json_problem(path: Path, raw: bytes, exc: Exception) -> str:
    """The message for a file whose JSON did not parse (``exc`` from ``json.loads(raw)``)."""
    if isinstance(exc, UnicodeDecodeError):
        return text_problem(path, raw) or f"{path}: {_what(path)} that is not UTF-8 text ({exc})"
    text = raw.decode("utf-8-sig", "replace")
    empty = empty_problem(path, text)
    if empty:
        return empty
    content = kind_by_text(text)
    if content and content.lower().endswith("csv"):
        named = kind_by_name(path)
        return f"{path}: holds CSV text ({content}), not JSON" + (f"; expected {named}" if named else "")
    kind = _what(path, content)
    if isinstance(exc, json.JSONDecodeError):
        body = text.rstrip()
        opening = text.lstrip("\ufeff \t\r\n")[:1]
        cut = exc.pos >= len(body) - 1 or exc.msg.startswith("Unterminated string")
        if cut and opening in "[{":
            container = "an unclosed array" if opening == "[" else "an unclosed object"
            return f"{path}: {kind}, {container}: {_WHY_CUT}"
        return f"{path}: {kind} that is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    return f"{path}: {kind} that is not valid JSON ({exc})"


def json_kind_problem(path: Path, data: object, *, alone: bool = True) -> str | None:
    """Why parsed JSON is not what a reader wants, when its content shows another kind than its
    name (``holds a torch_npu communication.json, not a torch_npu trace_view.json``), or, given
    ``alone`` (not inside its output folder), when it is a file read only as part of a torch_npu
    output folder; ``None`` otherwise (the reader says what it misses)."""
    named, content = kind_by_name(path), kind_by_json(data)
    if content and named and not (content.startswith(named) or named.startswith(content)):
        return f"{path}: holds {content}, not {named}"
    if alone and content and "communication" in content:
        return (f"{path}: {content}, which is read as part of its torch_npu output folder: give the folder "
                "(ASCEND_PROFILER_OUTPUT or its parent) instead")
    return None


def known_json_problem(path: Path, raw: bytes, exc: Exception) -> str | None:
    """:func:`json_problem` for a file that its name or its start shows to be a profiler file;
    ``None`` for any other JSON (a pytest-oam profile or baseline), left to its reader's words."""
    text = raw[:_HEAD_BYTES].decode("utf-8-sig", "replace")
    if kind_by_name(path) or kind_by_text(text):
        return json_problem(path, raw, exc)
    return None


def csv_problem(path: Path, text: str, expected: set[str] | None = None) -> str | None:
    """What is wrong with a CSV's text as a whole, or ``None``: empty, JSON in a CSV, another
    kind than its name (or ``expected``, the kinds its reader takes) says, or a last line cut
    short of the header's columns."""
    empty = empty_problem(path, text)
    if empty:
        return empty
    named = kind_by_name(path)
    wanted = expected or ({named} if named else set())
    for group in SAME_READER:
        if wanted & group:
            wanted = wanted | group
    content = kind_by_text(text)
    body = text.lstrip("\ufeff \t\r\n")
    if body[:1] in ("[", "{"):
        return (f"{path}: holds JSON ({content or 'not a profiler CSV'}), not CSV"
                + (f"; expected {' or '.join(sorted(wanted))}" if wanted else ""))
    if content and wanted and content not in wanted:
        header = next(csv.reader([body.splitlines()[0]]), [])
        return (f"{path}: holds {content.removeprefix('a ').removeprefix('an ')} (columns "
                f"{', '.join(h.strip() for h in header[:4])} ...), not {' or '.join(sorted(wanted))}")
    if text.endswith(("\n", "\r")):
        return None
    try:
        rows = list(csv.reader(io.StringIO(body, newline="")))
    except csv.Error:
        return f"{path}: {_what(path, content)}, cut off in its last line (an open quote): {_WHY_CUT}"
    if len(rows) >= 2 and len(rows[-1]) < len(rows[0]):
        return (f"{path}: {_what(path, content)}, cut off in line {len(body.splitlines())} ({len(rows[-1])} of "
                f"{len(rows[0])} fields): {_WHY_CUT}")
    return None


#: Files of a torch_npu output folder the importers read, and whether they are CSV.
FOLDER_FILES = (("kernel_details.csv", True), ("operator_memory.csv", True), ("step_trace_time.csv", True),
                ("communication.json", False))


def check_input(path: Path) -> str | None:
    """What is wrong with a profiler file, or with the files of a torch_npu output folder
    (``ASCEND_PROFILER_OUTPUT`` or its parent) that the importers read, as a whole; ``None``
    when nothing is. JSON files given alone are left to the parser (see :func:`json_problem`):
    reading a large trace twice costs more than it tells."""
    from .fileio import InputFileError, read_input_bytes

    if path.is_dir():
        folder = path / "ASCEND_PROFILER_OUTPUT" if (path / "ASCEND_PROFILER_OUTPUT").is_dir() else path
        targets = [(folder / name, is_csv) for name, is_csv in FOLDER_FILES if (folder / name).is_file()]
    elif path.suffix.lower() == ".csv" and path.is_file():
        targets = [(path, True)]
    else:
        return None
    for target, is_csv in targets:
        try:
            raw = read_input_bytes(target)
        except InputFileError as exc:
            return input_problem(target, exc.problem)
        problem = text_problem(target, raw)
        if problem:
            return problem
        text = raw.decode("utf-8-sig")
        if is_csv:
            problem = csv_problem(target, text)
        else:
            try:
                problem = json_kind_problem(target, json.loads(raw), alone=False)
            except (ValueError, RecursionError) as exc:
                problem = json_problem(target, raw, exc) if not isinstance(exc, RecursionError) else None
        if problem:
            return problem
    return None

"""What every reader of real profiler output shares: its error, reading a file's bytes, text and
CSV rows, the numbers, step ids and shapes of real files, the events of Chrome traces, and the
records and profile it builds.

The readers of each format (:mod:`.importers` for the Ascend CSVs and output folders,
:mod:`.trace_view` for torch_npu's ``trace_view.json``, :mod:`.kineto` for PyTorch Kineto
traces, :mod:`.step_trace` for the step splits, :mod:`pytest_oam.kernel_replay`) import this
module, never each other's private helpers.
"""

from __future__ import annotations

import bisect
import csv
import decimal
import hashlib
import io
import math
import re
from collections.abc import Iterable
from pathlib import Path

from simulator.profile import OpRecord, Profile

#: One tensor's dimensions.
Shape = tuple[int, ...]


class ImportError_(ValueError):
    """A profiler file that cannot be imported; the message names the file and what is wrong."""


# -- reading a file ---------------------------------------------------------------------------

#: Beyond this many repeated column names an error names the first only (the message stays one line).
_MAX_NAMED_COLUMNS = 8


def read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed if gzip: regular files only (a named pipe is never opened),
    at most :data:`pytest_oam.files.fileio.MAX_INPUT_BYTES` after decompression.

    Raises:
        ImportError_: unreadable, too large, a damaged gzip stream (said in the file's kind,
            :func:`.file_kinds.input_problem`).
    """
    from .file_kinds import input_problem
    from .fileio import InputFileError, read_input_bytes

    try:
        return read_input_bytes(path)
    except InputFileError as exc:
        raise ImportError_(input_problem(path, exc.problem)) from None


def read_text(path: Path) -> str:
    """The file's text, UTF-8 with or without a byte order mark.

    Raises:
        ImportError_: see :func:`read_bytes`; or another encoding (GBK, UTF-16) or binary data,
            said in the file's kind (:func:`.file_kinds.text_problem`).
    """
    from .file_kinds import text_problem

    raw = read_bytes(path)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ImportError_(text_problem(path, raw) or f"{path}: is not UTF-8 text (byte {exc.start})") from None


def csv_rows(path: Path, text: str, kind: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The header (names stripped) and the rows of CSV ``text`` read from ``path``, each row
    with its line number; ``kind`` says what the file is, for the messages (``a torch_npu
    step_trace_time.csv``). Which columns must be there, and what an empty file means, is the
    caller's to say.

    Raises:
        ImportError_: a header or row that is not CSV, a column named twice, a row with more or
            fewer fields than the header has columns (a truncated file), naming the line.
    """
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in (reader.fieldnames or [])]
    except csv.Error as exc:
        raise ImportError_(f"{path}: line 1: not a valid CSV header ({exc}); expected {kind}") from None
    if re.match(r"\s*[\[{]", text):  # a JSON trace (Kineto, trace_view.json) or another JSON file
        raise ImportError_(f"{path}: holds JSON, not CSV: not {kind}")
    if not any(header):  # a blank first line
        raise ImportError_(f"{path}: line 1: no column names: not {kind}")
    repeated = sorted({h for h in header if h and header.count(h) > 1})
    if repeated:
        if len(repeated) > _MAX_NAMED_COLUMNS:  # not a CSV table at all (a JSON trace read as CSV: one "column" a line)
            raise ImportError_(f"{path}: line 1: {len(repeated)} column names appear more than once "
                               f"(first {repeated[0][:40]!r}): not {kind}")
        raise ImportError_(f"{path}: line 1: column {', '.join(map(repr, repeated))} appears more than once")
    reader.fieldnames = header
    rows = []
    try:
        for line, row in enumerate(reader, start=2):
            if None in row:
                raise ImportError_(f"{path}: line {line}: more fields than the {len(header)} columns")
            if any(v is None for v in row.values()):
                filled = sum(v is not None for v in row.values())
                raise ImportError_(f"{path}: line {line}: {filled} fields for {len(header)} columns "
                                   f"(truncated file?); {kind} was cut short")
            rows.append((line, row))
    except csv.Error as exc:
        raise ImportError_(f"{path}: line {reader.line_num}: not a valid CSV row ({exc})") from None
    return header, rows


# -- what a real file holds -----------------------------------------------------------------------


def number(text: object, path: Path, where: str, default: float | None = None) -> float:
    """A number from a real file: strips tabs and spaces; ``N/A`` and empty give ``default``.

    Raises:
        ImportError_: not a number (without a default), or not finite.
    """
    raw = str(text).strip() if text is not None else ""
    if raw in ("", "N/A", "NA", "-") and default is not None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImportError_(f"{path}: {where}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ImportError_(f"{path}: {where}: {raw!r} is not finite")
    return value


def number_or_none(text: str | None) -> float | None:
    """A finite number from a cell of a real file (tabs and spaces stripped), or None for anything
    else (empty, ``N/A``, text, inf, nan): for optional columns that are read where present."""
    try:
        value = float((text or "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def timestamp_us(text: object, path: Path, where: str) -> decimal.Decimal:
    """A timestamp in microseconds, exactly: string timestamps such as ``"1704161511422904.204"``
    lose their sub-microsecond part as floats.

    Raises:
        ImportError_: not a finite number.
    """
    value = _decimal(text)
    if value is None:
        raw = str(text).strip() if text is not None and not isinstance(text, bool) else ""
        what = "finite" if _decimal(raw, finite=False) is not None else "a number"
        raise ImportError_(f"{path}: {where}: {raw!r} is not {what}")
    return value


def _decimal(text: object, finite: bool = True) -> decimal.Decimal | None:
    """``text`` as an exact number (finite, unless ``finite`` is False); None when it is not one."""
    raw = str(text).strip() if text is not None and not isinstance(text, bool) else ""
    try:
        value = decimal.Decimal(raw)
    except decimal.InvalidOperation:
        return None
    return value if value.is_finite() or not finite else None


def link_time_us(event: dict) -> decimal.Decimal | None:
    """The ``ts`` of a trace event that only links others (a flow's start or end, a kernel
    launch), exactly; None where it is not a finite number: a broken link costs the link, never
    the import."""
    return _decimal(event.get("ts"))


def duration_us(text: object, path: Path, where: str) -> float:
    """A duration in microseconds.

    Raises:
        ImportError_: not a finite number, or negative.
    """
    value = number(text, path, where)
    if value < 0:
        raise ImportError_(f"{path}: {where}: negative duration {value:g}")
    return value


def step_key(step_id: str) -> tuple:
    """Order of a file's step ids (``Step Id``, ``Step``): numeric ones in numeric order, the
    others after them in text order."""
    text = step_id.strip()
    return (0, float(text), text) if re.fullmatch(r"[-+]?\d+(\.\d*)?", text) else (1, 0.0, text)


def parse_shapes(cell: str) -> list[Shape] | None:
    """An ``Input Shapes`` / ``Output Shapes`` cell of torch_npu and msprof:
    ``"4096,1,2048;4096,1,1024;;"`` -> ``[(4096, 1, 2048), (4096, 1, 1024), (), ()]``, one shape
    per tensor in order, ``()`` for a scalar (``'""'`` is one) or an absent optional input;
    ``None`` when the profiler recorded none (``N/A``, an empty cell).

    Raises:
        ValueError: a dimension that is not a non-negative whole number.
    """
    raw = cell.strip()
    if raw.upper() in ("", "N/A", "NA"):
        return None
    text = raw.strip('"').strip()  # a quoted empty cell ('""') is one scalar
    shapes = []
    for part in text.split(";"):
        dims = [d.strip() for d in part.strip().strip('"').split(",") if d.strip()]
        if not all(d.isdigit() for d in dims):
            raise ValueError(f"unparseable shapes {text[:60]!r}")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


#: The counters a real trace does not record: zero in an imported op record.
_UNRECORDED = {"flop": 0.0, "hbm_bytes": 0.0, "l2_bytes": 0.0, "block_dim": 0, "dma_count": 0, "ai_core_util_frac": 0.0,
               "hbm_bandwidth_util_frac": 0.0, "mac_ratio": 0.0, "vec_ratio": 0.0, "mte2_ratio": 0.0,
               "input_shapes": [], "dtype": "", "attrs": {}, "source": None, "comm": None}


def op_record(**fields) -> OpRecord:
    """An :class:`~simulator.profile.OpRecord` of an imported task: what the file does not
    record is zero (or empty)."""
    return OpRecord(**{**_UNRECORDED, **fields})


def lanes_fingerprint(lanes: Iterable[Iterable[str]]) -> str:
    """A workload fingerprint that does not depend on how the lanes (device streams, the
    communication lane) interleave: each lane's sequence of op keys is hashed in its own order,
    and the lanes' digests are hashed sorted, so neither the order in which the streams' tasks
    alternate nor the streams' numbering changes it. 16 hex digits."""
    digests = []
    for lane in lanes:
        digest = hashlib.sha256()
        for key in lane:
            digest.update(key.encode() + b";")
        digests.append(digest.hexdigest())
    return hashlib.sha256("|".join(sorted(digests)).encode()).hexdigest()[:16]


def imported_profile(ops: list[OpRecord], source: str, steps: int, fingerprint: str, *, devices: int = 1,
                     step_times_s: list[float] | None = None) -> Profile:
    """The profile of an imported run: ``hardware`` is ``real:<source>`` and
    ``simulator_version`` ``imported``, so that it compares only with imported runs of the same
    source and devices, never with simulated ones."""
    return Profile(simulator_version="imported", hardware=f"real:{source}", devices=devices, steps=max(1, steps),
                   workload_fingerprint=fingerprint, ops=ops, measured_step_times_s=step_times_s)


def trace_profile(ops: list[OpRecord], source: str, steps: int, fingerprint: str, *, devices: int = 1) -> Profile:
    """The profile of an imported trace whose ops fell in ``steps`` ``ProfilerStep#N`` windows;
    for a trace without step annotations (``steps`` 0), one step whose time is the device's busy
    time (:func:`busy_s`): the trace's span holds the host's idle gaps, seconds of them in a
    benchmark."""
    if steps:
        return imported_profile(ops, source, steps, fingerprint, devices=devices)
    return imported_profile(ops, source, 1, fingerprint, devices=devices, step_times_s=[busy_s(ops)])


# -- Chrome-trace events ----------------------------------------------------------------------------


def event_args(event: dict) -> dict:
    """A trace event's ``args``, ``{}`` when it has none or they are not an object."""
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def step_window(event: dict, path: Path, index: int) -> tuple[decimal.Decimal, decimal.Decimal]:
    """``(start_us, end_us)`` of a ``ProfilerStep#N`` event, event ``index`` of the file at ``path``.

    Raises:
        ImportError_: its ``ts`` or ``dur`` is not a number (naming the event).
    """
    where = f"event {index} ('{event.get('name', '')}')"
    start = timestamp_us(event.get("ts"), path, f"{where} ts")
    return start, start + decimal.Decimal(repr(duration_us(event.get("dur"), path, f"{where} dur")))


class StepWindows:
    """The host's ``ProfilerStep#N`` windows of a trace, ``(start_us, end_us)`` each, and the
    step a host time falls in."""

    def __init__(self, windows: Iterable[tuple[decimal.Decimal, decimal.Decimal]]) -> None:
        self.windows = sorted(windows)
        self._starts = [start for start, _ in self.windows]

    def __bool__(self) -> bool:
        return bool(self.windows)

    def __len__(self) -> int:
        return len(self.windows)

    def at(self, time_us: decimal.Decimal) -> int | None:
        """The index of the window holding ``time_us`` (ends included), ``None`` outside all."""
        k = bisect.bisect_right(self._starts, time_us) - 1
        return k if k >= 0 and time_us <= self.windows[k][1] else None

    def started_by(self, time_us: decimal.Decimal) -> int | None:
        """The last window that started at or before ``time_us``, ``None`` before the first:
        where a device task without a known launch belongs (a device runs behind its host)."""
        k = bisect.bisect_right(self._starts, time_us) - 1
        return k if k >= 0 else None


def busy_s(ops: Iterable[OpRecord]) -> float:
    """Time in which at least one op ran (the union of the ops' intervals), seconds."""
    total, end = 0.0, -math.inf
    for op in sorted(ops, key=lambda o: o.start_s):
        stop = op.start_s + op.duration_s
        if stop > end:
            total += stop - max(op.start_s, end)
            end = stop
    return total

"""How fast each kind of link carried a job's collectives: the torch_npu profiler's
``communication_matrix.json`` and ``communication.json`` (``ASCEND_PROFILER_OUTPUT``, one rank)
and msprof-analyze's ``cluster_communication_matrix.json`` (every rank).

The files nest, per step and communication group, one object per operator. In a matrix file the
operator holds one entry per link (``"<src>-<dst>"``, ranks within the group) with ``Transport
Type`` (``HCCS``, ``PCIE``, ``RDMA``, ``SIO``, or ``LOCAL`` for a rank's copy to itself),
``Transit Size(MB)`` (decimal megabytes the link carried), ``Transit Time(ms)`` and
``Bandwidth(GB/s)`` (the two divided); in ``communication.json`` the operator's ``Communication
Bandwidth Info`` holds the same three per transport (and ``SDMA``, the copy engine that drives
HCCS and PCIe transfers inside a server, which repeats them and is not read). Operators are
listed one by one and again summed: msprof-analyze's per-kind statistics name the sum
``<kind>-total@<group id>`` (besides ``-top1``, ``-middle``, ``-bottom1`` ... of single operators)
and ``communication.json`` and the cluster file ``Total Op Info``. :func:`read_link_rates` reads the
sums only, so no transfer counts twice.

Every problem is an :class:`~pytest_oam.files.realfile.ImportError_` (a ``ValueError``) naming the
file and the entry at fault.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from simulator.units import MEGA, S_PER_MS

from .realfile import ImportError_, number, read_text

MATRIX_FILE = "communication_matrix.json"
COMMUNICATION_FILE = "communication.json"
#: The group of an operator in ``communication.json`` that gives its bytes and time per transport.
BANDWIDTH_INFO = "Communication Bandwidth Info"
KIND = "a torch_npu communication_matrix.json or communication.json"
#: Transports between two NPUs (``LOCAL`` is a rank's copy to itself and is not read).
LINK_TRANSPORTS = ("HCCS", "PCIE", "RDMA", "SIO")
#: Names of an operator entry that sums the others of its group (see the module docstring).
TOTAL_ENTRY = "Total Op Info"
TOTAL_INFIX = "-total@"


@dataclass(frozen=True)
class LinkRate:
    """What one kind of link carried, summed over the file's summed operator entries."""

    transport: str  #: HCCS, PCIE, RDMA or SIO
    transit_bytes: float  #: bytes carried (the file's decimal megabytes x 1e6)
    transit_s: float  #: seconds the transfers took
    links: int  #: entries summed (a matrix file's links, communication.json's summed groups)

    @property
    def bytes_per_s(self) -> float:
        """The achieved rate, bytes per second: transit bytes over transit time."""
        return self.transit_bytes / self.transit_s


def _is_total(name: str) -> bool:
    return name == TOTAL_ENTRY or TOTAL_INFIX in name


def _link_entries(node: object, where: str = "", op: str | None = None):
    """Yield (where, operator name, link or transport, entry) for every entry with bytes and time
    under ``node``: a matrix file's link entries and ``communication.json``'s transports."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if not isinstance(value, dict):
            continue
        at = f"{where}/{key}" if where else str(key)
        if "Transport Type" in value:
            yield where, op, key, value
        elif key == BANDWIDTH_INFO:
            for transport, entry in value.items():
                if isinstance(entry, dict):
                    yield at, op, None, {**entry, "Transport Type": transport}
        else:
            yield from _link_entries(value, at, str(key))


def read_link_rates(path: str | Path) -> dict[str, LinkRate]:
    """Per transport between NPUs (:data:`LINK_TRANSPORTS`), the bytes and time of the file's
    summed operator entries (``<kind>-total@...``, ``Total Op Info``) over links between two
    different ranks (in ``communication.json``: every transport but ``SDMA``) that carried bytes;
    transports with none are absent. ``path`` is a matrix file or a ``communication.json``.

    Raises:
        ImportError_: unreadable, not JSON, not an object, a summed link entry without a number
            for ``Transit Size(MB)`` / ``Transit Time(ms)``, a negative one, bytes carried in no
            time, or no link entry at all.
    """
    file = Path(path)
    try:
        data = json.loads(read_text(file))
    except json.JSONDecodeError as exc:
        raise ImportError_(f"{file}: is not JSON ({exc.msg}, line {exc.lineno}); expected {KIND}") from None
    except RecursionError:
        raise ImportError_(f"{file}: JSON nested too deep to be {KIND}") from None
    if not isinstance(data, dict):
        raise ImportError_(f"{file}: is a JSON {type(data).__name__}, not an object; expected {KIND}")
    sums: dict[str, list[float]] = {}
    seen = 0
    try:
        entries = list(_link_entries(data))
    except RecursionError:
        raise ImportError_(f"{file}: JSON nested too deep to be {KIND}") from None
    for where, op, link, entry in entries:
        seen += 1
        transport = str(entry.get("Transport Type", "")).strip().upper()
        src, _, dst = str(link).partition("-") if link is not None else ("", "", "to another rank")
        if op is None or not _is_total(op) or transport not in LINK_TRANSPORTS or src == dst:
            continue
        at = f"{where}/{link if link is not None else transport}"
        size_mb = number(entry.get("Transit Size(MB)"), file, f"{at}: Transit Size(MB)")
        time_ms = number(entry.get("Transit Time(ms)"), file, f"{at}: Transit Time(ms)")
        if size_mb < 0 or time_ms < 0:
            raise ImportError_(f"{file}: {at}: {size_mb:g} MB in {time_ms:g} ms: a size and a time cannot be negative")
        if size_mb == 0:
            continue  # a transport the operator did not use
        if time_ms == 0:
            raise ImportError_(f"{file}: {at}: {size_mb:g} MB carried in 0 ms")
        total = sums.setdefault(transport, [0.0, 0.0, 0])
        total[0] += size_mb * MEGA
        total[1] += time_ms * S_PER_MS
        total[2] += 1
    if not seen:
        raise ImportError_(f"{file}: no link entry (an object with 'Transport Type' or "
                           f"'{BANDWIDTH_INFO}'); expected {KIND}")
    rates = {t: LinkRate(t, b, s, int(n)) for t, (b, s, n) in sums.items()}
    for rate in rates.values():
        if not math.isfinite(rate.bytes_per_s):
            raise ImportError_(f"{file}: the {rate.transport} entries sum to {rate.transit_bytes:g} bytes in "
                               f"{rate.transit_s:g} s, not a rate")
    return rates

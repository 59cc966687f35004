"""The device's streams and clocks: where each op starts, and what it holds up.

One simulated card (rank 0 of the job) has a compute stream and an HCCL stream. The compute
stream runs its ops in order; collectives run in order on the HCCL stream, a blocking one
holding compute until it is done, an asynchronous one beside it until a :class:`Work` is waited
for. The host issues kernels one after another (:func:`dispatch`). Stragglers (slow ranks,
degraded links) are modelled by each rank's lag behind rank 0, which rank 0 sees as waits in
the collectives it shares with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..costs import OpCost, OpSpec, op_cost
from ..hardware import HardwareSpec

if TYPE_CHECKING:
    from ..profile import OpRecord
    from .tensor import Tensor

#: The two streams of a card, as op records name them.
COMPUTE = "compute"
HCCL = "hccl"


def dispatch(ready_s: float, host_s: float, cost: OpCost, hw: HardwareSpec) -> tuple[float, float]:
    """Eager dispatch: when a kernel starts, and when the host can issue the next one.

    The host issues kernels one after another, ``hw.launch.host_dispatch_s`` apart (Python,
    ATen dispatch and torch_npu's aclnn call through its task queue); the device runs a kernel
    once its stream is free (``ready_s``) and the host has issued it (``host_s``). While kernels
    are longer than the host's interval the host runs ahead and costs nothing; shorter kernels
    leave the device idle between them (a host-bound run). The first kernel of a step is taken
    as issued when the step starts (``host_s`` = the step's start): its dispatch overlaps the end
    of the previous step, as in any timed loop, so a single kernel's time is the device's alone.
    An op that launches no kernel (a view) costs the host nothing here.

    Returns:
        ``(start_s, next_host_s)`` in seconds.
    """
    start_s = max(ready_s, host_s)
    return start_s, (host_s + hw.launch.host_dispatch_s if cost.kernel_count else host_s)


def copies(group: tuple[int, ...], devices: int) -> list[tuple[int, ...]]:
    """The groups that run the same collective at the same time: ``group`` shifted over the
    ranks (a tensor-parallel group 0-3 of 8 cards has the copy 4-7; a data-parallel group
    0, 4 has 1, 5 and 2, 6 and 3, 7), as long as the copies stay disjoint."""
    found, covered = [], set()
    for offset in range(devices):
        shifted = tuple(r + offset for r in group)
        if max(shifted) < devices and covered.isdisjoint(shifted):
            found.append(shifted)
            covered.update(shifted)
    return found


class Work:
    """An asynchronous collective (``async_op=True``), as ``torch.distributed`` returns one.

    The collective runs on the HCCL stream while the compute stream goes on; :meth:`wait`
    makes the compute stream wait for it (and, the HCCL stream being in order, for every
    collective issued before it).
    """

    def __init__(self, timeline: Timeline, index: int, end_s: float, result: Tensor) -> None:
        self._timeline, self._index, self._end_s, self.result = timeline, index, end_s, result

    def wait(self) -> Tensor:
        """Block the compute stream until the collective is done; returns its result tensor."""
        self._timeline.wait_for(self._index, self._end_s)
        return self.result


class Timeline:
    """The clocks of one card's streams and of the host that issues its kernels, in seconds.

    Args:
        hardware: the card.
        devices: cards in the job.
        slow_ranks: ``{rank: factor >= 1}``, see :class:`~simulator.runtime.NPU`.
        degraded_links: ``{(rank_a, rank_b): frac in (0, 1]}``, see :class:`~simulator.runtime.NPU`.
        op_gap_s: host time after each op that delays the host's next issue (online
            collection's callbacks), whatever the stream: it moves the host's clock, not the
            device's, so it is hidden while the device is busier than the host and shows in
            full in a host-bound run (kernels shorter than ``host_dispatch_s + op_gap_s``).

    Raises:
        TypeError: ``slow_ranks`` or ``degraded_links`` is not a dict.
        ValueError: a rank outside the job, a factor below 1, a fraction outside (0, 1].
    """

    def __init__(self, hardware: HardwareSpec, devices: int, slow_ranks: dict[int, float],
                 degraded_links: dict[tuple[int, int], float], op_gap_s: float = 0.0) -> None:
        self.hardware = hardware
        self.devices = devices
        self.op_gap_s = op_gap_s
        self.step = 0
        self.clock_s = 0.0  # the compute stream: when its next op can start
        self.hccl_clock_s = 0.0  # the HCCL stream: collectives run in order, beside compute
        self.host_s = 0.0  # when the host can issue the next kernel (see dispatch())
        self.last_hccl: int | None = None  # index of the last collective's record
        self.pending_wait: int | None = None  # a Work.wait() the next compute op records
        self.pending_host_sync = False  # a device_synchronize() the next compute op records (attrs["host_synced"])
        self.slow = self._check_slow_ranks(slow_ranks)
        self.links = self._check_links(degraded_links)
        # Straggler model: each rank's lag behind rank 0, in seconds (only with slow ranks or links).
        # A rank's lag is lag_base + lag[rank] (rank 0's is 0 by definition); the shared base
        # keeps the per-op update O(slow ranks) when rank 0 itself is slow.
        self.lag: list[float] | None = [0.0] * devices if (self.slow or self.links) else None
        self.lag_base = 0.0
        self.own_factor = self.slow.get(0, 1.0)  # rank 0's own compute slowdown

    # -- placing one op ---------------------------------------------------------------------

    def start(self, cost: OpCost, hccl: bool) -> float:
        """When an op of ``cost`` issued now starts: on the compute stream once it is free; on
        the HCCL stream once both streams are (a collective reads what compute wrote). Moves
        the host's clock on by the op's dispatch."""
        start_s, self.host_s = dispatch(max(self.clock_s, self.hccl_clock_s) if hccl else self.clock_s,
                                        self.host_s, cost, self.hardware)
        return start_s

    def collective_wait_s(self, group: tuple[int, ...], start_s: float, peer_ready_s: float | None) -> float:
        """How long a collective over ``group`` starting at ``start_s`` waits: for the slowest
        rank of its copies (stragglers), and, for a receive, until the peer sends
        (``peer_ready_s`` on this card's clock)."""
        wait_s = self._collective_wait(group) if self.lag is not None else 0.0
        if peer_ready_s is not None:
            wait_s = max(wait_s, peer_ready_s - start_s)
        return wait_s

    def finish(self, record: OpRecord, index: int, hccl: bool, async_op: bool) -> None:
        """Advance the streams past the op of ``record`` (the ``index``-th record)."""
        end_s = record.start_s + record.duration_s
        if hccl:
            self.hccl_clock_s = end_s
            self.last_hccl = index
            if not async_op:
                self.clock_s = end_s  # a blocking collective: compute waits for it
        else:
            self.clock_s = end_s
            if self.lag is not None:
                # each rank r computes base x factor_r; relative to rank 0 it falls behind by
                # (factor_r - factor_0) x base
                base_s = (record.duration_s - record.alloc_stall_s) / self.own_factor
                self.lag_base += (1.0 - self.own_factor) * base_s
                for rank, factor in self.slow.items():
                    if rank:
                        self.lag[rank] += (factor - 1.0) * base_s
        if self.op_gap_s:
            # host time (the callback runs in the process that issues kernels): it delays the
            # next issue, and the device only waits for it when the host is the bottleneck
            self.host_s += self.op_gap_s

    def lengthen(self, compute: bool, blocking: bool, stall_s: float) -> None:
        """The op just placed takes ``stall_s`` longer (an allocation stall charged to it): on
        the compute stream, or on the HCCL stream, where a ``blocking`` collective holds the
        compute stream too."""
        if compute:
            self.clock_s += stall_s
        else:
            # a collective's output: the collective (and a blocking caller) waited for it,
            # rather than the next step's first op
            self.hccl_clock_s += stall_s
            if blocking:
                self.clock_s = max(self.clock_s, self.hccl_clock_s)

    # -- waits and steps --------------------------------------------------------------------

    def wait_for(self, index: int, end_s: float) -> None:
        """The compute stream waits for the collective of record ``index``, done at ``end_s``;
        the next compute op records it (``attrs["wait_hccl_op"]``)."""
        self.clock_s = max(self.clock_s, end_s)
        self.pending_wait = index if self.pending_wait is None else max(self.pending_wait, index)

    def synchronize(self) -> None:
        """The compute stream waits for every collective issued so far."""
        if self.last_hccl is not None:
            self.wait_for(self.last_hccl, self.hccl_clock_s)

    def device_synchronize(self) -> None:
        """``torch.npu.synchronize()``: as :meth:`synchronize`, and the host waits for the device
        too: the next kernel is issued ``launch.host_dispatch_s`` after the device is idle (the host's
        lead is lost)."""
        self.synchronize()
        self.host_s = max(self.host_s, self.clock_s + self.hardware.launch.host_dispatch_s)
        self.pending_host_sync = True  # the next compute op records it, for recost

    def next_step(self) -> None:
        """Start the next step: a training step ends synchronised (the optimizer and the loss
        read finished tensors), and the host issues the step's first kernel as it starts."""
        self.step += 1
        self.clock_s = max(self.clock_s, self.hccl_clock_s)
        self.host_s = self.clock_s
        self.pending_wait = None
        self.pending_host_sync = False  # the new step's host starts with the device, as above

    # -- stragglers -------------------------------------------------------------------------

    def _check_slow_ranks(self, slow: dict[int, float]) -> dict[int, float]:
        if not isinstance(slow, dict):
            raise TypeError(f"slow_ranks must be a dict {{rank: factor}}, got {slow!r}")
        for rank, factor in slow.items():
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.devices:
                raise ValueError(f"slow_ranks: rank {rank!r} is not a rank of the {self.devices}-card job")
            if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 1):
                raise ValueError(f"slow_ranks[{rank}] must be a factor >= 1 (how many times slower), got {factor!r}")
        return {r: float(f) for r, f in slow.items() if f > 1}

    def _check_links(self, links: dict[tuple[int, int], float]) -> dict[frozenset[int], float]:
        if not isinstance(links, dict):
            raise TypeError(f"degraded_links must be a dict {{(rank_a, rank_b): fraction}}, got {links!r}")
        checked = {}
        for pair, frac in links.items():
            if (not isinstance(pair, tuple) or len(pair) != 2 or pair[0] == pair[1]
                    or any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.devices for r in pair)):
                raise ValueError(f"degraded_links: {pair!r} is not a pair of two ranks of the {self.devices}-card job")
            if not (isinstance(frac, (int, float)) and math.isfinite(frac) and 0 < frac <= 1):
                raise ValueError(f"degraded_links[{pair}] must be a bandwidth fraction in (0, 1], got {frac!r}")
            checked[frozenset(pair)] = float(frac)
        return checked

    def link_frac(self, op_type: str, inputs: Sequence[Tensor], dtype: str, attrs: dict[str, object],
                  group: tuple[int, ...]) -> float:
        """Degraded links: the bandwidth fraction of rank 0's copy of the collective; the other
        copies that run over a degraded link finish later, and their ranks fall behind by the
        difference (rank 0 waits for them at the next collective they share)."""
        def frac_of(copy: tuple[int, ...]) -> float:
            members = set(copy)
            return min((f for pair, f in self.links.items() if pair <= members), default=1.0)

        own = 1.0
        shapes = tuple(t.shape for t in inputs)
        base_s = None
        for copy in copies(group, self.devices):
            frac = frac_of(copy)
            if 0 in copy:
                own = frac
            elif frac < 1.0:
                if base_s is None:
                    base_s = op_cost(OpSpec(op_type, shapes, dtype, tuple(sorted(attrs.items()))), self.hardware).duration_s
                slow = {**attrs, "link_bandwidth_frac": frac}
                extra_s = op_cost(OpSpec(op_type, shapes, dtype, tuple(sorted(slow.items()))), self.hardware).duration_s
                for r in copy:
                    self.lag[r] += extra_s - base_s
        return own

    def _collective_wait(self, group: tuple[int, ...]) -> float:
        """Straggler model: every copy of the collective starts when its slowest member gets
        there; returns how long rank 0 waits, and re-bases every rank's lag on rank 0."""
        lag, base = self.lag, self.lag_base
        wait_s = 0.0
        for copy in copies(group, self.devices):
            latest = max(0.0 if r == 0 else base + lag[r] for r in copy)
            for r in copy:
                lag[r] = latest - base
            if 0 in copy:
                wait_s = latest  # >= 0: rank 0's own lag is 0
        self.lag_base -= wait_s  # rank 0's clock moved on by the wait
        return wait_s

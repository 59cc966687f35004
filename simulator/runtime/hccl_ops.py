"""HCCL collectives and point-to-point transfers, on the card's HCCL stream.

A mixin of :class:`~simulator.runtime.NPU`: each method checks its arguments, computes the
result when the input carries data, and hands the op to :meth:`~simulator.runtime.NPU.emit`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .tensor import ShapeError, Tensor, check_tensors, compute
from .timeline import HCCL, Timeline, Work


class HcclOps:
    """The collectives of :class:`~simulator.runtime.NPU`."""

    __slots__ = ()
    devices: int
    rank: int
    emit: Callable[..., int]
    _timeline: Timeline

    def _group(self, op: str, ranks: Sequence[int] | None, x: object) -> tuple[int, ...]:
        check_tensors(op, x=x)
        group = tuple(range(self.devices)) if ranks is None else tuple(ranks)
        if not group or len(set(group)) != len(group) or any(
            isinstance(r, bool) or not isinstance(r, int) or r < 0 or r >= self.devices for r in group
        ):
            raise ValueError(
                f"{op}: ranks {list(group)} must be distinct integers in [0, {self.devices})"
            )
        if self.rank not in group:
            raise ValueError(f"{op}: ranks {list(group)} must include the simulated rank {self.rank}")
        return group

    def _collective(self, op_type: str, costed: Tensor, out_shape: tuple[int, ...], dtype: str, group: tuple[int, ...],
                    name: str | None, async_op: bool, data_input: Tensor | None = None) -> Tensor | Work:
        if not isinstance(async_op, bool):
            raise TypeError(f"{op_type}: async_op must be True or False, got {async_op!r}")
        values = checks = None
        if data_input is not None and data_input.data is not None:
            values, checks = compute(op_type, (data_input,), dtype, out_shape, {"group_size": len(group)})
        out = Tensor(tuple(out_shape), dtype, None if values is None else values.data)
        # its output's allocation may lengthen the collective
        index = self.emit(op_type, (costed,), dtype, name, {"ranks": group}, outputs=(out,), stream=HCCL,
                          async_op=async_op, checks=checks)
        return Work(self._timeline, index, self._timeline.hccl_clock_s, out) if async_op else out

    def all_reduce(self, x: Tensor, *, ranks: Sequence[int] | None = None, name: str | None = None,
                   async_op: bool = False) -> Tensor | Work:
        """Sum ``x`` over the ranks (op type ``AllReduce``); default group: every card.

        Collectives run on the HCCL stream. A blocking one (the default) holds the compute
        stream until it is done; with ``async_op=True`` compute goes on and the call returns a
        :class:`~simulator.runtime.Work` to ``wait()`` on (as ``torch.distributed`` does). With
        data, every rank is taken to hold the same ``x`` (ranks alike), so the result is
        ``len(ranks) * x``. The first collective over a group takes HCCL's buffers
        (``interconnect.hccl_buffer_bytes``) of HBM.
        """
        group = self._group("AllReduce", ranks, x)
        return self._collective("AllReduce", x, x.shape, x.dtype, group, name, async_op, data_input=x)

    def all_gather(self, x: Tensor, *, ranks: Sequence[int] | None = None, name: str | None = None,
                   async_op: bool = False) -> Tensor | Work:
        """Concatenate each rank's ``x`` along axis 0 (op type ``AllGather``); ``async_op`` as
        in :meth:`all_reduce`."""
        group = self._group("AllGather", ranks, x)
        out_shape = (x.shape[0] * len(group), *x.shape[1:])
        return self._collective("AllGather", Tensor(out_shape, x.dtype), out_shape, x.dtype, group, name, async_op)

    def reduce_scatter(self, x: Tensor, *, ranks: Sequence[int] | None = None, name: str | None = None,
                       async_op: bool = False) -> Tensor | Work:
        """Sum ``x`` over the ranks and keep this rank's 1/p slice of axis 0 (``ReduceScatter``);
        ``async_op`` as in :meth:`all_reduce`.

        Raises:
            ShapeError: axis 0 is not divisible by the group size.
        """
        group = self._group("ReduceScatter", ranks, x)
        if x.shape[0] % len(group):
            raise ShapeError(f"ReduceScatter: axis 0 of {list(x.shape)} is not divisible by {len(group)} ranks")
        return self._collective("ReduceScatter", x, (x.shape[0] // len(group), *x.shape[1:]), x.dtype, group, name,
                                async_op)

    def broadcast(self, x: Tensor, *, src: int = 0, ranks: Sequence[int] | None = None, name: str | None = None,
                  async_op: bool = False) -> Tensor | Work:
        """Copy rank ``src``'s ``x`` to every rank of the group (op type ``Broadcast``);
        ``async_op`` as in :meth:`all_reduce`.

        Raises:
            ValueError: ``src`` is not in the group.
        """
        group = self._group("Broadcast", ranks, x)
        if src not in group:
            raise ValueError(f"Broadcast: src {src!r} is not in the group {list(group)}")
        return self._collective("Broadcast", x, x.shape, x.dtype, group, name, async_op)

    def all_to_all(self, x: Tensor, *, ranks: Sequence[int] | None = None, name: str | None = None,
                   async_op: bool = False) -> Tensor | Work:
        """Each rank sends the p-th slice of axis 0 of ``x`` to rank p (op type ``AllToAll``, as
        expert parallelism does); ``async_op`` as in :meth:`all_reduce`.

        Raises:
            ShapeError: axis 0 is not divisible by the group size.
        """
        group = self._group("AllToAll", ranks, x)
        if x.shape[0] % len(group):
            raise ShapeError(f"AllToAll: axis 0 of {list(x.shape)} is not divisible by {len(group)} ranks")
        return self._collective("AllToAll", x, x.shape, x.dtype, group, name, async_op)

    # -- point to point ------------------------------------------------------------------------

    def _peer(self, op: str, peer: object, x: object) -> int:
        check_tensors(op, x=x)
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < self.devices or peer == self.rank:
            raise ValueError(f"{op}: peer {peer!r} must be another rank of the {self.devices}-card job")
        return peer

    def send(self, x: Tensor, dst: int, *, name: str | None = None) -> None:
        """Send ``x`` to rank ``dst`` (op type ``Send``, on the HCCL stream, blocking)."""
        peer = self._peer("Send", dst, x)
        self.emit("Send", (x,), x.dtype, name, {"ranks": (self.rank, peer), "peer": peer}, stream=HCCL)

    def recv(self, x: Tensor, src: int, *, ready_s: float | None = None, name: str | None = None) -> Tensor:
        """Receive a tensor shaped like ``x`` from rank ``src`` (op type ``Receive``, blocking).

        ``ready_s``: when the peer sends it, on this device's clock (:attr:`clock_s`); a
        receive posted earlier waits (``attrs["wait_time_s"]``), e.g. for the stages after it
        in a pipeline.
        """
        peer = self._peer("Receive", src, x)
        if ready_s is not None and not (isinstance(ready_s, (int, float)) and math.isfinite(ready_s) and ready_s >= 0):
            raise ValueError(f"Receive: ready_s must be a finite time >= 0 in seconds, got {ready_s!r}")
        out = Tensor(tuple(x.shape), x.dtype)
        self.emit("Receive", (x,), x.dtype, name, {"ranks": (self.rank, peer), "peer": peer}, outputs=(out,),
                  stream=HCCL, peer_ready_s=ready_s)
        return out

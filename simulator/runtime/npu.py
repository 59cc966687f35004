"""The simulated card: :class:`NPU`, whose operators a workload calls eagerly, and :func:`run`.

Every operator checks its arguments and hands the op to :meth:`NPU.emit`, the one path that
costs it (:func:`simulator.costs.op_cost`), places it on the card's streams
(:class:`~simulator.runtime.timeline.Timeline`), gives its outputs and workspace device memory
(:class:`~simulator.runtime.memory.MemoryTracker`) and records it
(:class:`~simulator.runtime.collector.Collector`). The operators themselves live in mixins by
the unit that runs them (:mod:`~simulator.runtime.cube_ops`, :mod:`~simulator.runtime.vector_ops`,
:mod:`~simulator.runtime.hccl_ops`).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from .. import numerics
from ..allocator import AllocatorConfig, NpuCachingAllocator
from ..costs import COST_MODELS, OpCost, OpSpec, check_calibration, op_cost, op_workspace_bytes
from ..hardware import HardwareSpec, load_hardware
from ..profile import MemoryRecord, OpChecks, Profile
from ..units import DTYPE_BYTES
from .callsite import call_site
from .collector import Collector
from .cube_ops import CubeOps
from .hccl_ops import HcclOps
from .memory import MemoryTracker
from .record import check_op_time_scale, make_record
from .tensor import ShapeError, Tensor, check_dtype, check_shape, check_tensors, op_checks
from .timeline import COMPUTE, HCCL, Timeline, Work
from .vector_ops import VectorOps


class NPU(CubeOps, VectorOps, HcclOps):
    """One simulated Ascend card of a ``devices``-card job (this card is rank 0).

    Operators return new :class:`Tensor` objects and advance the device clock by their cost.

    Args:
        hardware: the spec of the card.
        devices: number of cards in the job; collectives default to all of them. A count HCCL
            does not support on the hardware's servers (``interconnect.hccl_server_device_counts``
            in one server, else whole servers) raises ``ValueError``.
        op_time_scale: fault injection for testing gates: multiply the duration of the named
            op types (e.g. ``{"FlashAttention": 1.05}``). Factors must be positive.
        collection: ``"offline"`` or ``"online"``, see :mod:`simulator.callbacks`.
        slow_ranks: stragglers, ``{rank: factor}``: that rank's compute takes ``factor`` times
            as long (>= 1); every rank of a collective waits for the slowest member, so rank 0
            (the simulated one) sees the wait in its collectives (``attrs["wait_time_s"]``), or,
            when rank 0 itself is slow, in its own kernels.
        degraded_links: ``{(rank_a, rank_b): frac}``: the link between two cards works at
            ``frac`` (0 < frac <= 1) of its bandwidth; a collective over a group holding both
            is bounded by it (``attrs["link_bandwidth_frac"]``).
    """

    def __init__(
        self,
        hardware: HardwareSpec,
        devices: int = 1,
        op_time_scale: dict[str, float] | None = None,
        allocator: AllocatorConfig | str | None = None,
        memory: bool = False,
        collection: str = "offline",
        slow_ranks: dict[int, float] | None = None,
        degraded_links: dict[tuple[int, int], float] | None = None,
    ) -> None:
        self._collector = Collector(collection)
        self.collection = self._collector.collection
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be a positive integer, got {devices!r}")
        hardware.interconnect.check_device_count(devices, hardware.name)
        check_calibration(hardware)
        self.hardware = hardware
        self.devices = devices
        self.rank = 0
        self._scale = check_op_time_scale(op_time_scale, COST_MODELS)
        #: Each op spec's cost and kernel workspace (bytes) on this card, computed once.
        self._cost_cache: dict[OpSpec, tuple[OpCost, int]] = {}
        self.tokens_per_step: int | None = None
        if isinstance(allocator, str):
            allocator = AllocatorConfig.from_conf_string(allocator)
        elif allocator is not None and not isinstance(allocator, AllocatorConfig):
            raise TypeError(f"allocator must be a PYTORCH_NPU_ALLOC_CONF string such as 'max_split_size_mb:128' "
                            f"or an AllocatorConfig, got {allocator!r}")
        self.memory = bool(memory or allocator is not None)
        self.allocator = NpuCachingAllocator(hardware, allocator) if self.memory else None
        op_gap_s = hardware.profiler.online_callback_overhead_s if self._collector.online else 0.0
        self._timeline = Timeline(hardware, devices, slow_ranks or {}, degraded_links or {}, op_gap_s)
        self._device_memory = MemoryTracker(hardware, self.allocator, self._collector.records, self._timeline)

    # -- the one path of every op --------------------------------------------------------------

    def emit(
        self,
        op_type: str,
        inputs: Sequence[Tensor],
        dtype: str,
        name: str | None = None,
        attrs: dict[str, object] | None = None,
        *,
        outputs: Sequence[Tensor] = (),
        stream: str = COMPUTE,
        async_op: bool = False,
        checks: OpChecks | None = None,
        peer_ready_s: float | None = None,
        source: str | None = None,
    ) -> int:
        """Run one op whose arguments are checked: cost it, place it on its stream, record it,
        and give its outputs and its kernel's workspace device memory. Every operator method
        ends here; a front end that captured a program emits its ops the same way.

        Args:
            op_type: a key of :data:`simulator.costs.COST_MODELS`, or ``aten::<name>`` for a
                captured PyTorch operator no mapping knows (:func:`simulator.costs.generic_cost`).
            inputs: the tensors the cost model reads (their shapes), in its order.
            dtype: the dtype the op computes in.
            name: the op's name in its record (default: ``op_type``).
            attrs: the cost model's attributes (a collective's ``ranks``; a point-to-point
                transfer's ``peer`` too).
            outputs: new tensors the op writes, not yet holding memory: each is bound to the
                op's record (``producer_index``) and allocated in order; a stall that takes
                is charged to this op. Then the kernel's workspace
                (:func:`simulator.costs.op_workspace_bytes`) is taken and given back.
            stream: ``"compute"`` or ``"hccl"``. On the HCCL stream the first collective
                over a group (an op without ``peer``) takes HCCL's buffers first.
            async_op: a collective the compute stream does not wait for.
            checks: what the computed values showed (ops on tensors with data).
            peer_ready_s: a receive: when the peer sends, on this card's clock.
            source: the ``file:line`` of the user's code that issued the op (default: found
                by walking the stack, :func:`~simulator.runtime.callsite.call_site`; a front
                end that knows it better, as the PyTorch capture does, passes it).

        Returns:
            The index of the op's record.

        Raises:
            OutOfMemoryError: an input larger than the HBM, or no memory for an output, the
                workspace or HCCL's buffers.
            ValueError, KeyError: the cost model cannot cost the op.
        """
        timeline, memory = self._timeline, self._device_memory
        attrs = dict(attrs) if attrs else {}  # one dict, not two, for the many ops without attributes
        hccl = stream == HCCL
        if hccl:
            group = attrs["ranks"]
            if "peer" not in attrs:
                memory.communicator(group)
            if timeline.links:
                frac = timeline.link_frac(op_type, inputs, dtype, attrs, group)
                if frac < 1.0:
                    attrs["link_bandwidth_frac"] = frac
            if async_op:
                attrs["async_op"] = True
        else:
            if timeline.pending_wait is not None:
                attrs["wait_hccl_op"] = timeline.pending_wait  # this op started after a Work.wait()
                timeline.pending_wait = None
            if timeline.pending_host_sync:
                attrs["host_synced"] = True  # issued after a device synchronisation (recost replays it)
                timeline.pending_host_sync = False
        spec = OpSpec(op_type, tuple(t.shape for t in inputs), dtype, tuple(sorted(attrs.items())) if attrs else ())
        known = self._cost_cache.get(spec)
        if known is None:
            memory.check_inputs_fit(op_type, name, inputs)
            known = self._cost_cache[spec] = (op_cost(spec, self.hardware), op_workspace_bytes(spec, self.hardware))
        cost, workspace_bytes = known
        start_s = timeline.start(cost, hccl)
        record = make_record(
            self.hardware, spec, cost, name=name or op_type, step=timeline.step, stream=stream, start_s=start_s,
            scale=self._scale.get(op_type, 1.0) * (timeline.own_factor if not hccl else 1.0),
            stall_s=memory.pending_stall_s, alloc_count=memory.pending_allocs,
            alloc_retries=memory.pending_retries, device_frees=memory.pending_device_frees,
            device_mallocs=memory.pending_device_mallocs, source=source or call_site(),
            wait_s=timeline.collective_wait_s(group, start_s, peer_ready_s) if hccl else 0.0, checks=checks,
        )
        memory.pending_stall_s = 0.0
        memory.pending_allocs = memory.pending_retries = memory.pending_device_frees = memory.pending_device_mallocs = 0
        collector = self._collector
        if collector.online:
            collector.deliver_final()  # the previous op can no longer change
        records = collector.records
        records.append(record)
        index = len(records) - 1
        timeline.finish(record, index, hccl, async_op)
        for out in outputs:
            out.__dict__["producer_index"] = index
            memory.allocate(out)
        if workspace_bytes:
            memory.workspace(workspace_bytes)
        return index

    # -- tensors -------------------------------------------------------------------------------

    def set_tokens_per_step(self, tokens: int) -> None:
        """Declare how many tokens one step processes (for tokens/s in reports)."""
        if not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens per step must be a positive integer, got {tokens!r}")
        self.tokens_per_step = tokens

    def tensor(self, shape: Sequence[int], dtype: str = "fp16") -> Tensor:
        """A tensor of ``shape`` and ``dtype`` on the device (its memory comes from the caching
        allocator; a device stall that allocation causes is charged to the next op).

        Raises:
            ShapeError: a bad shape or dtype.
            OutOfMemoryError: the card's HBM cannot hold it even after the cache is freed
                (without memory modelling: with the live tensors it would exceed the HBM).
        """
        tensor = Tensor(check_shape("tensor", shape), check_dtype("tensor", dtype))
        self._device_memory.allocate(tensor, charge_last=False)
        return tensor

    def from_numpy(self, array: object, dtype: str = "fp16") -> Tensor:
        """A device tensor holding a copy of ``array``'s values converted to ``dtype``.

        The conversion is the host's, as ``torch.from_numpy(a).to(dtype)``: fp16 through numpy
        ``float16`` (round to nearest even; a value beyond +-65504 becomes +-Inf, no
        saturation here), bf16 by rounding float32 to bfloat16 with round-to-nearest-even on
        the top 16 bits (:func:`simulator.numerics.round_bf16`, kept in a float32 array), fp32
        as float32, int32 by numpy's ``astype`` (floats truncated toward zero). Operators on
        tensors with data compute their results (see :mod:`simulator.numerics`); the shape is
        ``array``'s, memory is allocated as :meth:`tensor` does, and no op is recorded.

        Raises:
            ShapeError: ``dtype`` is not fp16, bf16, fp32 or int32; ``array`` is not numeric
                (bool, int, float) or has no elements or no axis.
            OutOfMemoryError: as :meth:`tensor`.
        """
        if dtype not in numerics.DATA_DTYPES:
            raise ShapeError(f"from_numpy: dtype {dtype!r} cannot carry data; use one of "
                             f"{', '.join(numerics.DATA_DTYPES)}")
        source = np.asarray(array)
        if source.dtype.kind not in "biuf":
            raise ShapeError(f"from_numpy: array must hold numbers, got numpy dtype {source.dtype}")
        shape = check_shape("from_numpy", source.shape)
        if dtype == "int32":
            info = np.iinfo(np.int32)
            with np.errstate(all="ignore"):
                wide = source.astype(np.float64) if source.dtype.kind == "f" else source
                outside = int(np.count_nonzero(~np.isfinite(wide) | (wide < info.min) | (wide > info.max))) \
                    if source.dtype.kind == "f" else int(np.count_nonzero((wide < info.min) | (wide > info.max)))
            if outside:
                raise ShapeError(f"from_numpy: {outside} values do not fit in int32 ({info.min}..{info.max})")
        if dtype == "bf16":
            data = numerics.round_bf16(source.astype(np.float32))
        else:
            with np.errstate(all="ignore"):
                data = source.astype(numerics.DATA_DTYPES[dtype])  # astype copies
        tensor = Tensor(shape, dtype, data)
        self._device_memory.allocate(tensor, charge_last=False)
        return tensor

    @staticmethod
    def to_numpy(tensor: Tensor) -> np.ndarray:
        """A copy of ``tensor``'s data (numpy float16 for fp16, float32 for bf16 and fp32, int32).

        Raises:
            ShapeError: ``tensor`` is not a Tensor.
            ValueError: ``tensor`` carries no data: only tensors made with :meth:`from_numpy`
                and the results of ops computed on them do (op types with a reference kernel in
                :data:`simulator.numerics.KERNELS`, every input carrying data).
        """
        check_tensors("to_numpy", tensor=tensor)
        if tensor.data is None:
            raise ValueError(
                f"to_numpy: {tensor!r} carries no data: only tensors made with npu.from_numpy and the results "
                f"of ops whose inputs all carry data do (op types that compute: {', '.join(numerics.KERNELS)})")
        return tensor.data.copy()

    def expect_shape(self, tensor: Tensor, shape: Sequence[int]) -> Tensor:
        """Declare that ``tensor``, an operator's output, should have ``shape``; returns ``tensor``.

        A mismatch is recorded, not raised: the record of the op that produced ``tensor`` gets
        ``checks.declared_shape`` and ``checks.output_shape``, and the ``shape-mismatch`` rule
        reports that op at its call site. When several outputs of one op are checked, a
        mismatch stays recorded over later matches.

        Raises:
            ShapeError: ``tensor`` is not a Tensor, ``shape`` is not a shape.
            ValueError: ``tensor`` was not produced by an operator of this NPU (made by
                :meth:`tensor` or :meth:`from_numpy`).
        """
        check_tensors("expect_shape", tensor=tensor)
        declared = check_shape("expect_shape", shape)
        records = self._collector.records
        index = tensor.producer_index
        if index is None or index >= len(records):
            raise ValueError(f"expect_shape: {tensor!r} was not produced by an operator of this NPU "
                             "(tensors made with npu.tensor or npu.from_numpy have the shape they were given)")
        record = records[index]
        old = record.checks
        if old is not None and old.declared_shape is not None and old.declared_shape != old.output_shape:
            return tensor  # keep the mismatch already recorded
        update = {"output_shape": list(tensor.shape), "declared_shape": list(declared)}
        checks = old.model_copy(update=update) if old is not None else OpChecks.model_construct(
            nan_count=0, inf_count=0, saturated_count=0, max_abs_value=None, out_of_bounds_elements=0, **update)
        records[index] = record.model_copy(update={"checks": checks})
        return tensor

    def view(self, tensor: Tensor, offset_elements: int, shape: Sequence[int], *, name: str | None = None) -> Tensor:
        """A tensor of ``shape`` over ``tensor``'s allocation from element ``offset_elements``
        (op type ``View``: host metadata, no kernel, zero device time).

        A view that reaches past the allocation (``offset_elements + numel(shape) >
        tensor.numel``; for a view of a view, past the allocation underneath) is recorded, not
        raised: its record has
        ``checks.out_of_bounds_elements``, and the ``out-of-bounds`` rule reports it. The view
        shares ``tensor``'s memory (and keeps it alive); it carries ``tensor``'s values when
        ``tensor`` has data and the view stays in bounds (past the end there are no values).

        Raises:
            ShapeError: ``tensor`` is not a Tensor, ``shape`` is not a shape, or
                ``offset_elements`` is not an integer >= 0.
        """
        check_tensors("View", tensor=tensor)
        dims = check_shape("View", shape)
        if isinstance(offset_elements, bool) or not isinstance(offset_elements, numbers.Integral) or offset_elements < 0:
            raise ShapeError(f"View: offset_elements must be an integer >= 0, got {offset_elements!r}")
        offset = int(offset_elements)
        numel = math.prod(dims)
        memory = self._device_memory
        # a view of a view is bounded by the allocation underneath, not by the outer view
        root, root_offset = memory.allocation_of(tensor)
        absolute = root_offset + offset
        past = max(0, absolute + numel - root.numel)
        checks = OpChecks.model_construct(
            output_shape=list(dims), nan_count=0, inf_count=0, saturated_count=0, max_abs_value=None,
            declared_shape=None, out_of_bounds_elements=past)
        attrs = {"offset_elements": offset}
        if root is not tensor:
            attrs.update(allocation_offset_elements=absolute, allocation_elements=root.numel)
        index = self.emit("View", (tensor,), tensor.dtype, name, attrs, checks=checks)
        data = None
        if root.data is not None and not past:
            data = root.data.reshape(-1)[absolute:absolute + numel].reshape(dims)
        out = Tensor(dims, tensor.dtype, data, index)
        memory.add_view(out, tensor, root, absolute)
        return out

    def memcpy(self, dst: Tensor, src: Tensor, nbytes: int, *, dst_offset_bytes: int = 0, src_offset_bytes: int = 0,
               name: str | None = None) -> Tensor:
        """Copy ``nbytes`` bytes from ``src`` (from byte ``src_offset_bytes``) into ``dst`` (from
        byte ``dst_offset_bytes``) on the device, as ``aclrtMemcpy(dst + dst_offset, ...,
        src + src_offset, nbytes, ACL_MEMCPY_DEVICE_TO_DEVICE)`` or
        ``dst.view(-1)[a:b].copy_(src.view(-1)[c:d])`` do; returns ``dst``.

        Op type ``Memcpy``, costed as a DMA data move (:func:`simulator.costs.memcpy_cost`). The
        offsets count from the start of the tensor; for a view (:meth:`view`) the allocation
        underneath bounds the copy. A copy that reads past ``src``'s allocation or writes past
        ``dst``'s is recorded, not raised: its record has ``checks.out_of_bounds_elements``
        (the larger overrun of the two sides, in elements) and attributes
        ``src_past_bytes`` / ``dst_past_bytes``, and the ``out-of-bounds`` rule reports it.
        When both tensors carry data (:meth:`from_numpy`) and the copy stays in bounds, ``dst``'s
        values (and those of views sharing its memory) are overwritten with ``src``'s, and the
        record's checks count NaN and Inf among the copied values; an in-bounds copy from a
        ``src`` without values leaves ``dst`` and its views without values; an out-of-bounds
        copy changes no values (what lies past an allocation is not modelled).

        Raises:
            ShapeError: ``dst`` or ``src`` is not a Tensor, their dtypes differ (a byte copy
                between dtypes reinterprets bits, which is not modelled: :meth:`cast` first), or
                ``nbytes`` and the offsets are not integers, whole elements of the dtype, with
                ``nbytes`` > 0 and the offsets >= 0.
        """
        check_tensors("Memcpy", dst=dst, src=src)
        if dst.dtype != src.dtype:
            raise ShapeError(f"Memcpy: src is {src.dtype} but dst is {dst.dtype}; a byte copy between dtypes "
                             "reinterprets the bits: npu.cast the source first")
        elt = DTYPE_BYTES[dst.dtype]
        sizes = {"nbytes": nbytes, "dst_offset_bytes": dst_offset_bytes, "src_offset_bytes": src_offset_bytes}
        for label, value in sizes.items():
            if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < (label == "nbytes")
                    or value % elt):
                raise ShapeError(f"Memcpy: {label} must be an integer {'> 0' if label == 'nbytes' else '>= 0'} "
                                 f"and a multiple of {elt} ({dst.dtype} elements), got {value!r}")
        nbytes, dst_offset, src_offset = int(nbytes), int(dst_offset_bytes), int(src_offset_bytes)
        memory = self._device_memory
        sides = {}
        for label, tensor, offset in (("dst", dst, dst_offset), ("src", src, src_offset)):
            root, root_offset = memory.allocation_of(tensor)
            start = root_offset * elt + offset  # byte offset into the allocation underneath
            sides[label] = (root, start, max(0, start + nbytes - root.nbytes))
        attrs: dict[str, object] = {"nbytes": nbytes, "dst_offset_bytes": dst_offset, "src_offset_bytes": src_offset}
        past_bytes = max(past for _, _, past in sides.values())
        checks = None
        if past_bytes:
            for label, (root, start, past) in sides.items():
                attrs.update({f"{label}_allocation_bytes": root.nbytes, f"{label}_allocation_offset_bytes": start,
                              f"{label}_past_bytes": past})
            checks = OpChecks.model_construct(
                output_shape=list(dst.shape), nan_count=0, inf_count=0, saturated_count=0, max_abs_value=None,
                declared_shape=None, out_of_bounds_elements=-(-past_bytes // elt))
        (dst_root, dst_start, _), (src_root, src_start, _) = sides["dst"], sides["src"]
        values = None
        if not past_bytes and dst_root.data is not None and src_root.data is not None:
            values = src_root.data.reshape(-1)[src_start // elt:(src_start + nbytes) // elt].copy()
            checks = op_checks(numerics.store(values, dst.dtype), [values.size])  # the copied values' NaN, Inf
        self.emit("Memcpy", (dst, src), dst.dtype, name, attrs, checks=checks)
        if values is not None:
            dst_root.data.flat[dst_start // elt:dst_start // elt + values.size] = values  # in place: views see it
        elif not past_bytes and dst_root.data is not None:
            # a copy from a tensor without values: what dst now holds is unknown, so dst and the
            # views of its memory carry no values any more (as an op's output would not)
            for tensor in [dst_root, *memory.views_of(dst_root)]:
                tensor.__dict__["data"] = None
        return dst

    def hold(self, tensor: Tensor, source: str | None = None) -> Tensor:
        """Give ``tensor``, made by a front end rather than an operator (a captured PyTorch
        storage), device memory now, as :meth:`tensor` does; ``source`` is the user's line that
        made it. A stall it causes is charged to the next op.

        Raises:
            OutOfMemoryError: as :meth:`tensor`.
        """
        return self._device_memory.allocate(tensor, charge_last=False, source=source)

    def next_step(self) -> None:
        """Close the open step and start the next (a front end running steps itself; :func:`run`
        does this between the workload's calls)."""
        self._next_step()

    def free(self, tensor: Tensor) -> None:
        """Give ``tensor``'s memory back to the caching allocator now (as ``del`` does when the
        last reference goes; without memory modelling its bytes leave the live total). An op
        that is later given ``tensor`` raises ``ValueError`` (a use after free), in either mode."""
        self._device_memory.free(tensor)

    # -- streams -------------------------------------------------------------------------------

    def work(self, index: int) -> Work:
        """The :class:`~simulator.runtime.Work` of the asynchronous collective just emitted as
        record ``index`` (``emit(..., stream="hccl", async_op=True)``): its ``wait()`` makes
        the compute stream wait for it, as the collectives of :mod:`~simulator.runtime.hccl_ops`
        return. Only right after that emit (its end is the HCCL stream's clock).

        Raises:
            ValueError: record ``index`` is not the last collective emitted.
        """
        if index != self._timeline.last_hccl:
            raise ValueError(f"work: record {index} is not the last collective emitted")
        return Work(self._timeline, index, self._timeline.hccl_clock_s, None)

    def synchronize(self) -> None:
        """Block the compute stream until every collective issued so far is done."""
        self._timeline.synchronize()

    def device_synchronize(self) -> None:
        """``torch.npu.synchronize()``: as :meth:`synchronize`, and the host waits for the device,
        so the next kernel is issued once the device is idle (``launch.host_dispatch_s`` after)."""
        self._timeline.device_synchronize()

    @property
    def clock_s(self) -> float:
        """The compute stream's clock: when the next compute op can start, in seconds."""
        return self._timeline.clock_s

    # -- steps and the profile -----------------------------------------------------------------

    def _close_step(self) -> None:
        self._collector.close_step(self._device_memory.close_step(self._timeline.step))

    def _next_step(self) -> None:
        self._close_step()
        self._timeline.next_step()

    def profile(self, steps: int) -> Profile:
        """The profile of the run so far, ``steps`` steps (the open one is closed)."""
        collector, memory = self._collector, self._device_memory
        if len(collector.memory_steps) < steps:
            self._close_step()
        collector.deliver_offline()
        return collector.profile(hardware=self.hardware.name, devices=self.devices, steps=steps,
                                 tokens_per_step=self.tokens_per_step, memory_events=memory.memory_records(),
                                 memory_peak=memory.peak())

    # -- read by tests written against the single-module runtime -------------------------------

    @property
    def _step(self) -> int:
        """The open step (the timeline's)."""
        return self._timeline.step

    @property
    def _finalizers(self) -> dict:
        """The memory tracker's weak references of live tensors, by tensor id."""
        return self._device_memory.finalizers

    def _memory_records(self) -> list[MemoryRecord]:
        """The memory tracker's record of every allocator call."""
        return self._device_memory.memory_records()


def run(
    workload: Callable[..., object],
    *args,
    steps: int = 1,
    hardware: str | HardwareSpec = "ascend910",
    devices: int = 1,
    op_time_scale: dict[str, float] | None = None,
    allocator: AllocatorConfig | str | None = None,
    memory: bool = False,
    collection: str = "offline",
    slow_ranks: dict[int, float] | None = None,
    degraded_links: dict[tuple[int, int], float] | None = None,
    **kwargs,
) -> Profile:
    """Run ``workload(npu, *args, **kwargs)`` ``steps`` times on a simulated card.

    Args:
        workload: the user function; it calls operators on ``npu``.
        steps: training or inference steps to run (>= 1).
        hardware: a bundled spec name (see :func:`simulator.list_hardware`), a hardware file's
            path (``"./my-910b.json"``, e.g. from ``oam calibrate``; relative to the current
            folder) or a spec.
        devices: cards in the job (one is simulated, all ranks alike): a count HCCL supports on
            the hardware's servers (1, 2, 4 or 8 cards in one 910 server, or whole servers).
        op_time_scale: fault injection, see :class:`NPU`; an op type the workload never ran
            gives a ``UserWarning`` after the run (one scale may serve a whole suite).
        memory: model device memory: every tensor takes HBM from a model of torch_npu's
            caching allocator (:mod:`simulator.allocator`) when it is made and gives it back
            when the Python object goes; device mallocs and failed allocations stall the op
            that needed the memory, and the profile gets per-step memory statistics. Off by
            default: it makes the simulation's own run about 2 to 2.7 times slower
            (``benchmarks/bench_memory_steps.py``). Without it the live tensors' bytes are still
            counted against the card's HBM: a workload they alone do not fit is out of memory
            too (a lower bound: the caching allocator's rounding, cache and fragmentation are not
            modelled, so a workload that fails only because of them still passes).
        allocator: the caching allocator's settings (implies ``memory``), as an
            :class:`AllocatorConfig` or a ``PYTORCH_NPU_ALLOC_CONF`` string
            (``"expandable_segments:True"``).
        collection: how op records reach callbacks registered with
            :func:`simulator.callbacks.register_op_callback`: ``"offline"`` (after the run, no
            overhead) or ``"online"`` (during the run, charging the hardware's
            ``profiler.online_callback_overhead_s`` per op to the host's clock: it delays the
            next kernel's issue, visible in the step only when the run is host-bound).
        slow_ranks, degraded_links: stragglers and slow links, see :class:`NPU`.

    Returns:
        The :class:`~simulator.profile.Profile` of the run.

    Raises:
        ValueError: unknown hardware, ``steps`` < 1, bad ``devices``, ``collection``,
            ``slow_ranks`` or ``degraded_links`` values, or any operator error.
        TypeError: ``slow_ranks`` or ``degraded_links`` is not a dict.
        OutOfMemoryError: the workload does not fit in the card's HBM (see ``memory``), or an
            op reads an input larger than the HBM.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    spec = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    npu = NPU(spec, devices, op_time_scale, allocator, memory, collection, slow_ranks, degraded_links)
    for step in range(steps):
        if step:
            npu._next_step()
        workload(npu, *args, **kwargs)
    profile = npu.profile(steps)
    if op_time_scale:
        ran = profile.op_types
        unused = sorted(set(op_time_scale) - set(ran))
        if unused:  # a fault that was never injected must not pass unnoticed for a gate that caught it
            warnings.warn(f"op_time_scale: the workload ran no op of type {', '.join(map(repr, unused))}, so "
                          f"nothing of it was scaled; its op types: {', '.join(sorted(ran))}", UserWarning, stacklevel=2)
    return profile

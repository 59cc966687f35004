"""The recorder: a ``TorchDispatchMode`` over fake tensors that runs each aten operator of the
user's torch code on the simulated card.

Every operator call that reaches the dispatcher (forward, autograd's backward, the optimizer)
is executed by the ``FakeTensorMode`` underneath (shapes and dtypes, no storage), then mapped
(:mod:`~simulator.capture.aten_map`) and handed to :meth:`simulator.runtime.NPU.emit`, the
path every native op takes, with the user's source line.

Device memory follows the storages of the fake tensors: a new storage takes device memory
(from the caching-allocator model with ``memory=True``, else counted against the HBM) when an
operator makes it, and gives it back when it dies. A storage's death is seen by weak
references to the Python tensors over it and confirmed with a weak reference to the storage
itself (PyTorch may keep a storage after its last Python tensor went: a gradient, a tensor
saved for backward); storages kept that way are checked again every
:data:`HELD_CHECK_EVERY` operators.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime import NPU
from ..runtime.tensor import Tensor
from ..runtime.timeline import HCCL
from ..units import DTYPE_BYTES
from .aten_map import (
    NO_KERNEL,
    NO_KERNEL_NAMESPACES,
    VIEW_OPS,
    base_name,
    cost_dtype,
    emission,
    tensors_in,
)
from .distributed import COLLECTIVE_NAMESPACES, describe, is_wait
from .errors import CaptureError, cost_message, data_dependent_message, real_parameter_message
from .sites import torch_call_site

#: Storages whose Python tensors all went but that PyTorch still holds are checked again after
#: this many operators (each check is a weak-reference test per storage).
HELD_CHECK_EVERY = 16


class _Storage:
    """One fake storage on the simulated card: its weak reference, the simulator tensor holding
    its device memory (``None`` while the storage is resized to 0 bytes), how many Python
    tensors over it are alive."""

    __slots__ = ("alive", "holder", "ref")

    def __init__(self, ref: StorageWeakRef, holder: Tensor | None) -> None:
        self.ref = ref
        self.holder = holder
        self.alive = 0


class Recorder(TorchDispatchMode):
    """Runs each captured aten operator on ``npu`` (see the module docstring).

    ``emitting`` false (the user's ``setup``): storages take device memory, no op is recorded.
    """

    def __init__(self, npu: NPU) -> None:
        super().__init__()
        self.npu = npu
        self.emitting = False
        self._storages: dict[int, _Storage] = {}
        self._watch: dict[weakref.ref, int] = {}  # weak reference of a Python tensor -> its storage key
        self._went: list[int] = []  # storages whose last Python tensor went since the last check
        self._held: set[int] = set()
        self._calls = 0
        self._site_of_node: list[tuple[weakref.ref, str]] = []
        self._kinds: dict[object, str] = {}  # operator -> what it is (_kind)
        self._works: dict[int, object] = {}  # storage of a functional collective's result -> its Work
        self._unwaited = False  # an async c10d collective in backward, not waited for yet
        self._paused = False
        self._dropout_p = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Operators inside run on fake tensors but not on the card (DTensor's shape inference)."""
        before, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = before

    @contextlib.contextmanager
    def attention_dropout(self, dropout_p: float) -> Iterator[None]:
        """The fused attention ops inside ran with dropout ``dropout_p`` in the user's code
        (:func:`simulator.capture.patches.fused_attention_with_dropout`)."""
        before, self._dropout_p = self._dropout_p, dropout_p
        try:
            yield
        finally:
            self._dropout_p = before

    # -- storages ------------------------------------------------------------------------------

    def _tensor_went(self, ref: weakref.ref) -> None:
        key = self._watch.pop(ref, None)
        if key is None:
            return
        entry = self._storages.get(key)
        if entry is not None:
            entry.alive -= 1
            if entry.alive <= 0:
                self._went.append(key)

    def _watch_tensor(self, tensor: torch.Tensor, key: int) -> None:
        self._watch[weakref.ref(tensor, self._tensor_went)] = key
        self._storages[key].alive += 1

    def _allocate(self, holder: Tensor) -> None:
        """Device memory for a storage no kernel made (an empty tensor, one made in setup or
        outside the capture), charged to the next op."""
        self.npu.hold(holder, source=torch_call_site())

    def _release(self, key: int) -> None:
        entry = self._storages.pop(key)
        self._held.discard(key)
        if entry.holder is not None:  # None: resized to 0 bytes
            self.npu.free(entry.holder)

    def settle(self, everything: bool = False) -> None:
        """Give back the memory of storages that died; ``everything``: check every held one too."""
        went, self._went = self._went, []
        for key in went:
            entry = self._storages.get(key)
            if entry is None or entry.alive > 0:
                continue
            if entry.ref.expired():
                self._release(key)
            else:
                self._held.add(key)
        self._calls += 1
        if self._held and (everything or self._calls % HELD_CHECK_EVERY == 0):
            for key in list(self._held):
                entry = self._storages.get(key)
                if entry is None or entry.alive > 0:
                    self._held.discard(key)
                elif entry.ref.expired():
                    self._release(key)

    def _storage_key(self, tensor: torch.Tensor) -> tuple[int, torch.UntypedStorage] | None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None  # a tensor without storage (sparse, nested): no device memory modelled
        return storage._cdata, storage

    def storage_resized(self, tensor: torch.Tensor) -> None:
        """``tensor``'s storage was resized in place (``untyped_storage().resize_``, which does
        not reach the dispatcher: FSDP2 frees an unsharded parameter's memory this way and
        takes it again before the next all-gather): its device memory follows the new size."""
        found = self._storage_key(tensor)
        if found is None:
            return
        key, storage = found
        entry = self._storages.get(key)
        if entry is None:
            return
        nbytes = storage.nbytes()
        held = entry.holder.shape[0] if entry.holder is not None else 0
        if nbytes == held or (nbytes == 0 and entry.holder is None):
            return
        if entry.holder is not None:
            self.npu.free(entry.holder)
            entry.holder = None
        if nbytes:
            entry.holder = Tensor((nbytes,), "int8")
            self._allocate(entry.holder)

    def adopt(self, tensor: torch.Tensor) -> Tensor | None:
        """Give ``tensor``'s storage device memory if it has none yet (a tensor made outside the
        capture, or before it); returns the new holder, else ``None``."""
        found = self._storage_key(tensor)
        if found is None:
            return None
        key, storage = found
        entry = self._storages.get(key)
        if entry is not None and not entry.ref.expired():
            return None
        if entry is not None:  # a dead storage's address, now another's
            self._release(key)
        holder = Tensor((max(1, storage.nbytes()),), "int8")
        self._storages[key] = _Storage(StorageWeakRef(storage), holder)
        self._watch_tensor(tensor, key)
        return holder

    # -- the dispatcher ------------------------------------------------------------------------

    def _kind(self, func) -> str:
        """What an operator is, decided once per operator: ``"view"`` (its output lies in its
        input's storage), ``"composite"`` (only a composite definition: its parts are the
        kernels), ``"host"`` (no kernel: allocation, bookkeeping) or ``"kernel"``."""
        kind = self._kinds.get(func)
        if kind is None:
            name = base_name(func)
            # only composite: an operator with a kernel of its own (silu_backward has both) is one kernel
            has = torch._C._dispatch_has_kernel_for_dispatch_key
            if func.is_view or name in VIEW_OPS:
                kind = "view"
            elif (has(func.name(), "CompositeImplicitAutograd") and not has(func.name(), "CPU")
                  and not has(func.name(), "CompositeExplicitAutograd")):
                kind = "composite"
            else:
                kind = "host" if name in NO_KERNEL else "kernel"
            self._kinds[func] = kind
        return kind

    def _view(self, func, args: tuple, kwargs: dict, inputs: list[torch.Tensor]):
        """A view runs no kernel and takes no memory: its output lies in its input's storage.
        (A view of a tensor of another fake mode, one copied by ``copy.deepcopy``, or of a real
        tensor gets a storage of its own from the fake mode: it stands for the input's memory.)"""
        out = func(*args, **kwargs)
        base = inputs[0] if inputs else None
        for tensor in tensors_in(out):
            found = self._storage_key(tensor)
            if found is None or (base is not None and tensor is base):
                continue
            key, storage = found
            entry = self._storages.get(key)
            if entry is None or entry.ref.expired():
                if entry is not None:
                    self._release(key)
                self._storages[key] = _Storage(StorageWeakRef(storage), None)
            self._watch_tensor(tensor, key)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        if any(kind is not FakeTensor and kind is not torch.Tensor for kind in types):
            # a tensor subclass (DTensor of tensor parallelism and FSDP2): it runs the op on its
            # local tensors, which come back here with the shapes this card computes
            return NotImplemented
        if func.namespace in NO_KERNEL_NAMESPACES:
            return func(*args, **kwargs)
        self.settle()
        if self._site_of_node:
            self._label_nodes()
        inputs = tensors_in((args, kwargs))
        if any(tensor.device.type == "meta" for tensor in inputs):
            return func(*args, **kwargs)  # shape inference on meta tensors (a library's): not on the card
        for tensor in inputs:  # the warm-up's too: it would already give a real model fake gradients
            if tensor.requires_grad and not isinstance(tensor, FakeTensor):
                raise CaptureError(real_parameter_message(torch_call_site(), func, tensor))
        kind = self._kind(func)
        if kind == "view":
            return self._view(func, args, kwargs, inputs)
        if self.emitting and kind == "composite":
            # a composite operator that reached the dispatcher undecomposed (under
            # torch.inference_mode: linear, scaled_dot_product_attention, ...): its parts, here
            with self:
                return func.decompose(*args, **kwargs)
        for tensor in inputs:
            holder = self.adopt(tensor)
            if holder is not None:
                self._allocate(holder)
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            raise CaptureError(data_dependent_message(torch_call_site(), func)) from None
        outputs = tensors_in(out)
        if func._schema.is_mutable:  # an out= argument or resize_ may have resized a storage
            for tensor in inputs:
                self.storage_resized(tensor)
        if not inputs and any(tensor.device.type == "meta" for tensor in outputs):
            return out  # a meta tensor made from nothing: not on the card
        input_ids = {id(t) for t in inputs}
        new_holders = []
        returned_new = []
        for tensor in outputs:
            if id(tensor) in input_ids:
                continue  # an in-place op returning its input
            found = self._storage_key(tensor)
            if found is None:
                continue
            key, _ = found
            if key in self._storages and not self._storages[key].ref.expired():
                self._watch_tensor(tensor, key)  # a view, or an op writing into an existing storage
            else:
                holder = self.adopt(tensor)
                if holder is not None:
                    new_holders.append(holder)
                    returned_new.append(tensor)
        if self.emitting and func.namespace in COLLECTIVE_NAMESPACES:
            self._collective(func, args, kwargs, outputs, new_holders)
            return out
        if not self.emitting or kind == "host":  # setup and warm-up; allocations, host bookkeeping
            self._allocate_all(new_holders)
            return out
        if not returned_new and outputs and not func._schema.is_mutable:
            # every output aliases an input (a view: transpose, expand, _unsafe_view...): no kernel
            return out
        if self._works:
            self._wait_for_inputs(inputs)
        made = emission(func, args, kwargs, outputs)
        if made is None:
            self._allocate_all(new_holders)
            return out
        if isinstance(made, list):  # several kernels: the outputs' memory goes with the last
            for part in made[:-1]:
                self._emit(func, part, [])
            made = made[-1]
        site = self._emit(func, made, new_holders)
        if site is not None and torch._C._current_autograd_node() is None:
            self._site_of_node.extend((weakref.ref(t), site) for t in outputs)
        return out

    def _emit(self, func, made, holders: list) -> str | None:
        """One simulated op of a captured call, at the user's line (returned)."""
        if self._dropout_p and made.op_type in ("FlashAttention", "FlashAttentionGrad"):
            made.attrs["dropout_p"] = self._dropout_p
        site = self._site()
        if self._unwaited and torch._C._current_autograd_node() is None:
            # c10d collectives issued with async_op=True in backward (DDP's gradient buckets):
            # their wait() never reaches the dispatcher; DDP waits for them when backward ends
            self.npu.synchronize()
            self._unwaited = False
        spec_inputs = tuple(Tensor(shape, made.dtype) for shape in made.shapes)
        try:
            self.npu.emit(made.op_type, spec_inputs, made.dtype, None, made.attrs, outputs=holders, source=site)
        except (ValueError, KeyError) as error:
            raise CaptureError(cost_message(site, func, made, error, self.npu.hardware.name)) from None
        return site

    # -- collectives ---------------------------------------------------------------------------

    def _collective(self, func, args: tuple, kwargs: dict, outputs: list[torch.Tensor], new_holders: list) -> None:
        """A c10d or functional collective as the simulator's HCCL collective on the HCCL
        stream; a ``wait_tensor`` makes the compute stream wait for the collective that made
        its tensor."""
        if is_wait(func):
            found = self._storage_key(tensors_in(args)[0])
            work = None if found is None else self._works.pop(found[0], None)
            if work is not None:
                work.wait()
            self._allocate_all(new_holders)
            return
        site = self._site()
        try:
            collective = describe(func, args, kwargs)
        except NotImplementedError as error:
            raise CaptureError(f"{site or 'the step'}: {error}") from None
        if collective is None:
            self._allocate_all(new_holders)
            return
        dtype = cost_dtype(collective.dtype)
        shape = collective.shape
        element_bytes = collective.dtype.itemsize
        if element_bytes != DTYPE_BYTES[dtype]:  # int64 / fp64 cost as 4-byte types: count their bytes
            shape = (math.prod(shape) * element_bytes // DTYPE_BYTES[dtype],)
        try:
            index = self.npu.emit(collective.op_type, (Tensor(shape, dtype),), dtype, None,
                                  {"ranks": collective.ranks}, outputs=new_holders, stream=HCCL,
                                  async_op=collective.async_op, source=site)
        except (ValueError, KeyError) as error:
            raise CaptureError(f"{site or 'the step'}: {func} as {collective.op_type} {list(collective.shape)} "
                               f"over ranks {list(collective.ranks)}: {error}") from None
        if collective.async_op:
            # the compute stream waits when an op first reads what the collective wrote: its
            # wait_tensor (functional), or, for a c10d Work whose wait() never reaches the
            # dispatcher, the first kernel that reads its tensors
            written = outputs if collective.functional else tensors_in(args[:1])
            work = self.npu.work(index)
            for tensor in written:
                found = self._storage_key(tensor)
                if found is not None:
                    self._works[found[0]] = work
            if not collective.functional and torch._C._current_autograd_node() is not None:
                self._unwaited = True

    def _wait_for_inputs(self, inputs: list[torch.Tensor]) -> None:
        for tensor in inputs:
            found = self._storage_key(tensor)
            work = None if found is None else self._works.pop(found[0], None)
            if work is not None:
                work.wait()

    def _allocate_all(self, holders: list) -> None:
        for holder in holders:
            self._allocate(holder)

    # -- call sites ----------------------------------------------------------------------------

    def _site(self) -> str | None:
        """The user's line of the op now running: in backward, the line of the forward op whose
        gradient this is (kept on its autograd node); else the innermost user frame."""
        node = torch._C._current_autograd_node()
        if node is not None:
            site = node.metadata.get("oam_site")
            if site is not None:
                return site
        return torch_call_site()

    def _label_nodes(self) -> None:
        """Keep each forward op's line on the autograd node of its outputs (made after the op
        returned), for the backward ops of that node."""
        pending, self._site_of_node = self._site_of_node, []
        for ref, site in pending:
            tensor = ref()
            node = None if tensor is None else tensor.grad_fn
            if node is not None and "oam_site" not in node.metadata:
                node.metadata["oam_site"] = site

"""torch.distributed inside a capture: PyTorch's fake process group, and its collectives read
as HCCL collectives of the simulated card.

With ``devices=N`` the capture initialises torch.distributed on the fake backend PyTorch ships
for testing (``torch.testing._internal.distributed.fake_pg``: rank 0 of a world of N, every
collective a no-op), so DDP, FSDP2 (``fully_shard``) and DTensor tensor parallelism
(``init_device_mesh`` + ``parallelize_module``) run unmodified over fake tensors. Four places
of PyTorch read tensor values that fake tensors do not have; each is patched at the narrowest
point for the capture only, and restored after it:

1. ``DeviceMesh`` reads its rank map (``tolist``): its constructors run with the dispatch
   modes suspended (PyTorch does the same for sub-meshes), and a rank map made under the fake
   mode is rebuilt as ``arange(numel).view(shape)``, which ``init_device_mesh`` makes.
2. DDP's constructor checks parameter shapes across ranks from tensor data: a no-op (one rank
   is simulated, all ranks alike). Its initial parameter broadcast runs, not recorded (setup).
3. The fake kernels of the c10d collectives return a ``Work`` holding no result, which DDP's
   reducer cannot read: for the capture they return a completed ``Work`` holding the op's
   tensors.
4. From its second step DDP rebuilds its buckets in gradient-ready order, broadcasting a few
   int32 bucket indices it writes and reads: while it does, integer tensors made from nothing
   are real (bytes), everything else stays fake.
5. FSDP2 frees an unsharded parameter after use by resizing its storage to 0 bytes and takes
   the memory again before the next all-gather (``untyped_storage().resize_``), which does not
   reach the dispatcher: its ``free_storage`` / ``alloc_storage`` tell the recorder, so the
   device memory follows.
6. DTensor (tensor parallelism, FSDP2's sharded parameters) infers an op's output by running
   it on fake tensors of the global shapes, then runs it on this card's local tensors: the
   inference runs with the recorder paused, so only the local op is simulated.

One rank is simulated, as for native workloads: its collectives are the job's.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import CaptureError

#: Dispatcher namespaces of collectives: c10d (ProcessGroup ops returning a Work) and the
#: functional collectives (completed by ``_c10d_functional.wait_tensor``).
COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd"})

#: c10d ops whose fake kernel returns (first argument, Work).
_WORK_OPS = ("broadcast_", "allreduce_", "allgather_", "_allgather_base_", "reduce_scatter_",
             "_reduce_scatter_base_", "scatter_", "alltoall_", "alltoall_base_")

#: Collective (operator name without ``_`` decoration) -> the simulator's op type.
COLLECTIVE_OP_TYPES = {
    "allreduce": "AllReduce", "all_reduce": "AllReduce",
    "allgather": "AllGather", "allgather_base": "AllGather", "all_gather_into_tensor": "AllGather",
    "reduce_scatter": "ReduceScatter", "reduce_scatter_base": "ReduceScatter",
    "reduce_scatter_tensor": "ReduceScatter",
    "broadcast": "Broadcast",
    "alltoall": "AllToAll", "alltoall_base": "AllToAll", "all_to_all_single": "AllToAll",
}
#: Collectives that move no data the simulator models.
NO_DATA = frozenset({"barrier", "monitored_barrier"})


def _completed_work(tensors: object) -> torch.ScriptObject:
    from torch._C._distributed_c10d import _create_work_from_future

    future = torch.futures.Future()
    future.set_result(tensors)
    return _create_work_from_future(future).boxed()


def _identity_ranks(tensor: torch.Tensor | None) -> torch.Tensor | None:
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(tensor, FakeTensor):
        return torch.arange(tensor.numel(), dtype=torch.int).view(tensor.shape)
    return tensor


def _real_integers_mode(fake: object) -> object:
    """A dispatch mode under which integer tensors made without fake inputs are real, every
    other op runs under ``fake`` (DDP's bucket rebuild, item 4 of the module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class RealIntegers(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
            real = (not any(isinstance(t, FakeTensor) for t in leaves)
                    and (leaves or kwargs.get("dtype") in (torch.int32, torch.int64)))
            if real:
                return func(*args, **kwargs)
            with fake:
                return func(*args, **kwargs)

    return RealIntegers()


@contextlib.contextmanager
def fake_process_group(world_size: int, on_storage_resize: Callable[[torch.Tensor], None],
                       not_on_the_card: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """torch.distributed on the fake backend, rank 0 of ``world_size``, with the patches of
    the module docstring; everything is undone on exit, and each patch as soon as a later step
    of the set-up fails. ``on_storage_resize(tensor)`` is called after FSDP2 resizes a
    parameter's storage in place (item 5); DTensor's sharding propagation runs inside
    ``not_on_the_card()`` (item 6).

    Raises:
        CaptureError: torch.distributed is already initialised in this process (the
            capture cannot replace the user's process group), or this torch lacks an internal
            the patches need (they are written against torch 2.13).
    """
    if dist.is_initialized():
        raise CaptureError("torch.distributed is already initialised in this process: the capture runs the step "
                           "on its own fake process group; call the step without initialising it")
    with contextlib.ExitStack() as undo:
        try:
            _patch(undo, world_size, on_storage_resize, not_on_the_card)
        except (ImportError, AttributeError, KeyError) as error:
            raise CaptureError(f"multi-card capture patches torch internals written against torch 2.13, and torch "
                               f"{torch.__version__} lacks one: {type(error).__name__}: {error}") from None
        yield


def _set(undo: contextlib.ExitStack, owner: object, name: str, value: object) -> None:
    """``owner.name = value`` until ``undo`` closes (the original, as stored on ``owner``, back)."""
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    undo.callback(setattr, owner, name, original)


def _patch(undo: contextlib.ExitStack, world_size: int, on_storage_resize: Callable[[torch.Tensor], None],
           not_on_the_card: Callable[[], contextlib.AbstractContextManager]) -> None:
    import torch.nn.parallel.distributed as ddp
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.testing._internal.distributed.fake_pg import (
        FakeStore,  # registers the "fake" backend
    )
    from torch.utils._python_dispatch import _disable_current_modes

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    undo.callback(dist.destroy_process_group)

    original_init = DeviceMesh.__init__
    original_from_group = DeviceMesh.__dict__["from_group"]
    original_rebuild = dist.Reducer.__dict__["_rebuild_buckets"]
    original_propagate = ShardingPropagator.__dict__["_propagate_tensor_meta_non_cached"]

    @functools.wraps(original_init)
    def mesh_init(self, device_type, mesh=None, *args, _rank_map=None, **kwargs):
        with _disable_current_modes():
            original_init(self, device_type, _identity_ranks(mesh), *args, _rank_map=_identity_ranks(_rank_map),
                          **kwargs)

    @functools.wraps(original_from_group.__func__)
    def from_group(*args, **kwargs):
        with _disable_current_modes():
            return original_from_group.__func__(*args, **kwargs)

    def rebuild_buckets(reducer):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        fake = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
        if fake is None:
            return original_rebuild(reducer)
        with unset_fake_temporarily(), _real_integers_mode(fake):
            return original_rebuild(reducer)

    def telling(resize: Callable[[torch.Tensor], None]) -> Callable[[torch.Tensor], None]:
        @functools.wraps(resize)
        def resize_and_tell(tensor: torch.Tensor) -> None:
            resize(tensor)
            on_storage_resize(tensor)

        return resize_and_tell

    @functools.wraps(original_propagate)
    def propagate_off_the_card(self, op_schema):
        with not_on_the_card():
            return original_propagate(self, op_schema)

    library = torch.library.Library("c10d", "IMPL")
    undo.callback(library._destroy)  # the original fake kernels come back
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
        for name in _WORK_OPS:
            if len(getattr(torch.ops.c10d, name).default._schema.returns) == 1:  # alltoall_base_: the Work only
                library.impl(name, lambda *args: _completed_work(args[0]), "Meta")
            else:
                library.impl(name, lambda *args: (args[0], _completed_work(args[0])), "Meta")
    _set(undo, DeviceMesh, "__init__", mesh_init)
    _set(undo, DeviceMesh, "from_group", staticmethod(from_group))
    _set(undo, ddp, "_verify_param_shape_across_processes", lambda *args, **kwargs: None)
    _set(undo, dist.Reducer, "_rebuild_buckets", rebuild_buckets)
    _set(undo, ShardingPropagator, "_propagate_tensor_meta_non_cached", propagate_off_the_card)
    for module in (_fsdp_param, _fsdp_param_group):
        for name in ("alloc_storage", "free_storage"):
            if hasattr(module, name):
                _set(undo, module, name, telling(getattr(module, name)))


@dataclass(frozen=True)
class Collective:
    """One captured collective: the simulator's ``op_type``, the shape its cost model reads
    (the input of AllReduce, ReduceScatter, Broadcast and AllToAll; the gathered output of
    AllGather), the torch dtype, the group's global ranks, and whether the compute stream may
    go on (``async_op``: a functional collective, completed by ``wait_tensor``; a c10d op
    called with ``async_op=True``)."""

    op_type: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    ranks: tuple[int, ...]
    async_op: bool
    functional: bool


def _name(func: torch._ops.OpOverload) -> str:
    return func._schema.name.split("::")[-1].strip("_")


def is_collective(func: torch._ops.OpOverload) -> bool:
    return func.namespace in COLLECTIVE_NAMESPACES


def is_wait(func: torch._ops.OpOverload) -> bool:
    return func.namespace in COLLECTIVE_NAMESPACES and _name(func) == "wait_tensor"


def describe(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Collective | None:
    """The collective of one captured c10d or functional-collective call (``None``: one that
    moves no data, a barrier).

    Raises:
        NotImplementedError: a collective the simulator has no model of (point-to-point
            send/recv, gather, reduce), named.
    """
    name = _name(func)
    if name in NO_DATA:
        return None
    op_type = COLLECTIVE_OP_TYPES.get(name)
    if op_type is None:
        raise NotImplementedError(
            f"{func}: the simulator has no model of this collective yet (it captures all_reduce, all_gather, "
            "reduce_scatter, broadcast and all_to_all; point-to-point send/recv of pipeline parallelism is not "
            "captured)")
    bound = dict(kwargs)
    for argument, value in zip(func._schema.arguments, args):
        bound[argument.name] = value
    functional = func.namespace != "c10d"
    if functional:
        from torch._C._distributed_c10d import _resolve_process_group

        group_name = bound["group_name"]
        group = group_name if isinstance(group_name, dist.ProcessGroup) else _resolve_process_group(group_name)
    else:
        group = dist.ProcessGroup.unbox(bound["process_group"])
    ranks = tuple(dist.get_process_group_ranks(group))
    tensors = [t for t in torch.utils._pytree.tree_leaves(list(args)) if isinstance(t, torch.Tensor)]
    if functional:
        local = tensors[0]
        shape = tuple(local.shape)
        if op_type == "AllGather":
            shape = (local.shape[0] * len(ranks), *local.shape[1:]) if local.dim() else (len(ranks),)
    elif op_type == "AllGather":
        shape = tuple(tensors[0].shape) if name == "allgather_base" else (sum(t.numel() for t in tensors[:-1]),)
    elif op_type == "ReduceScatter":
        shape = tuple(tensors[1].shape) if name == "reduce_scatter_base" else (sum(t.numel() for t in tensors[1:]),)
    elif op_type == "AllToAll":
        shape = tuple(tensors[-1].shape) if name == "alltoall_base" else (sum(t.numel() for t in tensors) // 2,)
    else:
        shape = (sum(t.numel() for t in tensors),)  # a list of tensors reduced or broadcast together
    # the schema's default is True (ProcessGroup calls from C++, such as DDP's reducer, pass none)
    async_op = True if functional else bool(bound.get("async_op", True))
    return Collective(op_type, shape, tensors[0].dtype, ranks, async_op, functional)

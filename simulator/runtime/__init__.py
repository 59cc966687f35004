"""The eager runtime: a simulated NPU that workloads call like torch_npu code calls kernels.

A workload is a plain function ``workload(npu, *args, **kwargs)``. Each operator call checks
its arguments and hands the op to :meth:`NPU.emit`, which costs it through
:func:`~simulator.costs.op_cost`, places it on the card's streams, gives its outputs device
memory and appends its record to the run. Tensors carry shape and dtype only, unless made with
:meth:`NPU.from_numpy`: those carry data, and operators on them compute their result
(:mod:`simulator.numerics`) and record what its values showed (``OpRecord.checks``).

The modules, one concern each:

- :mod:`.npu`: :class:`NPU` (its tensors, views, copies, and :meth:`NPU.emit`) and :func:`run`;
  the operators by unit in :mod:`.cube_ops`, :mod:`.vector_ops` and :mod:`.hccl_ops`;
- :mod:`.tensor`: :class:`Tensor`, :class:`ShapeError`, argument checks, computed values;
- :mod:`.timeline`: the streams and clocks, host dispatch, stragglers, :class:`Work`;
- :mod:`.memory`: device memory, the glue to the caching allocator;
- :mod:`.record` and :mod:`.collector`: an op's record, and the records gathered into a
  :class:`~simulator.profile.Profile` and delivered to callbacks;
- :mod:`.callsite`: the user's line that issued an op;
- :mod:`.recost`: a recorded run costed again on other hardware.
"""

from .npu import NPU, run
from .recost import recost
from .tensor import ShapeError, Tensor
from .timeline import Work, dispatch
from .timeline import copies as _copies  # noqa: F401  (tests/test_streams.py imports it under this name)

__all__ = ["NPU", "ShapeError", "Tensor", "Work", "dispatch", "recost", "run"]

# Named after the path users import them from, as before the runtime became a package: tracebacks
# print "simulator.runtime.ShapeError", and pickles find the classes there.
NPU.__module__ = ShapeError.__module__ = Tensor.__module__ = Work.__module__ = __name__

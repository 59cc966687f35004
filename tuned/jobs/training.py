"""Whole-step workloads of tuning jobs (``oam tune tuned/jobs/llama7b_training_memory.toml``)."""

from simulator.models import LLAMA2_7B, ParallelLayout, training_step
from simulator.units import MiB


def llama7b_training(npu, seq_len=2048, tensor_parallel=2, data_parallel=4, grad_bucket_params=None, prealloc_mib=0):
    """One Llama-2-7B training step on rank 0 of ``tensor_parallel x data_parallel`` cards
    (``simulator.models.training_step``, which holds the card's weights, gradient buffer and
    optimizer state in device memory for the job, so that the caching allocator works near
    the 910's HBM capacity).

    ``grad_bucket_params`` is the data-parallel gradient bucket (parameters; default
    Megatron-Core's ``max(40M, 1M x dp)``). ``prealloc_mib`` > 0 pre-allocates a pool: one block
    of that many MiB is allocated and given back before the step, so the caching allocator holds
    one large segment that later requests split (the ``torch.empty(n, device="npu"); del``
    idiom), instead of a device malloc per new size. The allocator's settings are the run's
    ``allocator`` (a tuning parameter of its own, see ``pytest_oam.tune.auto_tune``).

    Raises:
        ValueError: the layout does not match the job's cards or the step does not fit in HBM.
        OutOfMemoryError: the pool or the step does not fit in the card's HBM.
    """
    layout = ParallelLayout(tensor_parallel=tensor_parallel, data_parallel=data_parallel)
    if prealloc_mib:
        npu.free(npu.tensor((prealloc_mib * MiB,), "int8"))
    training_step(npu, LLAMA2_7B, seq_len=seq_len, layout=layout, grad_bucket_params=grad_bucket_params)

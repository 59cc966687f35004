"""Multi-card capture: torch.distributed on PyTorch's fake process group, collectives as HCCL
collectives of the simulated card (simulator/capture/distributed.py).

Sizes are in elements; each is derived in a comment from the model's shapes and the group of 8.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the test extra installs torch: pip install '.[test]'")

from simulator.capture import CaptureError, run_torch

pytest_plugins = ["pytester"]

HIDDEN, FFN, TOKENS = 1024, 4096, 8


class MLP(torch.nn.Module):
    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN) if norm else torch.nn.Identity()
        self.up = torch.nn.Linear(HIDDEN, FFN, bias=not norm)
        self.act = torch.nn.ReLU()
        self.down = torch.nn.Linear(FFN, HIDDEN, bias=not norm)

    def forward(self, x):
        return self.down(self.act(self.up(self.norm(x))))


def train_step(model, opt, x):
    model(x).float().square().mean().backward()
    opt.step()
    opt.zero_grad()


def collectives(profile, step: int | None = None) -> list[tuple[str, int]]:
    out = []
    for op in profile.ops:
        if op.stream == "hccl" and (step is None or op.step == step):
            numel = 1
            for size in op.input_shapes[0]:
                numel *= size
            out.append((op.op_type, numel))
    return out


@pytest.fixture(autouse=True)
def _default_dtype():
    before = torch.get_default_dtype()
    yield
    torch.set_default_dtype(before)


def test_tensor_parallel_mlp_all_reduces_its_output_once():
    """Megatron's MLP split over 8 cards: up column-parallel (each card holds 4096 / 8 = 512 of
    its output features), down row-parallel (512 of its input features). Forward: the up
    product is local (8 x 1024 @ 1024 x 512), the down product gives a partial sum of the whole
    output (8 x 512 @ 512 x 1024), which one AllReduce of 8 x 1024 = 8,192 elements completes.
    Backward: the replicated output gradient gives every local gradient without communication
    (the input needs no gradient), and AdamW updates local shards only."""
    def setup():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        torch.set_default_dtype(torch.bfloat16)
        mesh = init_device_mesh("cpu", (8,))
        model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        return model, torch.optim.AdamW(model.parameters(), foreach=True), torch.randn(TOKENS, HIDDEN)

    profile = run_torch(train_step, setup=setup, hardware="ascend910b", devices=8)
    assert collectives(profile) == [("AllReduce", TOKENS * HIDDEN)]
    allreduce = next(op for op in profile.ops if op.stream == "hccl")
    assert allreduce.dtype == "bf16"
    shapes = [op.input_shapes for op in profile.ops if op.op_type == "MatMul"]
    assert shapes[:2] == [[[1, 8, 1024], [1, 1024, 512]], [[1, 8, 512], [1, 512, 1024]]]  # local, not global


def test_sequence_parallel_block_all_gathers_and_reduce_scatters():
    """With sequence parallelism each card holds 2,048 of the 16,384 positions (8 x 2,048)
    between the blocks. Forward: AllGather of the normalised input before the column-parallel
    product (16,384 x 1,024 elements gathered), ReduceScatter of the row-parallel partial sums
    (16,384 x 1,024 in). Backward mirrors them: the output gradient is all-gathered, the input
    gradient reduce-scattered, each 16,384 x 1,024 elements. No AllReduce."""
    def setup():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        torch.set_default_dtype(torch.bfloat16)
        mesh = init_device_mesh("cpu", (8,))
        plan = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                "down": RowwiseParallel(output_layouts=Shard(1))}
        model = parallelize_module(MLP(norm=True), mesh, plan)
        return model, torch.randn(1, 2048, HIDDEN, requires_grad=True)

    def step(model, x):
        model(x).float().square().mean().backward()

    profile = run_torch(step, setup=setup, hardware="ascend910b", devices=8)
    full = 8 * 2048 * HIDDEN
    assert collectives(profile) == [("AllGather", full), ("ReduceScatter", full),
                                    ("AllGather", full), ("ReduceScatter", full)]


def ddp_setup():
    torch.set_default_dtype(torch.bfloat16)
    model = torch.nn.parallel.DistributedDataParallel(MLP())
    return model, torch.optim.AdamW(model.parameters(), foreach=True), torch.randn(TOKENS, HIDDEN)


def test_ddp_first_step_reduces_every_gradient_in_one_bucket():
    """Without a warm-up the simulated step is DDP's first: one bucket holds every gradient,
    up 1,024 x 4,096 + 4,096 and down 4,096 x 1,024 + 1,024 = 8,393,728 elements, reduced
    asynchronously during backward. When backward ends DDP waits for it (and copies the bucket
    back into the gradients), before the optimizer runs."""
    profile = run_torch(train_step, setup=ddp_setup, hardware="ascend910b", devices=8, warmup_steps=0)
    assert collectives(profile) == [("AllReduce", 8_393_728)]
    index = next(i for i, op in enumerate(profile.ops) if op.stream == "hccl")
    assert profile.ops[index].attrs.get("async_op") is True
    after = profile.ops[index + 1:]
    waiting = next(i for i, op in enumerate(after) if op.attrs.get("wait_hccl_op") == index)
    first_optimizer_op = next(i for i, op in enumerate(after) if op.op_type.startswith("Foreach"))
    assert waiting <= first_optimizer_op


def test_ddp_steady_state_after_the_warm_up():
    """The default warm-up step runs DDP's first iteration unsimulated; in the simulated one
    DDP rebuilds its buckets in the order gradients became ready: rank 0 broadcasts the bucket
    assignment (5 int32 indices, one per parameter plus an end marker) and sizes (2), then the
    down layer's gradients (4,195,328 elements, ready first: a first bucket of at most 1 MiB
    takes them whole, as a bucket holds whole tensors) and the up layer's (4,198,400) are
    reduced in two buckets."""
    profile = run_torch(train_step, setup=ddp_setup, hardware="ascend910b", devices=8)
    assert collectives(profile) == [("Broadcast", 5), ("Broadcast", 2), ("AllReduce", 4_195_328),
                                    ("AllReduce", 4_198_400)]


def test_fsdp2_gathers_parameters_and_scatters_gradients_per_module():
    """fully_shard on up, down and the root: each card keeps 1/8 of every parameter. The
    unsharded up (4,096 x 1,024 + 4,096 = 4,198,400) and down (1,024 x 4,096 + 1,024 =
    4,195,328) are all-gathered before use and their gradients reduce-scattered after backward,
    one collective per module and direction."""
    def setup():
        from torch.distributed.fsdp import fully_shard

        torch.set_default_dtype(torch.bfloat16)
        model = MLP()
        fully_shard(model.up), fully_shard(model.down), fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), foreach=True), torch.randn(TOKENS, HIDDEN)

    profile = run_torch(train_step, setup=setup, hardware="ascend910b", devices=8, memory=True)
    found = collectives(profile)
    up, down = 4_198_400, 4_195_328
    assert sorted(n for op, n in found if op == "ReduceScatter") == [down, up]
    gathered = [n for op, n in found if op == "AllGather"]
    assert set(gathered) == {up, down} and len(gathered) >= 2
    # AdamW's state is sharded: its first-step zeros are 1/8 of the parameters (bf16, 2 bytes)
    fills = sum(op.attrs.get("write_bytes", 0) for op in profile.ops if op.op_type == "Fill" and op.step == 0)
    assert fills <= 2 * 2 * (up + down) // 8 + 4096


def test_a_step_calling_torch_distributed_directly():
    """dist.all_reduce on a 1,024 x 1,024 tensor over the 8 cards, blocking and then with
    async_op=True and an explicit wait."""
    import torch.distributed as dist

    def step(x):
        dist.all_reduce(x)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        (x * 2).sum()

    profile = run_torch(step, torch.randn(1024, 1024, dtype=torch.bfloat16), hardware="ascend910b", devices=8)
    assert collectives(profile) == [("AllReduce", 1024 * 1024)] * 2
    ops = [op for op in profile.ops if op.stream == "hccl"]
    assert ops[0].attrs.get("async_op") is None and ops[1].attrs.get("async_op") is True
    assert not dist.is_initialized()  # the fake process group is gone after the capture


def test_point_to_point_is_a_clear_error():
    import torch.distributed as dist

    def step(x):
        dist.send(x, dst=1)

    line = step.__code__.co_firstlineno + 1
    with pytest.raises(CaptureError, match=rf"{__file__}:{line}: .*send.*no model of this collective"):
        run_torch(step, torch.randn(16), hardware="ascend910b", devices=8)


def test_a_step_that_initialises_torch_distributed_itself():
    import torch.distributed as dist

    def step(x):
        dist.init_process_group("gloo", rank=0, world_size=8)

    line = step.__code__.co_firstlineno + 1
    with pytest.raises(CaptureError, match=rf"{__file__}:{line}: .*twice.*leave init_process_group out"):
        run_torch(step, torch.randn(4), hardware="ascend910b", devices=8)
    assert not dist.is_initialized()


def test_devices_the_hardware_does_not_support():
    with pytest.raises(ValueError, match="3"):
        run_torch(lambda x: x * 2, torch.randn(4), hardware="ascend910b", devices=3)


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_gate_a_tensor_parallel_step(pytester, xdist):
    pytester.makepyfile(test_tp='''
        import pytest, torch

        def setup():
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
            torch.set_default_dtype(torch.bfloat16)
            mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
            mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
            model = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
            return model, torch.optim.AdamW(model.parameters(), foreach=True), torch.randn(64, 1024)

        def step(model, opt, x):
            model(x).float().square().mean().backward()
            opt.step()
            opt.zero_grad()

        @pytest.mark.parametrize("cards", [8, 4])
        def test_tp(oam_profile, cards):
            oam_profile.run_torch(step, setup=setup, hardware="ascend910b", devices=cards)
    ''')
    pytester.runpytest_subprocess("--oam-save-baseline", *xdist).assert_outcomes(passed=2)
    result = pytester.runpytest_subprocess("--oam-baseline", *xdist)
    result.assert_outcomes(passed=2)
    saved = "".join(path.read_text() for path in (pytester.path / "baselines").rglob("*.json"))
    assert saved.count('"AllReduce"') >= 2  # one per card count, each gated


def test_a_c10d_work_is_waited_for_when_its_tensor_is_read():
    """dist.all_reduce(x, async_op=True); work.wait(); x * 2: the wait never reaches the
    dispatcher, so the compute stream waits where x is read next (the Mul), not earlier and
    not never."""
    import torch.distributed as dist

    def step(x):
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        return x * 2

    profile = run_torch(step, torch.randn(1024, 1024, dtype=torch.bfloat16), hardware="ascend910b", devices=8)
    allreduce = next(op for op in profile.ops if op.op_type == "AllReduce")
    mul = next(op for op in profile.ops if op.op_type == "Mul")
    assert mul.start_s >= allreduce.start_s + allreduce.duration_s


def test_int64_collectives_move_eight_bytes_an_element():
    import torch.distributed as dist

    def step(x):
        dist.all_reduce(x)

    as_int64 = run_torch(step, torch.zeros(1 << 20, dtype=torch.int64), hardware="ascend910b", devices=8)
    as_int32 = run_torch(step, torch.zeros(1 << 21, dtype=torch.int32), hardware="ascend910b", devices=8)
    first = next(op for op in as_int64.ops if op.stream == "hccl")
    second = next(op for op in as_int32.ops if op.stream == "hccl")
    assert first.duration_s == pytest.approx(second.duration_s)  # 8 MiB both

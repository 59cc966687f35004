"""Cost models: pure functions ``cost(spec, hw) -> OpCost``, found through :data:`COST_MODELS`.

Every function is a pure function of an :class:`OpSpec` (op type, input shapes, dtype and
attributes) and a :class:`~simulator.hardware.HardwareSpec`; nothing is stored on either.
Times are seconds, sizes bytes, work FLOP.

The AI Core operators share one kernel model (:mod:`simulator.kernel_model`: blocks in waves
over the AI Cores, a pipeline of the Cube, Vector and DMA units, HBM and L2 traffic, the launch
floor); FlashAttention's models are in :mod:`simulator.attention_costs`. Data that the blocks
of one wave share is read from HBM once per wave and served from L2 to the other blocks, and
operands that fit in L2 whole are read from HBM once.

The pipe ratios follow msprof's definitions: ``mac_ratio`` (Cube busy share),
``vec_ratio`` (Vector busy share), ``mte2_ratio`` (MTE2 busy share), each averaged over the
AI Cores and the kernel's duration.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import replace

from .attention_costs import (
    flash_attention_cost,
    flash_attention_grad_cost,
)
from .hardware import HardwareFileError, HardwareSpec, hardware_file_path
from .kernel_model import (
    ACCUMULATOR_BYTES,
    DOUBLE_BUFFER_STAGES,
    MATMUL_BASE_M,
    MATMUL_BASE_N,
    CommCost,
    Kernel,
    OpCost,
    OpSpec,
    ceil_div,
    cube_time_s,
    numel,
    round_up,
    run_kernel,
    vector_time_s,
)
from .units import DTYPE_BYTES
from .vector_profiles import GENERIC_OP_CLASSES, GENERIC_OP_PREFIX, VECTOR_PROFILES, VectorProfile

# --------------------------------------------------------------------------------------
# MatMul / BatchMatMul


def matmul_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """(batch, M, K) @ (batch, K, N) on the Cube unit, tiled per AI Core.

    ``spec.shapes`` is ``((batch, M, K), (batch, K, N))``. Base tile ``m_t x n_t`` is limited
    by L0C (fp32 accumulators; CATLASS's Atlas A2 matmul uses a 128 x 256 L0C tile, the whole
    128 KiB); K is streamed from HBM into L1 in chunks that fit L1 with double buffering.
    """
    (batch, m, k), (_, _, n) = spec.shapes
    return _best_matmul(batch, m, k, n, spec.dtype, hw)


def _best_matmul(
    batch: int, m: int, k: int, n: int, dtype: str, hw: HardwareSpec,
    a_hbm_bytes: float | None = None, b_hbm_bytes: float | None = None,
) -> OpCost:
    """The fastest of the kernel's split-K choices (the tiling picks it, as CANN's does).

    Split-K: when the C tiles leave cores idle, the cores can share K and add their fp32
    partial tiles into C atomically (CATLASS's split-K matmul; CANN's Conv2DBackpropFilter
    splits the batch axis the same way). Taking the best split keeps "more work never takes
    less time": a larger problem has at most the splits of a smaller one.
    """
    cu, cores = hw.cube_unit, hw.ai_core.count
    m_t, n_t = matmul_tile(m, n, hw)
    tiles = batch * ceil_div(m, m_t) * ceil_div(n, n_t)
    max_split = max(1, min(cores // tiles, ceil_div(k, cu.fractal_k))) if tiles < cores else 1
    return min(
        (run_kernel(_matmul_kernel(batch, m, k, n, dtype, hw, a_hbm_bytes, b_hbm_bytes, split), hw, cores)
         for split in range(1, max_split + 1)),
        key=lambda cost: cost.duration_s,
    )


def matmul_tile(m: int, n: int, hw: HardwareSpec) -> tuple[int, int]:
    """The (rows, columns) C tile one AI Core computes for an ``m x n`` result: the base tile
    (:data:`MATMUL_BASE_M` x :data:`MATMUL_BASE_N`), cut to the fp32 accumulators L0C holds and
    to the result padded to the Cube fractal."""
    cu = hw.cube_unit
    m_t = min(round_up(m, cu.fractal_m), MATMUL_BASE_M)
    n_cap = hw.memory.l0c_bytes_per_core // (m_t * ACCUMULATOR_BYTES)
    return m_t, min(round_up(n, cu.fractal_n), MATMUL_BASE_N, n_cap // cu.fractal_n * cu.fractal_n)


def _matmul_kernel(
    batch: int, m: int, k: int, n: int, dtype: str, hw: HardwareSpec,
    a_hbm_bytes: float | None = None, b_hbm_bytes: float | None = None, split_k: int = 1,
) -> Kernel:
    """The tiled Cube kernel of a (batch, m, k) @ (batch, k, n) product, K split ``split_k`` ways.

    ``a_hbm_bytes`` / ``b_hbm_bytes`` replace the operands' sizes in memory when the kernel
    builds the matrix in L1 from a smaller tensor (a convolution's feature map, expanded by
    the load3d img2col of the MTE1 queue): HBM and L2 then carry the smaller tensor.
    """
    elt = DTYPE_BYTES[dtype]
    cu = hw.cube_unit
    m_t, n_t = matmul_tile(m, n, hw)
    m_blocks, n_blocks = ceil_div(m, m_t), ceil_div(n, n_t)
    cores = hw.ai_core.count
    k_split = ceil_div(k, split_k)
    block_dim = batch * m_blocks * n_blocks * split_k
    k_chunk = hw.memory.l1_bytes_per_core // ((m_t + n_t) * elt * DOUBLE_BUFFER_STAGES)
    k_chunk = max(cu.fractal_k, k_chunk // cu.fractal_k * cu.fractal_k)
    k_chunks = ceil_div(k_split, k_chunk)
    a_bytes = batch * m * k * elt if a_hbm_bytes is None else min(a_hbm_bytes, batch * m * k * elt)
    b_bytes = batch * k * n * elt if b_hbm_bytes is None else min(b_hbm_bytes, batch * k * n * elt)
    a_share = a_bytes / (batch * m * k * elt)
    b_share = b_bytes / (batch * k * n * elt)
    # Each block reads an A panel (m_t x K) and a B panel (K x n_t) and writes its C tile.
    # Operands that fit in L2 whole come from HBM once; otherwise the raster decides how
    # often each panel comes from HBM, and the other reads are L2 hits.
    read_bytes = block_dim * (m_t * a_share + n_t * b_share) * k_split * elt
    unique_read_bytes = a_bytes + b_bytes
    write_bytes = batch * m * n * (elt if split_k == 1 else split_k * ACCUMULATOR_BYTES)
    if unique_read_bytes / batch * min(batch, cores) <= hw.memory.l2_bytes:
        hbm_read_bytes = unique_read_bytes
    else:
        # Swizzled raster: each wave covers a patch of rows x cols C tiles (rows x cols ~
        # cores), so A is read from HBM once per patch column band and B once per patch row
        # band (CANN's matmul L2 tiling does the same); the raster with the least traffic wins.
        banded = min(
            a_bytes * ceil_div(n_blocks, min(n_blocks, ceil_div(cores, rows)))
            + b_bytes * ceil_div(m_blocks, rows)
            for rows in range(1, cores + 1)
        )
        hbm_read_bytes = min(read_bytes, max(unique_read_bytes, banded))
    hbm_bytes = hbm_read_bytes + write_bytes
    l2_bytes = read_bytes - hbm_read_bytes
    return Kernel(
        block_dim=block_dim,
        cube_s_per_block=cube_time_s(m_t, k_split, n_t, dtype, hw),
        vector_s_per_block=0.0,
        hbm_bytes=hbm_bytes,
        l2_bytes=max(0.0, l2_bytes),
        dma_per_block=2 * k_chunks + 1,
        stages=DOUBLE_BUFFER_STAGES,
        # MTE1 feeds L0A/L0B one 16-deep K step at a time: that is the pipeline's grain.
        iterations=ceil_div(k_split, cu.fractal_k),
        flop=2.0 * batch * m * k * n,
    )


# --------------------------------------------------------------------------------------
# Convolution (implicit GEMM on the Cube unit)


def conv_output_hw(h: int, w: int, kh: int, kw: int, stride: int, padding: int) -> tuple[int, int]:
    """Output height and width of a convolution or pooling window."""
    return (h + 2 * padding - kh) // stride + 1, (w + 2 * padding - kw) // stride + 1


def conv2d_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """2-D convolution and its two gradients as implicit GEMMs on the Cube unit.

    Shapes (NCHW): ``Conv2D``: x (N, Cin, H, W), weight (Cout, Cin, kh, kw);
    ``Conv2DBackpropInput``: dy (N, Cout, Ho, Wo), weight, and the ``input_hw`` attribute;
    ``Conv2DBackpropFilter``: x, dy. Attributes ``stride`` and ``padding``.

    Ascend keeps feature maps in the NC1HWC0 layout (C0 = the Cube's K fractal, 16 for
    fp16), so the reduction axis is ``ceil(C / C0) * C0 * kh * kw`` and a 3-channel image pays
    for 16. The feature map is read once from HBM and expanded into the img2col matrix in L1
    (load3d), so HBM traffic is the tensors themselves.
    """
    stride, padding = spec.attr("stride"), spec.attr("padding")
    c0 = hw.cube_unit.fractal_k
    elt = DTYPE_BYTES[spec.dtype]
    if spec.op_type == "Conv2D":
        (n, cin, h, w), (cout, _, kh, kw) = spec.shapes
        ho, wo = conv_output_hw(h, w, kh, kw, stride, padding)
        m, k, cols = n * ho * wo, round_up(cin, c0) * kh * kw, cout
        return _best_matmul(1, m, k, cols, spec.dtype, hw, a_hbm_bytes=n * round_up(cin, c0) * h * w * elt)
    if spec.op_type == "Conv2DBackpropInput":
        (n, cout, ho, wo), (_, cin, kh, kw) = spec.shapes
        h, w = spec.attr("input_hw")
        m, k, cols = n * h * w, round_up(cout, c0) * kh * kw, cin
        return _best_matmul(1, m, k, cols, spec.dtype, hw, a_hbm_bytes=n * cout * ho * wo * elt)
    # Conv2DBackpropFilter: dW (Cout, Cin kh kw) = dy^T (Cout, N Ho Wo) @ img2col(x)
    (n, cin, h, w), (_, cout, ho, wo) = spec.shapes
    kh, kw = spec.attr("kernel_hw")
    m, k, cols = cout, n * ho * wo, round_up(cin, c0) * kh * kw
    return _best_matmul(1, m, k, cols, spec.dtype, hw, b_hbm_bytes=n * round_up(cin, c0) * h * w * elt)


# --------------------------------------------------------------------------------------
# Vector operators


def vector_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """Element-wise and row-wise Vector unit operators (see :data:`VECTOR_PROFILES`).

    ``spec.shapes[0]`` is the main input; it is streamed through the Unified Buffer in chunks,
    double-buffered, over the Vector units. With attributes ``read_bytes`` and ``write_bytes``
    (an op captured from PyTorch, whose inputs may broadcast or whose output may be a
    reduction) those are its HBM traffic instead of the profile's multiples of the main
    input, and the profile gives only the instruction mix per element of ``spec.shapes[0]``.

    A profile with ``casts_to_fp32`` (a TBE kernel that casts bf16, or inputs of two dtypes, to
    fp32) computes in fp32 and adds one ``cast`` per element of each tensor not in fp32:
    attribute ``cast_elements`` (the elements of those inputs and outputs, per element of
    ``spec.shapes[0]``: 1 for fp32 + bf16 -> fp32) or, without it, every tensor when
    ``spec.dtype`` is bf16 and none otherwise.

    Raises:
        ValueError: ``read_bytes`` / ``write_bytes`` given without the other, or negative.
    """
    return _explicit_bytes_cost(VECTOR_PROFILES[spec.op_type], spec, hw)


def generic_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """A PyTorch operator no mapping knows (op type ``aten::<name>``): a Vector unit kernel over
    the elements of ``spec.shapes[0]`` (its largest tensor) that moves attributes
    ``read_bytes`` and ``write_bytes`` through HBM and runs :data:`GENERIC_OP_CLASSES` per
    element. A floor, not a model of the operator: the profile names every such op.

    Raises:
        ValueError: ``read_bytes`` or ``write_bytes`` missing or negative.
    """
    if spec.attr("read_bytes") is None:
        raise ValueError(f"{spec.op_type}: a generic op needs attributes read_bytes and write_bytes")
    return _explicit_bytes_cost(VectorProfile(1, 1, GENERIC_OP_CLASSES), spec, hw)


def _explicit_bytes_cost(prof: VectorProfile, spec: OpSpec, hw: HardwareSpec) -> OpCost:
    elements = numel(spec.shapes[0])
    read_bytes, write_bytes = spec.attr("read_bytes"), spec.attr("write_bytes")
    if read_bytes is None and write_bytes is None:
        return _vector_kernel_cost(_fp32_casts(prof, spec), elements, spec.dtype, hw)
    if (not isinstance(read_bytes, int) or not isinstance(write_bytes, int) or read_bytes < 0 or write_bytes < 0
            or read_bytes + write_bytes == 0):
        raise ValueError(f"{spec.op_type}: read_bytes and write_bytes must be integers >= 0, not both 0, "
                         f"got {read_bytes!r} and {write_bytes!r}")
    per_element = DTYPE_BYTES[spec.dtype] * max(1, elements)
    explicit = replace(prof, read_elements=read_bytes / per_element, write_elements=write_bytes / per_element)
    return _vector_kernel_cost(_fp32_casts(explicit, spec), max(1, elements), spec.dtype, hw)


def _fp32_casts(prof: VectorProfile, spec: OpSpec) -> VectorProfile:
    """``prof`` with the casts of a ``casts_to_fp32`` kernel (see :func:`vector_cost`)."""
    if not prof.casts_to_fp32:
        return prof
    casts = spec.attr("cast_elements")
    if casts is None:
        casts = prof.read_elements + prof.write_elements if spec.dtype == "bf16" else 0.0
    if isinstance(casts, bool) or not isinstance(casts, (int, float)) or not casts >= 0:
        raise ValueError(f"{spec.op_type}: cast_elements must be a number >= 0, got {casts!r}")
    if not casts:
        return prof
    classes = {**prof.op_classes, "cast": prof.op_classes.get("cast", 0.0) + casts}
    return replace(prof, op_classes=classes, compute_dtype="fp32", casts_to_fp32=False)


def _vector_kernel_cost(prof: VectorProfile, elements: int, dtype: str, hw: HardwareSpec) -> OpCost:
    """``elements`` elements of ``dtype`` streamed through the Unified Buffer by every Vector
    unit, double-buffered, as ``prof`` says (the kernel of :func:`vector_cost`)."""
    elt = DTYPE_BYTES[dtype]
    compute_dtype = prof.compute_dtype or dtype
    if compute_dtype == "fp32" and dtype not in ("fp16", "bf16", "fp32"):
        compute_dtype = dtype
    bytes_per_element = (prof.read_elements + prof.write_elements) * elt
    chunk_elements = max(1, int(hw.memory.unified_buffer_bytes_per_core // (bytes_per_element * DOUBLE_BUFFER_STAGES)))
    # Work is spread over every Vector unit in 32-byte DMA blocks; tiny tensors use fewer cores.
    align = max(1, hw.memory.unified_buffer_block_bytes // elt)
    cores = hw.ai_core.vector_core_count
    block_dim = min(cores, ceil_div(elements, align))
    # The Vector unit works on whole 32-byte blocks, so a core's share rounds up to one.
    elements_per_block = round_up(ceil_div(elements, block_dim), align)
    chunks_per_core = ceil_div(elements_per_block, chunk_elements)
    grains = max(1.0, elements_per_block / chunk_elements)
    total_bytes = elements * bytes_per_element
    transfers_per_chunk = math.ceil(prof.read_elements) + math.ceil(prof.write_elements)
    kernel = Kernel(
        block_dim=block_dim,
        cube_s_per_block=0.0,
        vector_s_per_block=vector_time_s(elements_per_block, prof.op_classes, compute_dtype, hw),
        hbm_bytes=total_bytes,
        l2_bytes=0.0,
        dma_per_block=chunks_per_core * transfers_per_chunk,
        stages=DOUBLE_BUFFER_STAGES,
        iterations=grains,
        flop=elements * sum(prof.op_classes.values()),
    )
    return run_kernel(kernel, hw, cores)


#: A device-to-device copy moves each element once in and once out and computes nothing.
MEMCPY_PROFILE = VectorProfile(1, 1, {})


def memcpy_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """A device-to-device copy (``Memcpy``: ``aclrtMemcpy`` / ``Tensor.copy_`` of a slice) of
    attribute ``nbytes`` bytes of ``spec.dtype``, as a pure data move through the AI Cores: each
    Vector core's MTE2 queue reads its share from HBM into the Unified Buffer and MTE3 writes it
    back (CANN's TensorMove), double-buffered, with the DMA start-up cost per transfer and the
    kernel launch floor of :func:`vector_cost`. HBM traffic is ``2 x nbytes``; no FLOP.
    ``spec.shapes`` (the destination's and the source's shapes) do not change the cost.

    Raises:
        ValueError: ``nbytes`` is missing, below one element, or not whole elements of ``spec.dtype``.
    """
    nbytes = spec.attr("nbytes")
    elt = DTYPE_BYTES[spec.dtype]
    if not isinstance(nbytes, int) or nbytes < elt or nbytes % elt:
        raise ValueError(f"Memcpy: nbytes must be a positive whole number of {spec.dtype} elements "
                         f"({elt} bytes), got {nbytes!r}")
    return _vector_kernel_cost(MEMCPY_PROFILE, nbytes // elt, spec.dtype, hw)


def embedding_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """Embedding lookup (Ascend GatherV2): one DMA per looked-up row.

    Shapes: ids (tokens,), table (vocab, hidden). ``EmbeddingDenseGrad`` scatters the rows
    back (read grad rows, read-modify-write table rows).
    """
    (tokens,), (_, hidden) = spec.shapes
    elt = DTYPE_BYTES[spec.dtype]
    grad = spec.op_type == "EmbeddingDenseGrad"
    row_bytes = hidden * elt
    cores = hw.ai_core.vector_core_count
    block_dim = min(cores, tokens)
    rows_per_core = ceil_div(tokens, block_dim)
    moves = 3 if grad else 2
    kernel = Kernel(
        block_dim=block_dim,
        cube_s_per_block=0.0,
        vector_s_per_block=vector_time_s(rows_per_core * hidden, {"add": 1 if grad else 0}, "fp32", hw),
        hbm_bytes=tokens * row_bytes * moves + tokens * DTYPE_BYTES["int32"],
        l2_bytes=0.0,
        dma_per_block=rows_per_core * moves,
        stages=DOUBLE_BUFFER_STAGES,
        iterations=float(rows_per_core),
        flop=float(tokens * hidden if grad else 0),
    )
    return run_kernel(kernel, hw, cores)


# --------------------------------------------------------------------------------------
# Collectives (HCCL)


def _ring_time_s(
    group_size: int, bytes_per_rank_step: float, steps_factor: int, bw: float, latency_s: float
) -> float:
    steps = steps_factor * (group_size - 1)
    return steps * (latency_s + bytes_per_rank_step / bw)


def collective_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """HCCL collectives in the latency / bandwidth / reduction (alpha-beta-gamma) form.

    ``spec.shapes[0]`` is the local tensor (the input for AllReduce and ReduceScatter, the
    output for AllGather); attribute ``ranks`` is the tuple of global ranks in the group.

    Algorithms: inside one full HCCS mesh, Mesh (every card talks to every other card at
    once); across the HCCS groups of one server, hierarchical (Mesh inside each group, Ring
    over PCIe between groups); across servers, recursive halving-doubling over RoCE when the
    server count is a power of two above 2 (log2(n) latency steps instead of the ring's n - 1,
    the same bandwidth term; AllToAll keeps the ring's pairwise steps), else Ring, with the
    Mesh step inside each server first ("hierarchical-") when a server holds several ranks.
    Bus bandwidth follows nccl-tests: algbw x 2(p-1)/p for AllReduce, x 1 for Broadcast,
    x (p-1)/p for the others.

    Attribute ``link_bandwidth_frac`` (0 < frac <= 1, default 1): a degraded link in the group;
    every algorithm here moves data over all its links in lockstep, so the slowest link sets the
    bandwidth of all.
    """
    ranks: tuple[int, ...] = spec.attr("ranks")
    p = len(ranks)
    elt = DTYPE_BYTES[spec.dtype]
    nbytes = numel(spec.shapes[0]) * elt
    ic = hw.interconnect
    # a degraded link in the group bounds the whole collective (attribute link_bandwidth_frac)
    eff = ic.link_efficiency_frac * spec.attr("link_bandwidth_frac", 1.0)
    kind = spec.op_type
    # Number of data passes: AllReduce = ReduceScatter + AllGather; Broadcast = Scatter +
    # AllGather (the large-message form HCCL uses); ReduceScatter, AllGather and AllToAll move
    # (p-1)/p of the data once.
    passes = 2 if kind in ("AllReduce", "Broadcast") else 1
    reduces = kind in ("AllReduce", "ReduceScatter")
    if p == 1:
        # A one-rank group moves nothing; the call still pays the launch floor.
        launch_s = hw.launch.kernel_launch_latency_s
        return OpCost(launch_s, 0.0, 0.0, 0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 1,
                      CommCost(int(nbytes), "none", 1, nbytes / launch_s, 0.0))
    groups = {r // ic.hccs_group_size for r in ranks}
    servers = {r // ic.cards_per_server for r in ranks}
    if len(servers) > 1:
        n = len(servers)
        roce_bw = ic.roce_bandwidth_bytes_per_s * eff
        if n > 2 and n & (n - 1) == 0 and kind != "AllToAll":
            # recursive halving-doubling: the ring's bandwidth term in log2(n) steps, not n-1
            algorithm = "halving-doubling-roce"
            comm_s = passes * (math.log2(n) * ic.roce_latency_s + (n - 1) / n * nbytes / roce_bw)
        else:
            algorithm = "ring-roce"
            comm_s = _ring_time_s(n, nbytes / n, passes, roce_bw, ic.roce_latency_s)
        per_server = p // n
        if per_server > 1:
            algorithm = "hierarchical-" + algorithm
            comm_s += passes * (ic.hccs_link_latency_s + (nbytes / per_server) / (ic.hccs_link_bandwidth_bytes_per_s * eff))
    elif len(groups) == 1:
        algorithm = "mesh"
        # Each card sends 1/p of the data to each of the p-1 others, all links at once.
        comm_s = passes * (ic.hccs_link_latency_s + (nbytes / p) / (ic.hccs_link_bandwidth_bytes_per_s * eff))
    else:
        per_group = p // len(groups)
        pcie_bw = ic.pcie_bandwidth_bytes_per_s * eff
        if per_group == 1:
            algorithm = "ring-pcie"
            comm_s = _ring_time_s(p, nbytes / p, passes, pcie_bw, ic.pcie_latency_s)
        else:
            algorithm = "hierarchical-mesh-ring"
            intra = passes * (ic.hccs_link_latency_s + (nbytes / per_group) / (ic.hccs_link_bandwidth_bytes_per_s * eff))
            shard = nbytes / per_group
            inter = _ring_time_s(len(groups), shard / len(groups), passes, pcie_bw, ic.pcie_latency_s)
            comm_s = intra + inter
    # Reduction (gamma term): the Vector units add (p-1)/p of the data.
    reduce_s = 0.0
    if reduces:
        reduce_s = vector_time_s((p - 1) / p * numel(spec.shapes[0]), {"add": 1}, spec.dtype if spec.dtype in hw.vector_unit.ops_per_cycle_per_core else "fp32", hw) / hw.ai_core.vector_core_count
    duration_s = hw.launch.kernel_launch_latency_s + comm_s + reduce_s
    algbw = nbytes / duration_s
    bus_factor = {"AllReduce": 2 * (p - 1) / p, "Broadcast": 1.0}.get(kind, (p - 1) / p)
    return OpCost(
        duration_s=duration_s,
        flop=float(numel(spec.shapes[0]) * (p - 1) / p) if reduces else 0.0,
        hbm_bytes=float(nbytes * passes * 2),
        l2_bytes=0.0,
        block_dim=0,
        dma_count=passes * (p - 1),
        ai_core_util_frac=0.0,
        mac_ratio=0.0,
        vec_ratio=0.0,
        mte2_ratio=0.0,
        comm=CommCost(int(nbytes), algorithm, p, algbw, algbw * bus_factor),
    )


def p2p_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """A point-to-point transfer (``Send`` / ``Receive``, HCCL's HcclSend / HcclRecv) of
    ``spec.shapes[0]`` between rank 0 and attribute ``peer``, over the link between them: HCCS
    inside one HCCS group, PCIe between the groups of a server, RoCE between servers (alpha-beta
    form, the link's efficiency applied, ``link_bandwidth_frac`` as in :func:`collective_cost`).
    """
    peer: int = spec.attr("peer")
    rank: int = spec.attr("rank", 0)
    ic = hw.interconnect
    eff = ic.link_efficiency_frac * spec.attr("link_bandwidth_frac", 1.0)
    nbytes = numel(spec.shapes[0]) * DTYPE_BYTES[spec.dtype]
    if rank // ic.cards_per_server != peer // ic.cards_per_server:
        algorithm, bw, latency_s = "p2p-roce", ic.roce_bandwidth_bytes_per_s, ic.roce_latency_s
    elif rank // ic.hccs_group_size != peer // ic.hccs_group_size:
        algorithm, bw, latency_s = "p2p-pcie", ic.pcie_bandwidth_bytes_per_s, ic.pcie_latency_s
    else:
        algorithm, bw, latency_s = "p2p-hccs", ic.hccs_link_bandwidth_bytes_per_s, ic.hccs_link_latency_s
    duration_s = hw.launch.kernel_launch_latency_s + latency_s + nbytes / (bw * eff)
    rate = nbytes / duration_s
    return OpCost(
        duration_s=duration_s, flop=0.0, hbm_bytes=float(nbytes), l2_bytes=0.0, block_dim=0, dma_count=1,
        ai_core_util_frac=0.0, mac_ratio=0.0, vec_ratio=0.0, mte2_ratio=0.0,
        comm=CommCost(int(nbytes), algorithm, 2, rate, rate),
    )


def view_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """A view (``View``): new shape and offset over an existing allocation, host metadata only;
    no kernel runs, nothing moves, so it takes no device time."""
    return OpCost(duration_s=0.0, flop=0.0, hbm_bytes=0.0, l2_bytes=0.0, block_dim=0, dma_count=0,
                  ai_core_util_frac=0.0, mac_ratio=0.0, vec_ratio=0.0, mte2_ratio=0.0, kernel_count=0)


CostModel = Callable[[OpSpec, HardwareSpec], OpCost]

#: One registry keyed by op type.
COST_MODELS: dict[str, CostModel] = {
    "MatMul": matmul_cost,
    "BatchMatMul": matmul_cost,
    "Conv2D": conv2d_cost,
    "Conv2DBackpropInput": conv2d_cost,
    "Conv2DBackpropFilter": conv2d_cost,
    "FlashAttention": flash_attention_cost,
    "FlashAttentionGrad": flash_attention_grad_cost,
    "Embedding": embedding_cost,
    "EmbeddingDenseGrad": embedding_cost,
    "AllReduce": collective_cost,
    "AllGather": collective_cost,
    "ReduceScatter": collective_cost,
    "Broadcast": collective_cost,
    "AllToAll": collective_cost,
    "Send": p2p_cost,
    "Receive": p2p_cost,
    "View": view_cost,
    "Memcpy": memcpy_cost,
    **{op_type: vector_cost for op_type in VECTOR_PROFILES},
}
#: The cost models of kernels that run on the Cube unit (their blocks spread over the AI Cores).
CUBE_COST_MODELS = frozenset({matmul_cost, conv2d_cost, flash_attention_cost, flash_attention_grad_cost})
#: Op types that run on the Cube unit, derived from the registry (the diagnosis reads this).
CUBE_OP_TYPES = frozenset(op_type for op_type, model in COST_MODELS.items() if model in CUBE_COST_MODELS)


def _place(offset: int, size: int, alignment: int) -> int:
    # CANN's tiling places each workspace part at (offset + size + GM_ALIGN) / GM_ALIGN * GM_ALIGN
    return (offset + size + alignment) // alignment * alignment


def op_workspace_bytes(spec: OpSpec, hw: HardwareSpec) -> int:
    """Device workspace the op's kernel asks for (``aclnn*GetWorkspaceSize``), in bytes.

    Modelled for the fused attention kernels (``attrs`` ``fusion`` true, the default) with 16-bit
    inputs, q (B, N, S_q, D) and k, v (B, N_kv, S_kv, D), each inside the CANN tiling template
    its formula comes from (constants and sources in the hardware file's ``workspace`` group):

    - FlashAttention, template S1s2Bn2gs1 (D above 64, S_kv above 1,024): per vector core the
      fp32 score blocks (two copies, three when S_kv is not a multiple of 64) and output
      buffers, plus a 16 MiB reserve; it does not grow with the sequence.
    - FlashAttentionGrad, template SameAb with 512 x 512 blocks (S_q and S_kv from 2,048): the
      fp32 dq, dk and dv accumulators (full tensors), the softmax gradient, per-core matmul
      blocks, an attention-sink term and three 20 MiB buffers; it grows linearly with S.

    Returns 0 for every other op, shape or dtype, for the unfused path (separate kernels), and
    when ``hw.workspace`` is None: not modelled, not known to be zero.
    """
    ws = hw.workspace
    if (ws is None or spec.op_type not in ("FlashAttention", "FlashAttentionGrad")
            or spec.dtype not in ("fp16", "bf16") or not spec.attr("fusion", True)):
        return 0
    (b, n, s_q, d), (_, n_kv, s_kv, _) = spec.shapes[0], spec.shapes[1]
    cores = hw.ai_core.vector_core_count
    fp32 = DTYPE_BYTES["fp32"]
    d_align = round_up(d, ws.flash_attention_head_dim_alignment)
    if spec.op_type == "FlashAttention":
        if s_kv <= ws.flash_attention_min_kv_len or d <= ws.flash_attention_min_head_dim:
            return 0
        copies = (ws.flash_attention_score_copies if s_kv % ws.flash_attention_kv_alignment == 0
                  else ws.flash_attention_score_copies_unaligned)
        score = ws.flash_attention_score_blocks * ws.flash_attention_block_rows * ws.flash_attention_block_cols * fp32
        out = ws.flash_attention_output_buffers * ws.flash_attention_block_rows * d_align * fp32
        return (score * copies + out) * cores + ws.flash_attention_reserve_bytes
    if min(s_q, s_kv) < ws.flash_attention_grad_min_seq_len:
        return 0
    align, buffer = ws.gm_alignment_bytes, ws.flash_attention_grad_buffer_bytes
    total = ws.flash_attention_grad_sync_bytes
    for elements in (b * n * s_q * d_align, b * n_kv * s_kv * d_align, b * n_kv * s_kv * d_align):  # dq, dk, dv
        total = _place(total, elements * fp32, align)
    total += round_up(ws.flash_attention_grad_softmax_bytes_per_row * b * n * s_q, align)
    blocks = cores * ws.flash_attention_grad_block_rows * ws.flash_attention_grad_block_cols * fp32
    total = _place(total, blocks * ws.flash_attention_grad_block_copies, align) + buffer
    pad = ws.flash_attention_grad_sink_pad
    sink = b * n * round_up(s_q, pad) * round_up(s_kv, pad) // ws.flash_attention_grad_sink_block_elements * fp32
    total = _place(total, sink, align) + buffer
    return _place(total, DTYPE_BYTES["int32"], align) + buffer  # the sink sum's int32


def check_calibration(hw: HardwareSpec) -> None:
    """Refuse a calibrated spec whose ``calibration.op_time_scale`` names an op type with no cost
    model (:data:`COST_MODELS`; ``aten::`` op types go through :func:`generic_cost` and are
    accepted): :func:`op_cost` looks the scale up by the op's type, so such a key (a typo,
    ``Matmul``) would silently scale nothing.

    Called where a spec is put to use for a run (:class:`simulator.runtime.NPU`,
    :func:`simulator.runtime.recost`, the kernel replay of ``oam validate --profile`` and the
    plugin's ``--oam-hardware``), not in :func:`op_cost`, whose errors the replay and the recost
    turn into per-op skip reasons, and not when the file is read: :mod:`simulator.hardware` may
    not import this module (the import-cycle rule of tests/test_layout.py).

    Raises:
        HardwareFileError: an unknown op type; the message names the file (or the spec when it
            was built in memory), the op type and the closest known one, or else every known one.
    """
    if hw.calibration is None:
        return
    unknown = sorted(t for t in hw.calibration.op_time_scale if t not in COST_MODELS and not t.startswith(GENERIC_OP_PREFIX))
    if not unknown:
        return
    where = hardware_file_path(hw) or f"hardware {hw.name!r}"
    near = difflib.get_close_matches(unknown[0], sorted(COST_MODELS), n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]!r}? op types are case-sensitive)" if near else ""
    more = f" (and {', '.join(map(repr, unknown[1:]))})" if len(unknown) > 1 else ""
    known = "" if near else f"; known op types: {', '.join(sorted(COST_MODELS))}"
    raise HardwareFileError(f"{where}: field calibration.op_time_scale: {unknown[0]!r}{more} is not a simulator op "
                            f"type{hint}, so its scale would change nothing{known}")


def op_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """Cost of ``spec`` on ``hw`` through :data:`COST_MODELS` (an ``aten::<name>`` op type
    through :func:`generic_cost`). On a calibrated spec (``hw.calibration``, written by
    ``oam calibrate``) the duration is multiplied by the op type's fitted time scale; the pipe
    ratios and utilisation are shares of that time and stay as the model gives them.

    Raises:
        KeyError: no cost model for ``spec.op_type``.
    """
    try:
        model = COST_MODELS[spec.op_type]
    except KeyError:
        if not spec.op_type.startswith(GENERIC_OP_PREFIX):
            raise KeyError(f"no cost model for op type {spec.op_type!r}") from None
        model = generic_cost
    cost = model(spec, hw)
    scale = 1.0 if hw.calibration is None else hw.calibration.time_scale(spec.op_type)
    if scale == 1.0:
        return cost
    return replace(cost, duration_s=cost.duration_s * scale, overlapped_s=cost.overlapped_s * scale,
                   overlappable_s=cost.overlappable_s * scale)

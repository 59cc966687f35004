"""Allocation traces of a Llama-style training loop against the caching allocator model alone.

    python benchmarks/fragmentation_trace.py --layers 8 --capacity-gib 6 --warmup-steps 2000 --steps 2000
    python benchmarks/fragmentation_trace.py --layers 8 --capacity-gib 6 --steps 2000            # wikitext lengths
    python benchmarks/fragmentation_trace.py --layers 8 --capacity-gib 6 --warmup-steps 2000 --steps 2000 \\
        --allocator expandable_segments:True

A few seconds per thousand steps at 8 layers. Each step allocates and frees, in a training
loop's order, the tensors of a Llama-2-7B-shaped model with tensor parallelism 4 (hidden 4,096,
FFN 11,008, 32 heads, vocabulary 32,000, bf16 activations, fp32 logits), after persistent
weights, a gradient buffer and ZeRO-1 optimizer state per layer; nothing but the allocator runs
(no simulated time). Sequence lengths come either from wikitext-103 (``simulator.datasets``, a
new length each step) or from sequence-length warmup (``--warmup-steps``: DeepSpeed's
fixed_linear schedule, 64 tokens growing to ``--max-tokens``). It prints the steps whose
allocation flushed the cache and retried, and reserved against allocated memory.

What it shows is in docs/memory-fragmentation.md. This is a study of the allocator's rules,
faster than the full simulator (benchmarks/fragmentation_study.py) and cruder: it is not the
builder's tensor list.
"""

from __future__ import annotations

import argparse
import itertools

from simulator.allocator import AllocatorConfig, NpuCachingAllocator
from simulator.datasets import load_dataset, sequence_length_warmup
from simulator.hardware import load_hardware
from simulator.units import GiB

HIDDEN, FFN, HEADS, VOCAB, TP = 4096, 11008, 32, 32000, 4
BF16, FP32 = 2, 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--capacity-gib", type=float, default=6.0, help="device memory the allocator may use")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--warmup-steps", type=int, default=0, help="sequence-length warmup over this many steps "
                        "(0: wikitext-103 lengths, padded to 128)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prealloc-gib", type=float, default=0.0, help="pre-allocate a pool after the persistent "
                        "tensors: allocate one block of this size and free it (the torch.empty(n); del idiom)")
    parser.add_argument("--allocator", default="", help="PYTORCH_NPU_ALLOC_CONF string (default: torch_npu's)")
    args = parser.parse_args()
    if args.warmup_steps:
        lengths = sequence_length_warmup(args.steps, args.max_tokens, args.warmup_steps)
    else:
        lengths = load_dataset("wikitext-103").sample(args.steps, args.max_tokens, seed=args.seed)
    config = AllocatorConfig.from_conf_string(args.allocator) if args.allocator else None
    allocator = NpuCachingAllocator(load_hardware("ascend910"), config, capacity_bytes=int(args.capacity_gib * GiB))

    def alloc(size_bytes: int):
        return allocator.alloc(int(size_bytes))[0]

    layer_params = (4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN) // TP
    persistent = []
    for _ in range(args.layers):
        persistent += [alloc(layer_params * BF16 // 3) for _ in range(3)]  # weights, three tensors
        persistent.append(alloc(layer_params * BF16))  # gradient buffer
        persistent.append(alloc(layer_params * 3 * FP32 // 2))  # master weight, m, v over dp 2
    if args.prealloc_gib:
        allocator.free(alloc(args.prealloc_gib * GiB))
    flushes, retries = [], 0
    for step, s in enumerate(lengths):
        x = alloc(s * HIDDEN * BF16)
        saved = []
        for _ in range(args.layers):
            norm, qkv = alloc(s * HIDDEN * BF16), alloc(s * 3 * HIDDEN // TP * BF16)
            attn, softmax_stats = alloc(s * HIDDEN // TP * BF16), alloc(HEADS // TP * s * 8 * FP32)
            proj = alloc(s * HIDDEN * BF16)
            allocator.free(x)
            residual = alloc(s * HIDDEN * BF16)
            norm2 = alloc(s * HIDDEN * BF16)
            gate, up, act = (alloc(s * FFN // TP * BF16) for _ in range(3))
            down = alloc(s * HIDDEN * BF16)
            x = alloc(s * HIDDEN * BF16)
            for t in (residual, proj, down):
                allocator.free(t)
            saved.append((norm, qkv, attn, softmax_stats, norm2, gate, up, act))
        logits = alloc(s * VOCAB // TP * FP32)
        allocator.free(x)
        grad_logits = alloc(s * VOCAB // TP * FP32)
        allocator.free(logits)
        grad_x = alloc(s * HIDDEN * BF16)
        allocator.free(grad_logits)
        for tensors in reversed(saved):
            grad_gate, grad_up = alloc(s * FFN // TP * BF16), alloc(s * FFN // TP * BF16)
            for t in tensors[5:]:
                allocator.free(t)
            allocator.free(grad_gate)
            allocator.free(grad_up)
            grad_qkv = alloc(s * 3 * HIDDEN // TP * BF16)
            for t in tensors[:5]:
                allocator.free(t)
            new_grad_x = alloc(s * HIDDEN * BF16)
            allocator.free(grad_x)
            allocator.free(grad_qkv)
            grad_x = new_grad_x
        allocator.free(grad_x)
        stats = allocator.stats()
        if stats.num_alloc_retries > retries:
            flushes.append((step, s))
            retries = stats.num_alloc_retries
        if step % max(1, args.steps // 10) == 0:
            print(f"step {step:5d}  {s:5d} tokens  reserved {stats.reserved_bytes / GiB:6.2f} GiB  "
                  f"allocated peak {stats.allocated_bytes_peak / GiB:6.2f} GiB")
    stats = allocator.stats()
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(flushes)]
    print(f"steps that flushed the cache and retried (step, tokens): {flushes or 'none'}")
    print(f"steps between flushes: {gaps or '-'}")
    print(f"end: reserved {stats.reserved_bytes / GiB:.2f} GiB, allocated peak {stats.allocated_bytes_peak / GiB:.2f} "
          f"GiB, {stats.num_alloc_retries} retries, {stats.num_device_alloc} aclrtMalloc, "
          f"{stats.num_device_free} aclrtFree")


if __name__ == "__main__":
    main()

"""Does the caching allocator model flush again and again in a variable-length training run?

    python benchmarks/fragmentation_study.py                 # 150 steps, about a minute
    python benchmarks/fragmentation_study.py --steps 40 --allocator max_split_size_mb:64
    python benchmarks/fragmentation_study.py --steps 2000 --warmup-steps 2000   # about 7 minutes

Runs the Llama-2-7B training step of ``simulator.models`` on 8 x 910A (tp 4 x dp 2, ZeRO-1)
with device memory modelled, one sequence length per step drawn from wikitext-103
(``simulator.datasets``, cut to ``--max-tokens``, padded to 128) or growing under
sequence-length warmup (``--warmup-steps``), and prints the steps whose
allocations flushed the cache and retried, the reserved memory every 10 steps, and the step and
FlashAttention times. See docs/memory-fragmentation.md for what it shows (simulator 0.6.0: no
flush in 150 steps; 0.5.0, before attention workspaces: one, at the first longest-sequence step).
"""

from __future__ import annotations

import argparse
import statistics
import time

import simulator
from simulator.datasets import load_dataset, sequence_length_warmup
from simulator.models import LLAMA2_7B, training_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup-steps", type=int, default=0, help="sequence-length warmup (DeepSpeed's "
                        "fixed_linear, 64 tokens up to --max-tokens) over this many steps; 0: wikitext-103 lengths")
    parser.add_argument("--allocator", default="", help="PYTORCH_NPU_ALLOC_CONF string (default: torch_npu's defaults)")
    args = parser.parse_args()
    if args.warmup_steps:
        lengths = sequence_length_warmup(args.steps, args.max_tokens, args.warmup_steps)
    else:
        lengths = load_dataset("wikitext-103").sample(args.steps, args.max_tokens, seed=args.seed)
    steps = iter(lengths)

    def job(npu):
        training_step(npu, LLAMA2_7B, seq_len=next(steps))

    started = time.perf_counter()
    profile = simulator.run(job, devices=8, steps=args.steps, memory=True, allocator=args.allocator or None)
    elapsed_s = time.perf_counter() - started
    retries = [(m.step, lengths[m.step]) for m in profile.memory if m.alloc_retries]
    print(f"{args.steps} steps simulated in {elapsed_s:.1f} s")
    print(f"steps that flushed the cache and retried (step, tokens): {retries or 'none'}")
    every = max(10, args.steps // 20)
    print(f"reserved peak GiB every {every} steps: "
          + " ".join(f"{m.step}:{m.reserved_peak_bytes / 2**30:.2f}" for m in profile.memory[::every]))
    fa = [op.duration_s for op in profile.ops if op.op_type == "FlashAttention"]
    print(f"step time median {statistics.median(profile.step_times_s) * 1e3:.1f} ms, "
          f"max {max(profile.step_times_s) * 1e3:.1f} ms; FlashAttention median {statistics.median(fa) * 1e3:.2f} ms, "
          f"max {max(fa) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

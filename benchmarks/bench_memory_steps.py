"""What modelling device memory costs: Llama-2-7B steps with and without ``memory=True``.

    python benchmarks/bench_memory_steps.py                  # 20 steps x 3 repeats, about a minute
    python benchmarks/bench_memory_steps.py --steps 300 --repeats 1   # measure 300 steps outright
    python benchmarks/bench_memory_steps.py --workload fragmentation --steps 400 --repeats 1

Runs the Llama-2-7B training step of ``simulator.models`` on 8 x 910A (``ascend910``; the
builder's default layout, tp 4 x dp 2 with ZeRO-1, as ``fragmentation_study.py`` uses) at
``--seq-len`` tokens, or with ``--workload fragmentation`` the case of
``examples/test_fragmentation.py`` (a 7-layer Llama-style model on one 910A, sequences growing
step by step, no pool; at most its 400 steps), ``--steps`` steps per run, once with
``memory=False`` and once with ``memory=True`` in each of ``--repeats`` rounds, alternating in
this one process (pinned to one core where the OS allows). Prints the wall time per step of each mode (median and best of the
rounds), their ratio, and the wall time of 300 memory-modelled steps: measured when
``--steps`` is at least 300, else the per-step median times 300 (issue 5 asks for several
hundred steps in a few seconds). Not a test: the machines are shared and noisy, so read the
ratio rather than the absolute times, and compare runs on the same machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable

import simulator
from simulator.models import LLAMA2_7B, training_step

LONG_RUN_STEPS = 300


FRAGMENTATION_STEPS = 400  # the sequence lengths examples/test_fragmentation.py schedules


def llama_run(steps: int, seq_len: int, memory: bool) -> None:
    simulator.run(training_step, LLAMA2_7B, devices=8, steps=steps, memory=memory, seq_len=seq_len,
                  hardware="ascend910")


def fragmentation_run(steps: int, seq_len: int, memory: bool) -> None:
    """The case of ``examples/test_fragmentation.py`` without its pool (``seq_len`` unused)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from test_fragmentation import warmup_training

    simulator.run(warmup_training(False), steps=steps, memory=memory, hardware="ascend910")


WORKLOADS: dict[str, Callable[[int, int, bool], None]] = {"llama": llama_run, "fragmentation": fragmentation_run}


def run_s(workload: str, steps: int, seq_len: int, memory: bool) -> float:
    """Wall time of one ``steps``-step run, in seconds. The previous run's garbage (its NPU is
    part of a reference cycle) is collected first, not charged to this run."""
    gc.collect()
    start = time.perf_counter()
    WORKLOADS[workload](steps, seq_len, memory)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="Steps per run (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="Rounds of one plain and one memory run (default 3)")
    parser.add_argument("--seq-len", type=int, default=4096, help="Tokens per sequence (default 4096; llama only)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="llama",
                        help="llama (default): Llama-2-7B on 8 cards; fragmentation: examples/test_fragmentation.py's case")
    args = parser.parse_args()
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be positive")
    if args.workload == "fragmentation" and args.steps > FRAGMENTATION_STEPS:
        parser.error(f"the fragmentation case has {FRAGMENTATION_STEPS} steps")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    run_s(args.workload, 1, args.seq_len, True)  # warm-up: imports, hardware data, cost caches
    per_step_s: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for memory in (False, True):
            per_step_s[memory].append(run_s(args.workload, args.steps, args.seq_len, memory) / args.steps)

    plain, tracked = (statistics.median(per_step_s[m]) for m in (False, True))
    if args.workload == "llama":
        print(f"Llama-2-7B training step, seq {args.seq_len}, 8 x ascend910 (tp 4 x dp 2): "
              f"{args.steps} steps x {args.repeats} rounds per mode")
    else:
        print(f"examples/test_fragmentation.py's case (no pool), 1 x ascend910: "
              f"{args.steps} steps x {args.repeats} rounds per mode")
    print(f"  memory=False  {plain * 1e3:8.1f} ms per step   (best {min(per_step_s[False]) * 1e3:.1f} ms)")
    print(f"  memory=True   {tracked * 1e3:8.1f} ms per step   (best {min(per_step_s[True]) * 1e3:.1f} ms)")
    print(f"  memory / plain {tracked / plain:7.2f}")
    if args.steps >= LONG_RUN_STEPS:
        print(f"  {LONG_RUN_STEPS} memory-modelled steps: {tracked * LONG_RUN_STEPS:.1f} s "
              f"(measured over {args.steps} steps)")
    else:
        print(f"  {LONG_RUN_STEPS} memory-modelled steps: {tracked * LONG_RUN_STEPS:.1f} s "
              f"(extrapolated from {args.steps} steps; --steps {LONG_RUN_STEPS} measures it)")


if __name__ == "__main__":
    main()

"""What ``Profile.comm_time_s`` costs on a big pipeline profile: before and after issue 20.

    python benchmarks/bench_profile.py                       # 128 micro-batches: about 43,000 ops
    python benchmarks/bench_profile.py --micro-batches 32 --repeats 3

Simulates one Llama-2-70B training step on 1024 x 910B (``ascend910b``, bf16, seq 4096; tp 8 x
pp 8 x dp 16 in the 1F1B schedule, as ``bench_scale.py``'s largest job) with ``--micro-batches``
micro-batches, then times ``comm_time_s(0)`` (what the ``comm-share`` rule asks for) with the
implementation before issue 20 (copied below: for each step a scan of every op, and for each
collective a scan of every merged compute interval) and with the profile's own (ops grouped by
step once, intervals merged once per step, two bisections per collective), side by side in this
one process (pinned to one core where the OS allows). The profile's own is timed cold (a new
profile object, so the grouping is built) and warm (asked again). Prints the times, their ratio
and whether the results agree. Not a test: the machines are shared and noisy, read the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import simulator
from simulator import Profile
from simulator.models import LLAMA2_70B, ParallelLayout, training_step


def comm_time_s_before(profile: Profile, step: int) -> tuple[float, float]:
    """``Profile.comm_time_s`` before issue 20, verbatim."""
    compute = sorted((op.start_s, op.start_s + op.duration_s) for op in profile.ops
                     if op.step == step and op.stream == "compute")
    merged: list[list[float]] = []
    for start, end in compute:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    total = exposed = 0.0
    for op in profile.ops:
        if op.step != step or op.stream != "hccl":
            continue
        start, end = op.start_s, op.start_s + op.duration_s
        hidden = sum(max(0.0, min(end, b) - max(start, a)) for a, b in merged)
        total += op.duration_s
        exposed += max(0.0, op.duration_s - hidden)
    return total, exposed


def fresh(profile: Profile) -> Profile:
    """The same profile as a new object, without the derived views the original cached."""
    return Profile.model_construct(**{name: getattr(profile, name) for name in Profile.model_fields})


def timed(function, *args) -> tuple[float, object]:
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batches", type=int, default=128, help="Micro-batches per step (default 128)")
    parser.add_argument("--repeats", type=int, default=1, help="Timings of each implementation (default 1)")
    args = parser.parse_args()
    if args.micro_batches < 1 or args.repeats < 1:
        parser.error("--micro-batches and --repeats must be positive")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    layout = ParallelLayout(8, 16, 1, 8, args.micro_batches)
    simulate_s, profile = timed(lambda: simulator.run(training_step, LLAMA2_70B, devices=layout.devices,
                                                      hardware="ascend910b", dtype="bf16", seq_len=4096, layout=layout))
    collectives = sum(op.stream == "hccl" for op in profile.ops)
    print(f"Llama-2-70B step, seq 4096, bf16, 1024 x ascend910b (tp 8 x pp 8 x dp 16, {args.micro_batches} "
          f"micro-batches): {len(profile.ops):,} op records, {collectives:,} on the HCCL stream; simulated in "
          f"{simulate_s:.2f} s")
    before, cold, warm = [], [], []
    results = set()
    for _ in range(args.repeats):
        elapsed_s, result = timed(comm_time_s_before, profile, 0)
        before.append(elapsed_s)
        results.add(result)
        copy = fresh(profile)
        elapsed_s, result = timed(copy.comm_time_s, 0)
        cold.append(elapsed_s)
        results.add(result)
        warm.append(timed(copy.comm_time_s, 0)[0])
    old_s, new_s, again_s = (statistics.median(t) for t in (before, cold, warm))
    print(f"  comm_time_s(0) before issue 20   {old_s * 1e3:10.1f} ms")
    print(f"  comm_time_s(0) now, cold         {new_s * 1e3:10.1f} ms   (before / now: {old_s / new_s:,.0f}x)")
    print(f"  comm_time_s(0) now, asked again  {again_s * 1e3:10.3f} ms")
    (total_s, exposed_s), *others = sorted(results)
    same = all(abs(t - total_s) <= 1e-9 * total_s and abs(e - exposed_s) <= 1e-9 * max(exposed_s, 1e-30)
               for t, e in others)
    print(f"  communication {total_s:.6f} s, exposed {exposed_s:.6f} s: "
          f"{'the same' if same else 'DIFFERENT: ' + repr(sorted(results))}")


if __name__ == "__main__":
    main()

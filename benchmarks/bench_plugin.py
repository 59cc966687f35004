"""Overheads of the pytest-oam plugin itself, measured side by side in one run.

Run: ``python benchmarks/bench_plugin.py [--repeats N]``. Each comparison runs both sides
alternately ``N`` times (default 11) as fresh pytest processes and prints the medians and their
ratio. Overheads are measured in CPU seconds of the pytest process (steadier than wall time
on a shared machine); the xdist comparison in wall seconds, since parallelism is its point.
Not a test: read the ratios, not the seconds.

1. A plain suite of 500 tests with the plugin installed but unused, against ``-p no:oam``
   (target: at most 2% overhead; issue 20). Unused, the plugin registers a watcher of
   collection only; the simulator, numpy and pydantic never load.
2. 200 tiny profiled tests gated against their baselines, against the same workloads run
   without the plugin's fixture.
3. A suite of 48 profiled Llama-2-7B training steps under ``-n 2`` against ``-n 0``.
4. What modelling memory costs: the bundled Llama-2-7B training step (8 x 910A, tp 4 x dp 2,
   seq 4096) simulated with ``memory=True`` against ``memory=False``, in this process, alternately.

``--only 1,4`` runs some of them.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = "\n".join(f"def test_plain_{i}():\n    assert {i} + 1 == {i + 1}\n" for i in range(500))

TINY_PROFILED = """
import pytest

def gemm(npu, n):
    npu.matmul(npu.tensor((n, n)), npu.tensor((n, n)))

@pytest.mark.parametrize("n", range(64, 64 + 200))
def test_tiny(oam_profile, n):
    oam_profile.run(gemm, n)
"""
TINY_UNPROFILED = """
import pytest
import simulator

def gemm(npu, n):
    npu.matmul(npu.tensor((n, n)), npu.tensor((n, n)))

@pytest.mark.parametrize("n", range(64, 64 + 200))
def test_tiny(n):
    simulator.run(gemm, n)
"""
LLAMA = """
import pytest
from simulator.models import LLAMA2_7B, training_step

@pytest.mark.oam(devices=8)
@pytest.mark.parametrize("seq_len", range(512, 4097, 512))
@pytest.mark.parametrize("hardware", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("block_size", [64, 128, 256])
def test_llama(oam_profile, seq_len, hardware, block_size):
    oam_profile.run(training_step, LLAMA2_7B, seq_len=seq_len, hardware=hardware, block_size=block_size)
"""


def pytest_seconds(folder: Path, *args: str, wall: bool = False) -> float:
    """Seconds of one pytest process: CPU time (user + system, children included) by default,
    which a busy shared machine disturbs far less than wall time; wall time with ``wall``."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, check=False, cwd=folder, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {folder}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed if wall else cpu


def side_by_side(label: str, repeats: int, a: tuple[Path, tuple[str, ...]], b: tuple[Path, tuple[str, ...]],
                 a_name: str, b_name: str, target: float | None = None, wall: bool = False) -> None:
    times_a, times_b = [], []
    for i in range(repeats):
        pairs = ((times_a, a), (times_b, b)) if i % 2 == 0 else ((times_b, b), (times_a, a))  # ABBA
        for times, (folder, extra) in pairs:
            times.append(pytest_seconds(folder, *extra, wall=wall))
    med_a, med_b = statistics.median(times_a), statistics.median(times_b)
    ratio = med_a / med_b
    kind = "wall" if wall else "CPU"
    verdict = "" if target is None else f"  target at most {target:.2f}: {'met' if ratio <= target else 'NOT met'}"
    print(f"{label} ({kind} seconds, median of {repeats})\n"
          f"  {a_name:36s} {med_a:7.2f} s   (min {min(times_a):.2f})\n"
          f"  {b_name:36s} {med_b:7.2f} s   (min {min(times_b):.2f})\n"
          f"  ratio {ratio:.3f} (of minima {min(times_a) / min(times_b):.3f}){verdict}\n")


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder


def memory_cost(repeats: int) -> None:
    """Section 4: the bundled Llama-2-7B step with and without the memory model, alternately."""
    import simulator
    from simulator.models import LLAMA2_7B, training_step

    def seconds(memory: bool) -> float:
        start = time.process_time()
        simulator.run(training_step, LLAMA2_7B, devices=8, seq_len=4096, memory=memory)
        return time.process_time() - start

    seconds(False), seconds(True)  # warm-up: imports, hardware files, caches
    off, on = [], []
    for i in range(repeats):
        for memory in ((False, True) if i % 2 == 0 else (True, False)):  # ABBA: no order bias
            (on if memory else off).append(seconds(memory))
    med_on, med_off = statistics.median(on), statistics.median(off)
    print(f"4. Llama-2-7B training step (8 x ascend910, seq 4096): memory model on vs off "
          f"(CPU seconds in this process, median of {repeats})\n"
          f"  {'memory=True':36s} {med_on:7.3f} s   (min {min(on):.3f})\n"
          f"  {'memory=False':36s} {med_off:7.3f} s   (min {min(off):.3f})\n"
          f"  ratio {med_on / med_off:.3f} (of minima {min(on) / min(off):.3f})\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11, help="Runs of each side (default 11)")
    parser.add_argument("--only", default="1,2,3,4", help="Comma-separated sections to run (default: all)")
    args = parser.parse_args()
    only = {int(x) for x in args.only.split(",") if x.strip()}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if 1 in only:
            plain = write(root / "plain", "test_plain.py", PLAIN)
            side_by_side("1. 500 plain tests: plugin installed but unused vs disabled", args.repeats,
                         (plain, ()), (plain, ("-p", "no:oam")), "with pytest-oam", "-p no:oam", target=1.02)
        if 2 in only:
            profiled = write(root / "profiled", "test_tiny.py", TINY_PROFILED)
            pytest_seconds(profiled, "--oam-save-baseline")
            unprofiled = write(root / "unprofiled", "test_tiny.py", TINY_UNPROFILED)
            side_by_side("2. 200 tiny simulated tests: gated by the plugin vs plain simulator calls", args.repeats,
                         (profiled, ("--oam-baseline",)), (unprofiled, ("-p", "no:oam")),
                         "oam_profile + --oam-baseline", "simulator.run, -p no:oam")
        if 3 in only:
            llama = write(root / "llama", "test_llama.py", LLAMA)
            pytest_seconds(llama, "--oam-save-baseline")
            side_by_side("3. 48 profiled Llama-2-7B steps: -n 2 vs -n 0", args.repeats,
                         (llama, ("-n", "2", "--oam-baseline")), (llama, ("-n", "0", "--oam-baseline")),
                         "-n 2", "-n 0", wall=True)
        if 4 in only:
            memory_cost(args.repeats)


if __name__ == "__main__":
    main()

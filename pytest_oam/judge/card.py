"""Figures of the card a run ran on that the diagnosis quotes, read from its hardware spec
(``simulator/hardware/*.json``, each group with its ``source``), never written in the judge.

An imported real profile (``real:*`` hardware) has no spec: it gets the value every bundled
spec holds, or ``None`` (the figure is not used) when the bundled specs differ.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from simulator.hardware import HardwareSpec, list_hardware, load_hardware


@functools.cache
def bundled_specs() -> tuple[HardwareSpec, ...]:
    """The bundled hardware specs (read once)."""
    return tuple(load_hardware(name) for name in list_hardware())


def card_figure(hardware: HardwareSpec | None, read: Callable[[HardwareSpec], int]) -> int | None:
    """``read(hardware)``; without a spec, the value all bundled specs share, else ``None``."""
    if hardware is not None:
        return read(hardware)
    values = {read(spec) for spec in bundled_specs()}
    return values.pop() if len(values) == 1 else None


def dma_alignment_bytes(hardware: HardwareSpec | None) -> int | None:
    """The size DMA transfers should be a multiple of, in bytes (``dma.min_efficient_transfer_bytes``:
    the alignment msprof-analyze's advisor checks)."""
    return card_figure(hardware, lambda spec: spec.dma.min_efficient_transfer_bytes)


def allocator_block_bytes(hardware: HardwareSpec | None) -> int | None:
    """The caching allocator's block granularity, in bytes (``allocator.min_block_bytes``,
    torch_npu's ``kMinBlockSize``): every allocation is rounded up to a multiple of it."""
    return card_figure(hardware, lambda spec: spec.allocator.min_block_bytes)

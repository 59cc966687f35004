"""Collection: op records as the run makes them, delivered to the registered op callbacks
(:mod:`simulator.callbacks`) and gathered into the run's :class:`~simulator.profile.Profile`."""

from __future__ import annotations

import hashlib

from .. import callbacks
from ..profile import MemoryPeak, MemoryRecord, OpRecord, Profile, StepMemory
from ..version import SIMULATOR_VERSION


class Collector:
    """The op records of one card's run and its per-step memory statistics.

    Args:
        collection: ``"offline"`` (callbacks get the records after the run) or ``"online"``
            (each record once it is final, while the run goes), see :mod:`simulator.callbacks`.

    Raises:
        ValueError: another ``collection``.
    """

    def __init__(self, collection: str) -> None:
        self.collection = callbacks.check_collection(collection)
        self.online = collection == "online"
        #: Every op record, in issue order. The last one may still change (an allocation stall
        #: charged to it, a declared shape), so online delivery waits for the next op.
        self.records: list[OpRecord] = []
        self.memory_steps: list[StepMemory | None] = []  # None: a step without memory modelling
        self._delivered = 0  # online collection: records handed to the callbacks so far

    def deliver_final(self) -> None:
        """Online collection: hand every finished op record to the callbacks."""
        records = self.records
        while self._delivered < len(records):
            record = records[self._delivered]
            self._delivered += 1
            callbacks.deliver(record)

    def close_step(self, memory: StepMemory | None) -> None:
        """A step ended with ``memory`` statistics: online, its last record is final."""
        if self.online:
            self.deliver_final()
        self.memory_steps.append(memory)

    def deliver_offline(self) -> None:
        """Offline collection: the trace is parsed after the run, every record to the callbacks."""
        if not self.online and callbacks.has_callbacks():
            for record in self.records:
                callbacks.deliver(record)

    def profile(self, *, hardware: str, devices: int, steps: int, tokens_per_step: int | None,
                memory_events: list[MemoryRecord], memory_peak: MemoryPeak | None) -> Profile:
        """The run's profile: its records, memory statistics and ``memory_events``."""
        digest = hashlib.sha256()
        for op in self.records:  # every step: a workload whose later steps change is another workload
            digest.update(f"{op.step}|{op.op_type}|{op.input_shapes}|{op.dtype};".encode())
        return Profile.model_construct(
            schema_version=1,
            simulator_version=SIMULATOR_VERSION,
            hardware=hardware,
            devices=devices,
            steps=steps,
            tokens_per_step=tokens_per_step,
            workload_fingerprint=digest.hexdigest()[:16],
            ops=self.records,
            memory=[m for m in self.memory_steps if m is not None],
            memory_events=memory_events,
            memory_peak=memory_peak,
            collection=self.collection,
        )

"""Pipeline schedules over every stage: Megatron's 1F1B and interleaved 1F1B.

:func:`stage_order` is the order in which one stage runs its forward and backward passes, as
Megatron-LM's ``forward_backward_pipelining_without_interleaving`` and
``..._with_interleaving`` (``megatron/core/pipeline_parallel/schedules.py``) issue them.
:func:`simulate` places every pass of every stage on a time line from the passes' durations:
a pass starts when its stage is free and the tensor it needs has arrived, so a slow stage (the
last one, which carries the LM head and the loss) holds up the passes of the others, and the
step ends when the first stage's last backward does. The builder
(:func:`simulator.models.training_step`) times each stage's passes by simulating them, runs this
schedule, and emits the first stage's ops with their receives waiting as the schedule says.

Each pass on stage ``s`` of model chunk ``c`` (virtual stage ``v = c * pp + s``) receives what
it needs (a forward the activations of virtual stage ``v - 1``, a backward the gradient of
``v + 1``), computes, and sends its result on. A transfer of ``hop_s`` occupies both ends at
once: it starts when the sender has computed (the receiver waits for that when it is ready
earlier) and the sender goes on once it is done; sends never wait for the receiver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

FORWARD = "forward"
BACKWARD = "backward"


@dataclass(frozen=True)
class Pass:
    """One forward or backward pass of one micro-batch through one model chunk of a stage."""

    kind: str
    chunk: int
    micro_batch: int


@dataclass(frozen=True)
class PassTime:
    """Where :func:`simulate` placed a pass, in seconds from the step's start.

    ``start_s``: the stage takes it up (posts its receive); ``ready_s``: the sender starts the
    transfer of its input (``None`` when it receives nothing); ``compute_start_s`` /
    ``compute_end_s``: its compute; ``end_s``: its send is done (``compute_end_s`` when it
    sends nothing).
    """

    start_s: float
    ready_s: float | None
    compute_start_s: float
    compute_end_s: float
    end_s: float

    @property
    def wait_s(self) -> float:
        """How long the stage waited for the pass's input (the pipeline bubble)."""
        return 0.0 if self.ready_s is None else max(0.0, self.ready_s - self.start_s)


def _check_sizes(stages: int, chunks: int, micro_batches: int) -> None:
    for label, value in (("stages", stages), ("chunks", chunks), ("micro_batches", micro_batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"pipeline schedule: {label} must be a positive integer, got {value!r}")
    if chunks > 1 and micro_batches % stages:
        raise ValueError(f"pipeline schedule: the interleaved schedule needs micro_batches ({micro_batches}) "
                         f"a multiple of the stages ({stages})")


def stage_order(stage: int, stages: int, chunks: int, micro_batches: int) -> list[Pass]:
    """The passes stage ``stage`` of ``stages`` runs, in order, with ``chunks`` model chunks per
    stage and ``micro_batches`` per step.

    One chunk (1F1B): ``stages - stage - 1`` warm-up forwards, then a forward and a backward per
    micro-batch, then the cool-down backwards. Several (interleaved 1F1B):
    ``(stages - stage - 1) * 2 + (chunks - 1) * stages`` warm-up forwards (all of them when
    ``micro_batches == stages``), forwards going through the chunks in groups of ``stages``
    micro-batches and backwards through them in reverse, as Megatron-LM's schedules do.

    Raises:
        ValueError: a size is not a positive integer, ``stage`` is out of range, or, with
            several chunks, ``micro_batches`` is not a multiple of ``stages``.
    """
    _check_sizes(stages, chunks, micro_batches)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < stages:
        raise ValueError(f"pipeline schedule: stage must be in [0, {stages}), got {stage!r}")
    total = micro_batches * chunks
    if chunks == 1:
        warmup = min(stages - stage - 1, micro_batches)
    elif micro_batches == stages:
        warmup = total
    else:
        warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
    group = stages * chunks

    def chunk_of(k: int, forward: bool) -> int:
        c = (k % group) // stages
        return c if forward else chunks - 1 - c

    def micro_batch_of(k: int) -> int:
        return (k // group) * stages + k % stages

    order = [Pass(FORWARD, chunk_of(k, True), micro_batch_of(k)) for k in range(warmup)]
    for i in range(total - warmup):
        k = warmup + i
        order.append(Pass(FORWARD, chunk_of(k, True), micro_batch_of(k)))
        order.append(Pass(BACKWARD, chunk_of(i, False), micro_batch_of(i)))
    order.extend(Pass(BACKWARD, chunk_of(i, False), micro_batch_of(i)) for i in range(total - warmup, total))
    return order


def max_in_flight(stage: int, stages: int, chunks: int, micro_batches: int) -> int:
    """The most chunk forwards stage ``stage`` holds activations of at once (forwards whose
    backward has not run yet): ``min(stages - stage, micro_batches)`` in 1F1B; in the
    interleaved schedule the warm-up forwards plus one (Korthikanti et al., section 4.2.3: the
    first stage holds ``1 + (stages - 1) / (stages * chunks)`` times a stage's layers).

    Raises:
        ValueError: as :func:`stage_order`.
    """
    most = held = 0
    for p in stage_order(stage, stages, chunks, micro_batches):
        held += 1 if p.kind == FORWARD else -1
        most = max(most, held)
    return most


def producer(stage: int, p: Pass, stages: int, chunks: int) -> tuple[int, Pass] | None:
    """The pass (and its stage) whose result ``p`` on ``stage`` receives: the previous virtual
    stage's forward, or the next one's backward; ``None`` for the first virtual stage's forward
    and the last one's backward (it starts from its own forward's loss)."""
    virtual = p.chunk * stages + stage
    if p.kind == FORWARD:
        if virtual == 0:
            return None
        source = virtual - 1
    else:
        if virtual == stages * chunks - 1:
            return None
        source = virtual + 1
    return source % stages, Pass(p.kind, source // stages, p.micro_batch)


def sends(stage: int, p: Pass, stages: int, chunks: int) -> bool:
    """Whether ``p`` on ``stage`` sends its result to another stage."""
    virtual = p.chunk * stages + stage
    return virtual < stages * chunks - 1 if p.kind == FORWARD else virtual > 0


def simulate(
    stages: int,
    chunks: int,
    micro_batches: int,
    duration_s: Callable[[int, Pass], float],
    hop_s: Callable[[int, int], float],
) -> list[dict[Pass, PassTime]]:
    """Place every pass of every stage on one time line (see the module docstring).

    Args:
        stages, chunks, micro_batches: the pipeline (see :func:`stage_order`).
        duration_s: ``(stage, pass) -> seconds`` of the pass's compute on that stage.
        hop_s: ``(from_stage, to_stage) -> seconds`` of one transfer between two stages.

    Returns:
        For each stage, its passes' :class:`PassTime`.

    Raises:
        ValueError: as :func:`stage_order`.
    """
    orders = [stage_order(s, stages, chunks, micro_batches) for s in range(stages)]
    times: list[dict[Pass, PassTime]] = [{} for _ in range(stages)]
    position = [0] * stages
    free_s = [0.0] * stages
    left = sum(len(o) for o in orders)
    while left:
        progressed = False
        for s in range(stages):
            order = orders[s]
            while position[s] < len(order):
                p = order[position[s]]
                start_s = free_s[s]
                source = producer(s, p, stages, chunks)
                ready_s = None
                if source is None:
                    compute_start_s = start_s
                    if p.kind == BACKWARD:  # the last virtual stage: after its own forward
                        own = times[s].get(Pass(FORWARD, p.chunk, p.micro_batch))
                        if own is None:
                            break
                        compute_start_s = max(start_s, own.compute_end_s)
                else:
                    sent = times[source[0]].get(source[1])
                    if sent is None:
                        break  # its input is not computed yet: another stage goes first
                    ready_s = sent.compute_end_s
                    compute_start_s = max(start_s, ready_s) + hop_s(source[0], s)
                compute_end_s = compute_start_s + duration_s(s, p)
                end_s = compute_end_s
                if sends(s, p, stages, chunks):
                    end_s += hop_s(s, (s + (1 if p.kind == FORWARD else -1)) % stages)
                times[s][p] = PassTime(start_s, ready_s, compute_start_s, compute_end_s, end_s)
                free_s[s] = end_s
                position[s] += 1
                left -= 1
                progressed = True
        if not progressed:  # the schedules above never deadlock; this guards the code
            raise RuntimeError("pipeline schedule: no pass can run; the stage orders deadlock")
    return times


def bubble_s(times: list[dict[Pass, PassTime]], stage: int = 0) -> float:
    """Time ``stage`` waits for its inputs over the step (the pipeline bubble it sees)."""
    return sum(t.wait_s for t in times[stage].values())


def step_s(times: list[dict[Pass, PassTime]]) -> float:
    """When the last pass of any stage is done."""
    return max(t.end_s for stage in times for t in stage.values())

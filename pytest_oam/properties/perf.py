"""Performance properties of single operators over their input shapes.

One line each in an ordinary Hypothesis test (the ``oam_profile`` fixture has the same three
methods)::

    @given(shape=strategies.matmul_shapes())
    def test_no_cliff(shape):
        assert_no_cliff("MatMul", shape, axis="n")

Each helper simulates the op alone on one card, calls ``hypothesis.target()`` (when run inside
a Hypothesis test) so the search climbs towards the worst case instead of stumbling on it, and
on failure raises :class:`PropertyFailure` whose message shows the shape, its neighbours'
numbers and the shape findings (idle last wave, misaligned axis, ...) that explain it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from simulator.profile import OpRecord

from ..format import fmt_flop, fmt_frac, fmt_percent, fmt_us
from ..judge.explain import shape_findings

#: Per op type: the names of the shape's axes, in order.
OP_AXES: dict[str, tuple[str, ...]] = {
    "MatMul": ("m", "k", "n"),
    "FlashAttention": ("batch", "heads", "seq", "head_dim"),
}


class PropertyFailure(AssertionError):
    """A performance property does not hold; the message explains the shape."""


@dataclass(frozen=True)
class Measurement:
    """One simulated op. Times in seconds; ``efficiency_frac`` = FLOP/s over the Cube peak."""

    op_type: str
    shape: dict[str, int]
    dtype: str
    hardware: str
    time_s: float
    flop: float
    peak_flop_per_s: float
    record: OpRecord = field(repr=False)
    findings: list[str] = field(default_factory=list)

    @property
    def efficiency_frac(self) -> float:
        return self.flop / self.time_s / self.peak_flop_per_s

    def describe(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.shape.items())
        return (f"{self.op_type}({dims}, {self.dtype}) on {self.hardware}: {fmt_us(self.time_s, grouping=True)}, "
                f"{fmt_flop(self.flop)}, {fmt_percent(self.efficiency_frac, 3, significant=True)} of peak")


def _shape_dict(op_type: str, shape: Mapping[str, int] | Sequence[int]) -> dict[str, int]:
    if op_type not in OP_AXES:
        raise ValueError(f"no shape properties for op type {op_type!r}; known: {', '.join(OP_AXES)}")
    axes = OP_AXES[op_type]
    if hasattr(shape, "_asdict"):  # the named tuples of pytest_oam.strategies
        shape = shape._asdict()
    if isinstance(shape, Mapping):
        values = dict(shape)
        if set(values) != set(axes):
            raise ValueError(f"{op_type} shape needs the axes {', '.join(axes)}; got {', '.join(values)}")
        return {a: values[a] for a in axes}
    values = tuple(shape)
    if len(values) != len(axes):
        raise ValueError(f"{op_type} shape needs {len(axes)} values ({', '.join(axes)}); got {list(values)}")
    return dict(zip(axes, values, strict=True))


#: Attributes each op takes (``--param`` of a sweep, keyword arguments of a measurement), with their types.
OP_ATTRIBUTES: dict[str, dict[str, type]] = {
    "MatMul": {},
    "FlashAttention": {"block_size": int, "pipeline_stages": int, "fusion": bool, "causal": bool},
}


def check_attrs(op_type: str, attrs: dict) -> dict:
    """Check ``--param`` attributes for ``op_type``.

    Raises:
        ValueError: an attribute the op does not take, or a value of the wrong type.
    """
    allowed = OP_ATTRIBUTES.get(op_type, {})
    for name, value in attrs.items():
        if name not in allowed:
            raise ValueError(f"{op_type} takes no attribute {name!r}; it takes: {', '.join(allowed) or 'none'}")
        kind = allowed[name]
        if (kind is bool and not isinstance(value, bool)) or (kind is int and (isinstance(value, bool) or not isinstance(value, int))):
            raise ValueError(f"{op_type} attribute {name} must be {'true or false' if kind is bool else 'an integer'}, "
                             f"got {value!r}")
    return attrs


def _workload(op_type: str, shape: dict[str, int], dtype: str, attrs: dict) -> Callable:
    check_attrs(op_type, attrs)
    if op_type == "MatMul":
        def matmul(npu):
            npu.matmul(npu.tensor((shape["m"], shape["k"]), dtype), npu.tensor((shape["k"], shape["n"]), dtype))

        return matmul

    def attention(npu):
        q = npu.tensor((shape["batch"], shape["heads"], shape["seq"], shape["head_dim"]), dtype)
        npu.flash_attention(q, q, q, **attrs)

    return attention


def measure(op_type: str, shape: Mapping[str, int] | Sequence[int], *, dtype: str = "fp16",
            hardware: str = "ascend910", **attrs) -> Measurement:
    """Simulate ``op_type`` alone at ``shape`` (see :data:`OP_AXES`) on one card.

    ``attrs`` go to the op (``block_size=...``, ``causal=True`` for FlashAttention).

    Raises:
        ValueError: unknown op type or hardware, or a shape with the wrong axes.
        simulator.ShapeError: a shape the op refuses.
    """
    import simulator
    from simulator.hardware import load_hardware

    dims = _shape_dict(op_type, shape)
    hw = load_hardware(hardware)
    profile = simulator.run(_workload(op_type, dims, dtype, attrs), hardware=hw)
    (record,) = profile.ops_of(op_type)
    return Measurement(op_type, dims, dtype, hw.name, record.duration_s, record.flop,
                       hw.peak_cube_flop_per_s(dtype), record, shape_findings(record, hw))


def _target(value: float, label: str) -> None:
    """``hypothesis.target`` inside a Hypothesis test; nothing outside one."""
    from hypothesis import target
    from hypothesis.errors import InvalidArgument

    try:
        target(value, label=label)
    except InvalidArgument:  # not inside a Hypothesis test case
        pass


def _neighbours(m: Measurement, attrs: dict) -> list[Measurement]:
    out = []
    for axis, value in m.shape.items():
        for delta in (-1, 1):
            if value + delta < 1:
                continue
            try:
                out.append(measure(m.op_type, {**m.shape, axis: value + delta}, dtype=m.dtype,
                                   hardware=m.hardware, **attrs))
            except ValueError:
                continue
    return out


def _explain(headline: str, focus: Measurement, others: list[Measurement], label: str = "neighbour",
             findings: list[str] | None = None) -> str:
    """The failure text: the shape given (``focus``), the others measured, and the shape rules'
    findings (``focus``'s unless given)."""
    lines = [headline, f"  shape:      {focus.describe()}"]
    lines += [f"  {label + ':':<11} {n.describe()}" for n in others]
    found = focus.findings if findings is None else findings
    lines += [f"  finding:    {f}" for f in found] or ["  finding:    none of the shape rules fired"]
    return "\n".join(lines)


def assert_efficiency(op_type: str, shape, at_least: float, *, dtype: str = "fp16", hardware: str = "ascend910",
                      **attrs) -> Measurement:
    """The op reaches at least ``at_least`` of the Cube unit's peak at ``shape``.

    Raises:
        PropertyFailure: below the bound (with the shape's neighbours and findings).
        ValueError: ``at_least`` outside (0, 1].
    """
    __tracebackhide__ = True
    if not 0 < at_least <= 1:
        raise ValueError(f"at_least must be a fraction in (0, 1], got {at_least!r}")
    m = measure(op_type, shape, dtype=dtype, hardware=hardware, **attrs)
    _target(-m.efficiency_frac, f"{op_type} shortfall below peak")
    if m.efficiency_frac < at_least:
        raise PropertyFailure(_explain(
            f"{op_type} reaches {fmt_frac(m.efficiency_frac)} of peak, below the required {fmt_percent(at_least)}",
            m, _neighbours(m, attrs)))
    return m


def assert_no_cliff(op_type: str, shape, *, axis: str | None = None, step: int = 1, slack_frac: float = 0.10,
                    dtype: str = "fp16", hardware: str = "ascend910", **attrs) -> None:
    """Growing ``axis`` (every axis if ``None``) by ``step`` costs no more time than FLOP, within
    ``slack_frac``: ``t(shape + step) / t(shape) <= (1 + slack) * flop(shape + step) / flop(shape)``.

    Raises:
        PropertyFailure: a cliff (with both shapes' numbers and the findings of the larger one).
        ValueError: unknown axis, ``step`` < 1 or a negative ``slack_frac``.
    """
    __tracebackhide__ = True
    if step < 1 or slack_frac < 0:
        raise ValueError(f"step must be >= 1 and slack_frac >= 0, got step={step!r}, slack_frac={slack_frac!r}")
    base = measure(op_type, shape, dtype=dtype, hardware=hardware, **attrs)
    axes = list(base.shape) if axis is None else [axis]
    for name in axes:
        if name not in base.shape:
            raise ValueError(f"{op_type} has no axis {name!r}; axes: {', '.join(base.shape)}")
        bigger = measure(op_type, {**base.shape, name: base.shape[name] + step}, dtype=dtype, hardware=hardware,
                         **attrs)
        growth = (bigger.time_s / base.time_s) / (bigger.flop / base.flop)
        _target(growth, f"{op_type} time growth over FLOP growth along {name}")
        if growth > 1 + slack_frac:
            raise PropertyFailure(_explain(
                f"cliff along {name}: {name} {base.shape[name]} -> {base.shape[name] + step} adds "
                f"{fmt_percent(bigger.flop / base.flop - 1, 1)} FLOP but "
                f"{fmt_percent(bigger.time_s / base.time_s - 1, 1)} time "
                f"(limit {fmt_percent(slack_frac)} more than FLOP)",
                base, [bigger], label="grown",
                findings=bigger.findings))  # the shape given first (newcomer: it was labelled the neighbour)


def assert_near_best(op_type: str, shape, *, within_frac: float = 0.20, align: int = 128, dtype: str = "fp16",
                     hardware: str = "ascend910", **attrs) -> Measurement:
    """The op's efficiency at ``shape`` is within ``within_frac`` of the best of its shape class:
    the shapes with every axis rounded down or up to a multiple of ``align`` (axes smaller than
    ``align`` stay as they are).

    Raises:
        PropertyFailure: more than ``within_frac`` below the best aligned shape.
        ValueError: ``within_frac`` outside [0, 1) or ``align`` below 1.
    """
    __tracebackhide__ = True
    if not 0 <= within_frac < 1:
        raise ValueError(f"within_frac must be a fraction in [0, 1), got {within_frac!r}")
    if isinstance(align, bool) or not isinstance(align, int) or align < 1:
        raise ValueError(f"align must be a positive integer, got {align!r}")
    m = measure(op_type, shape, dtype=dtype, hardware=hardware, **attrs)
    candidates = []
    for rounding in (lambda v: v // align * align, lambda v: -(-v // align) * align):
        aligned = {a: (rounding(v) if v >= align else v) for a, v in m.shape.items()}
        candidates.append(measure(op_type, aligned, dtype=dtype, hardware=hardware, **attrs))
    best = max(candidates, key=lambda c: c.efficiency_frac)
    ratio = m.efficiency_frac / best.efficiency_frac
    _target(-ratio, f"{op_type} efficiency against its aligned shape class")
    if ratio < 1 - within_frac:
        raise PropertyFailure(_explain(
            f"{op_type} runs at {fmt_percent(ratio)} of the efficiency of its best aligned shape "
            f"(limit {fmt_percent(1 - within_frac)})", m, candidates, label="aligned"))
    return m

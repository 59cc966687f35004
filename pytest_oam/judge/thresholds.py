"""Regression limits: parsing ``OP=LIMIT`` entries and resolving the limit of an op type.

A LIMIT is a percentage (``2%``, ``2.5%``) or a fraction (``0.02``); it must be finite and
not negative. ``OP`` is an op type (``MatMul``) or an ``fnmatch`` glob (``FlashAttention*``).

Precedence, highest first: the test's ``@pytest.mark.oam(thresholds=...)``, ``--oam-threshold``,
the ``oam_thresholds`` ini key, the built-in defaults. Within one layer an exact op type wins
over globs, and a longer glob over a shorter one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase

#: Built-in limits: FlashAttention (forward and backward) 2%, peak device memory 5%,
#: everything else 10%.
DEFAULT_THRESHOLDS: dict[str, float] = {"FlashAttention*": 0.02, "memory.*": 0.05, "*": 0.10}

#: The row that compares whole-step time; thresholds may name it like an op type.
STEP_ROW = "step"
#: Rows compared for runs that tracked device memory (``memory=True``): peak reserved and
#: allocated bytes (limit ``memory.*``), allocator time per step and allocations that flushed
#: the cache and retried, per step (limit ``*``; from none in the baseline, any is a regression).
MEMORY_ROWS = ("memory.reserved_peak", "memory.allocated_peak", "alloc_time", "alloc_retries")


class ThresholdError(ValueError):
    """A limit or ``OP=LIMIT`` entry that cannot be parsed."""


def parse_limit(text: object) -> float:
    """``"2%"`` -> 0.02, ``"0.02"`` -> 0.02, ``0.02`` -> 0.02.

    A bare number is a fraction and must be below 1 (``5`` would be 500%, almost always a
    typo for ``5%``); limits of 100% or more are written with ``%``.

    Raises:
        ThresholdError: not a number, not finite, negative, or a bare number of 1 or more.
    """
    if isinstance(text, bool):
        raise ThresholdError(f"limit {text!r} is not a number")
    percent = False
    if isinstance(text, (int, float)):
        value = float(text)
    elif isinstance(text, str):
        raw = text.strip()
        percent = raw.endswith("%")
        try:
            # not display: "5%" parsed into the fraction 0.05 (a bare 100.0: simulator.units is not
            # imported here, the plugin parses limits at configure and must not load the simulator)
            value = float(raw[:-1]) / 100.0 if percent else float(raw)
        except ValueError:
            raise ThresholdError(
                f"limit {text!r} is not a percentage like '2%' or a fraction like '0.02'"
            ) from None
    else:
        raise ThresholdError(f"limit {text!r} is not a percentage like '2%' or a fraction like '0.02'")
    if not math.isfinite(value):
        raise ThresholdError(f"limit {text!r} is not finite")
    if value < 0:
        raise ThresholdError(f"limit {text!r} is negative")
    if not percent and value >= 1:
        # imported here: format loads the simulator (its units), which the plugin loads only when it profiles
        from ..format import fmt_percent, fmt_percent_as_fraction

        raise ThresholdError(
            f"limit {text!r} is a fraction of {value:g} ({fmt_percent(value, None)}); write '{value:g}%' for "
            f"{value:g} percent, '{fmt_percent_as_fraction(value)}' as a fraction, or '{fmt_percent(value, None)}' "
            "if you mean it"
        )
    return value


def parse_entry(text: str) -> tuple[str, float]:
    """``"MatMul=5%"`` -> ``("MatMul", 0.05)``.

    Raises:
        ThresholdError: no ``=``, an empty op pattern, or a bad limit.
    """
    op, sep, limit = text.partition("=")
    op = op.strip()
    if not sep or not op:
        raise ThresholdError(f"threshold {text!r} is not of the form OP=LIMIT (e.g. MatMul=5%)")
    return op, parse_limit(limit)


def parse_mapping(mapping: object, what: str = "thresholds") -> dict[str, float]:
    """A marker's ``thresholds={"MatMul": "5%"}`` -> ``{"MatMul": 0.05}``; ``what`` names the
    marker keyword in messages.

    Raises:
        ThresholdError: not a dict of op pattern to limit.
    """
    if not isinstance(mapping, dict):
        raise ThresholdError(f"{what} must be a dict of op type to limit, got {mapping!r}")
    out: dict[str, float] = {}
    for op, limit in mapping.items():
        if not isinstance(op, str) or not op.strip():
            raise ThresholdError(f"{'threshold' if what == 'thresholds' else what + ':'} op type {op!r} must be a "
                                 "non-empty string")
        try:
            out[op.strip()] = parse_limit(limit)
        except ThresholdError as exc:
            if what == "thresholds":  # the gate's own keyword: the message predates the others
                raise
            raise ThresholdError(f"{what}: {op.strip()}: {exc}") from None
    return out


@dataclass(frozen=True)
class Limit:
    """A resolved limit: the fraction, the layer it came from and the pattern that matched."""

    frac: float
    source: str
    pattern: str


def _match(layer: dict[str, float], op_type: str) -> tuple[str, float] | None:
    if op_type in layer:
        return op_type, layer[op_type]
    globs = [p for p in layer if fnmatchcase(op_type, p)]
    if not globs:
        return None
    best = max(globs, key=len)
    return best, layer[best]


@dataclass(frozen=True)
class LimitResolver:
    """Ordered layers ``(source, {pattern: frac})``, highest precedence first."""

    layers: tuple[tuple[str, dict[str, float]], ...]

    @classmethod
    def build(
        cls,
        marker: dict[str, float] | None = None,
        cli: dict[str, float] | None = None,
        ini: dict[str, float] | None = None,
    ) -> LimitResolver:
        layers = [("marker", marker or {}), ("command line", cli or {}), ("ini", ini or {})]
        layers.append(("default", DEFAULT_THRESHOLDS))
        return cls(tuple((name, dict(layer)) for name, layer in layers if layer))

    def resolve(self, op_type: str) -> Limit:
        for source, layer in self.layers:
            hit = _match(layer, op_type)
            if hit is not None:
                return Limit(hit[1], source, hit[0])
        # DEFAULT_THRESHOLDS has "*", so this is unreachable unless the defaults change.
        raise LookupError(f"no threshold matches op type {op_type!r}")

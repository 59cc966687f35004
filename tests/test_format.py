"""The fixed-unit formats of :mod:`pytest_oam.format` print exactly what the messages printed
before their conversions moved there (issue 21): same digits, same sign, same -0 and inf."""

from __future__ import annotations

import math

import pytest

from pytest_oam import format as fmt

VALUES = [0.0, -0.0, 1e-9, 2.5e-6, 0.0123, 0.015, 1.5e-3, 0.12345, 0.5, 1.0, 12.3456, 2**19, 2**33 + 7,
          -0.00001, -3.75, math.inf, -math.inf, math.nan]

#: (new call, the f-string it replaced)
CASES = [
    (lambda x: fmt.fmt_ms(x), lambda x: f"{x * 1e3:.2f} ms"),
    (lambda x: fmt.fmt_ms(x, 3), lambda x: f"{x * 1e3:.3f} ms"),
    (lambda x: fmt.fmt_ms(x, None), lambda x: f"{x * 1e3:g} ms"),
    (lambda x: fmt.fmt_us(x), lambda x: f"{x * 1e6:.1f} us"),
    (lambda x: fmt.fmt_us(x, grouping=True), lambda x: f"{x * 1e6:,.1f} us"),
    (lambda x: fmt.fmt_us(x, signed=True), lambda x: f"{x * 1e6:+.1f} us"),
    (lambda x: fmt.fmt_us(x, grouping=True, unit=False), lambda x: f"{x * 1e6:,.1f}"),
    (lambda x: fmt.fmt_percent(x), lambda x: f"{x * 100:.0f}%"),
    (lambda x: fmt.fmt_percent(x, 1), lambda x: f"{x * 100:.1f}%"),
    (lambda x: fmt.fmt_percent(x, 1, signed=True), lambda x: f"{x * 100:+.1f}%"),
    (lambda x: fmt.fmt_percent(x, None), lambda x: f"{x * 100:g}%"),
    (lambda x: fmt.fmt_percent(x, 3, significant=True), lambda x: f"{x * 100:.3g}%"),
    (lambda x: fmt.fmt_percent_as_fraction(x), lambda x: f"{x / 100:g}"),
    (lambda x: fmt.fmt_bytes_in(x, "GiB"), lambda x: f"{x / 2**30:.2f} GiB"),
    (lambda x: fmt.fmt_bytes_in(x, "MiB", 0), lambda x: f"{x / 2**20:.0f} MiB"),
    (lambda x: fmt.fmt_bytes_in(x, "MiB", 1), lambda x: f"{x / 2**20:.1f} MiB"),
    (lambda x: fmt.fmt_bytes_in(x, "MiB", None), lambda x: f"{x / 2**20:g} MiB"),
    (lambda x: fmt.fmt_gb_per_s(x), lambda x: f"{x / 1e9:.1f} GB/s"),
    (lambda x: fmt.fmt_flop(x), lambda x: f"{x / 1e9:.4g} GFLOP"),
]


@pytest.mark.parametrize(("new", "old"), CASES)
def test_fixed_unit_formats_print_what_the_messages_printed(new, old) -> None:
    assert [new(x) for x in VALUES] == [old(x) for x in VALUES]


def test_inverse_percent_divides_as_the_message_did() -> None:
    # 100 / w and (1 / w) * 100 differ in the last bit for some w, which .4g can show
    ratios = [a / b for a in range(1, 200) for b in range(a, a + 50)]
    assert [fmt.fmt_inverse_percent(w) for w in ratios] == [f"{100 / w:.4g}%" for w in ratios]


def test_byte_limit_and_plot_values() -> None:
    for limit in (0, 1023, 2**30 - 1, 2**30, 3 * 2**30, 2**31 + 5):
        assert fmt.fmt_byte_limit(limit) == (f"{limit / 2**30:g} GiB" if limit >= 2**30 else f"{limit:,} bytes")
    assert [fmt.to_ms(x) for x in (0.0, 0.0123, 2.5)] == [x * 1e3 for x in (0.0, 0.0123, 2.5)]
    assert [fmt.to_percent(x) for x in (0.0, 0.123, 1.0)] == [x * 100 for x in (0.0, 0.123, 1.0)]

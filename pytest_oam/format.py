"""Everything shown to people, made from numbers and names: the one module that converts units
for display (data stays in SI units everywhere else: seconds, bytes, fractions), and that makes
text from data files safe to print (a terminal, a Markdown job summary).
"""

from __future__ import annotations

import math
import re

from simulator.units import GIGA, MEGA, MS_PER_S, US_PER_S, GiB, KiB, MiB


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def fmt_bytes(size: float | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size:.0f} B"


def time_unit(seconds: float) -> tuple[float, str]:
    """The display unit of :func:`fmt_time` for ``seconds``: (units per second, name), for the
    axes of a plot whose largest value is ``seconds``."""
    if seconds >= 1.0:
        return 1.0, "s"
    if seconds >= 1e-3:
        return MS_PER_S, "ms"
    return US_PER_S, "us"


def bytes_unit(size: float) -> tuple[float, str]:
    """The display unit of :func:`fmt_bytes` for ``size``: (bytes per unit, name)."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= scale:
            return scale, unit
    return 1, "B"


def fmt_frac(frac: float | None, signed: bool = False) -> str:
    if frac is None:
        return "-"
    if math.isinf(frac):
        return "new"  # from zero: no finite percentage
    percent = frac * 100 + 0.0  # + 0.0 turns -0.0 into 0.0
    if abs(percent) < 0.05:
        percent = 0.0  # a rounding-level change prints as +0.0%, not -0.0%
    return f"{percent:+.1f}%" if signed else f"{percent:.1f}%"


def fmt_rate(tokens_per_s: float | None) -> str:
    return "-" if tokens_per_s is None else f"{tokens_per_s:,.0f}"


def fmt_value(value: float | None, unit: str) -> str:
    """A verdict's baseline or current value in its unit: seconds, bytes, or a count per step
    (shown per 1,000 steps, since the counted events are rare)."""
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "count":
        if value is None:
            return "-"
        if value == 0:
            return "none"
        if value >= 0.1:
            return f"{value:.3g} per step"
        return f"{value * 1000:.3g} per 1,000 steps"
    return fmt_time(value)


# -- one fixed unit: the numbers of messages (findings, failures, notes) that always show the same
# unit, whatever the size, with the digits each message has always had. ``digits`` is the number
# of decimals; ``None`` is Python's ``g`` (up to six significant digits, no trailing zeros).


def _spec(digits: int | None, *, signed: bool = False, grouping: bool = False, significant: bool = False) -> str:
    """The format spec of a number: ``+`` if ``signed``, ``,`` thousands separators if
    ``grouping``, ``digits`` decimals (``significant``: significant digits) or ``g``."""
    head = ("+" if signed else "") + ("," if grouping else "")
    if digits is None:
        return head + "g"
    return f"{head}.{digits}{'g' if significant else 'f'}"


def fmt_ms(seconds: float, digits: int | None = 2) -> str:
    """``seconds`` in milliseconds: ``fmt_ms(0.0123)`` is ``"12.30 ms"``."""
    return f"{seconds * MS_PER_S:{_spec(digits)}} ms"


def fmt_us(seconds: float, digits: int = 1, *, signed: bool = False, grouping: bool = False,
           unit: bool = True) -> str:
    """``seconds`` in microseconds: ``fmt_us(1.5e-3, grouping=True)`` is ``"1,500.0 us"``;
    without ``unit`` the bare number, for a table column that names the unit."""
    text = f"{seconds * US_PER_S:{_spec(digits, signed=signed, grouping=grouping)}}"
    return f"{text} us" if unit else text


def fmt_percent(frac: float, digits: int | None = 0, *, signed: bool = False, significant: bool = False) -> str:
    """The fraction ``frac`` as a percentage: ``fmt_percent(0.256)`` is ``"26%"``. Unlike
    :func:`fmt_frac`, a -0.0 stays ``-0%`` and an infinite change ``inf%``, as these messages
    always showed them."""
    return f"{frac * 100:{_spec(digits, signed=signed, significant=significant)}}%"


def fmt_inverse_percent(frac: float, digits: int = 4) -> str:
    """``1 / frac`` as a percentage, computed as ``100 / frac`` (``digits`` significant digits):
    the share of a call's work that a re-costed call did, when ``frac`` is the call's work over it."""
    return f"{100 / frac:{_spec(digits, significant=True)}}%"


def fmt_percent_as_fraction(percent: float) -> str:
    """A number of percent as the fraction it stands for: ``fmt_percent_as_fraction(5)`` is ``"0.05"``."""
    return f"{percent / 100:g}"


_BINARY_UNITS = {"KiB": KiB, "MiB": MiB, "GiB": GiB}


def fmt_bytes_in(size: float, unit: str, digits: int | None = 2) -> str:
    """``size`` bytes in the binary ``unit`` (``"KiB"``, ``"MiB"`` or ``"GiB"``) whatever the
    size, unlike :func:`fmt_bytes`: ``fmt_bytes_in(2**19, "MiB", 1)`` is ``"0.5 MiB"``."""
    return f"{size / _BINARY_UNITS[unit]:{_spec(digits)}} {unit}"


def fmt_byte_limit(limit: int) -> str:
    """A limit on bytes read: in GiB from 1 GiB on (``"1 GiB"``), else exact (``"65,536 bytes"``)."""
    return fmt_bytes_in(limit, "GiB", None) if limit >= GiB else f"{limit:,} bytes"


def fmt_gb_per_s(bytes_per_s: float, digits: int = 1) -> str:
    """A bandwidth in decimal GB/s, as HCCL and msprof show bus bandwidth: ``"180.0 GB/s"``."""
    return f"{bytes_per_s / GIGA:{_spec(digits)}} GB/s"


def fmt_mb(size: float, digits: int = 1) -> str:
    """A size in decimal megabytes, as msprof's communication files give it: ``"427.6 MB"``."""
    return f"{size / MEGA:{_spec(digits, grouping=True)}} MB"


def fmt_flop(flop: float, digits: int = 4) -> str:
    """A FLOP count in GFLOP with its unit, ``digits`` significant digits: ``"34.36 GFLOP"``."""
    return f"{flop / GIGA:{_spec(digits, significant=True)}} GFLOP"


def to_ms(seconds: float) -> float:
    """``seconds`` in milliseconds, for a plot axis labelled in ms."""
    return seconds * MS_PER_S


def to_percent(frac: float) -> float:
    """The fraction ``frac`` in percent, for a plot axis or colour scale labelled in %."""
    return frac * 100


def memory_site_value(op_type: str, value: float) -> str:
    """What a memory row's call-site number is: seconds waited for flushes (``alloc_retries``),
    or bytes held at the allocated peak (the peak rows)."""
    return f"waited {fmt_time(value)} for flushes" if op_type == "alloc_retries" else f"{fmt_bytes(value)} at the peak"


#: ANSI escape sequences: CSI (colours, cursor moves: ESC [ ... final byte, or the C1 CSI byte),
#: OSC (titles, hyperlinks: ESC ] ... BEL or ESC \\) and the two-byte ones (ESC and a final byte).
_ANSI = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?|\x1b[@-_]?")


#: Control characters (C0 but tab and newline, DEL, C1), and the Unicode format characters that
#: reorder or hide text (bidirectional overrides and isolates, marks): a right-to-left override
#: can make "DESSAP" read as PASSED.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


_LINE_BREAKS = re.compile("\r\n|[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def terminal_safe(text: object, *, keep_newlines: bool = False) -> str:
    """``str(text)`` safe to print on a terminal, one line: ANSI escape sequences removed, line
    breaks and tabs made spaces, every other control character (C0, DEL, C1) and the Unicode
    bidirectional and invisible format characters removed. With ``keep_newlines``, line breaks
    stay (as ``\\n``): for whole texts whose fields are already safe; a field from a data file
    (op name, test id, message) is made safe with the default, so that it cannot forge a line."""
    text = _ANSI.sub("", str(text))
    text = _LINE_BREAKS.sub("\n" if keep_newlines else " ", text).replace("\t", " ")
    return _CONTROL.sub("", text)


def md_text(text: object) -> str:
    """``text`` safe in GitHub Markdown prose and table cells: control characters removed
    (:func:`terminal_safe`), HTML as entities (``<script>`` shows as text), pipes escaped (no
    column break), backticks as entities (no code span opened), brackets escaped (no link or
    image), line breaks as ``<br>`` (no new row, heading or list item)."""
    import html

    text = html.escape(terminal_safe(text, keep_newlines=True), quote=False)
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "&#96;")
    text = text.replace("[", "\\[").replace("]", "\\]")
    return text.replace("\n", "<br>")


#: What a Markdown code span can hold as it is: no backtick (it would end the span), no line
#: break, no character that is HTML-escaped elsewhere (a span shows it raw, as a literal).
_PLAIN_CODE = re.compile(r"[^`<>&\n\r]*")


def md_code(text: object, in_table: bool = False) -> str:
    """``text`` as literal code in Markdown: a code span when it holds no backtick, HTML special
    character or line break; otherwise an HTML ``<code>`` element with those as entities (a
    backtick could end a span early and let the rest through as HTML). ``in_table``: its pipes
    escaped, as a GFM table cell needs (the table parser unescapes them inside spans and
    elements alike; outside tables the backslash would show)."""
    import html

    text = terminal_safe(text, keep_newlines=True)
    if _PLAIN_CODE.fullmatch(text):
        text = text.replace("|", "\\|") if in_table else text
        return f"`{text}`"
    text = html.escape(text, quote=False).replace("`", "&#96;").replace("\n", "<br>")
    # in a table the parser unescapes \| before reading the cell; elsewhere an entity (the
    # element shows a backslash literally, and no raw pipe is left to look like a row)
    return f"<code>{text.replace('|', chr(92) + '|' if in_table else '&#124;')}</code>"


def table_cell(text: object, fmt: str) -> str:
    """A table cell from a data file: Markdown-escaped for ``github`` tables, terminal-safe otherwise."""
    return md_text(text) if fmt == "github" else terminal_safe(text)



def fmt_gflop(flop: float) -> str:
    """A FLOP count in GFLOP, for a table column that names the unit."""
    return f"{flop / 1e9:,.1f}"


def fmt_mib(size: float) -> str:
    """A byte count in MiB, for a table column that names the unit."""
    return f"{size / MiB:,.1f}"


def fmt_mhz(clock_hz: float) -> str:
    """A clock in MHz, as CANN's platform files and npu-smi give it: ``fmt_mhz(1.65e9)`` is ``"1650 MHz"``."""
    return f"{clock_hz / MEGA:.0f} MHz"

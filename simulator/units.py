"""Unit constants. Every quantity in the simulator is SI; convert only when displaying.

Binary sizes (KiB, MiB, GiB) are powers of two; decimal rates (GIGA, TERA) powers of ten.
"""

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

KILO = 1e3
MEGA = 1e6
GIGA = 1e9
TERA = 1e12

US_PER_S = 1e6
MS_PER_S = 1e3
#: Their inverses, to convert a file's milliseconds or microseconds to seconds by multiplying:
#: ``x * S_PER_US`` is bit for bit ``x * 1e-6``, where ``x / US_PER_S`` can differ in the last bit.
S_PER_MS = 1e-3
S_PER_US = 1e-6

#: Bytes per element of each dtype name the simulator accepts. These are IEEE / standard
#: storage sizes, not hardware figures.
DTYPE_BYTES = {
    "fp16": 2,
    "bf16": 2,
    "fp32": 4,
    "int8": 1,
    "int32": 4,
    "int64": 8,
}

#: The largest finite fp16 value, (2 - 2**-10) * 2**15: the bound the Ascend 910 saturates fp16
#: overflows to in its default saturation mode (an IEEE format fact).
FP16_MAX = 65504.0

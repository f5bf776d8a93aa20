"""Human units: how every view writes a count, a size, a duration, a share or
a rate, in sentences, table cells, hover labels and terminal lines alike.

One rule per unit, so the same figure reads the same in every view:

- counts: thousands separators, ``1,234``; ``plural`` adds the noun;
- bytes: binary units, whole bytes below 1 KiB, else one decimal, and no
  thousands separator: ``16 B``, ``1000.0 MiB``, ``1.5 GiB``;
- durations: one decimal in µs, ms or s. ``format_duration`` picks the unit
  (µs below 1 ms, ms below 1 s); ``format_us``, ``format_ms`` and
  ``format_seconds`` keep one unit, for figures read against each other
  (a table's column, "40.0 ms against 20.0 ms");
- shares: whole percent, no space: ``12%``;
- bandwidth: three significant figures, ``0.485 GB/s``, ``123 GB/s``;
- FLOPs: an SI prefix and two decimals, ``3.00 TFLOP``, ``1.25 GFLOP/s``.

A missing figure (None or NaN) is written ``n/a`` (``missing`` changes it), so
no view prints "nan ms". Each function takes the figure in the unit its name
says: ``format_ms(ms)``, ``format_duration(us)``, ``format_percent(pct)``
(0-100).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

MISSING = "n/a"


def _missing(v: Any) -> bool:
    try:
        return v is None or math.isnan(v)  # numpy's float32 NaN too
    except TypeError:
        return False


def _fixed(v: float, decimals: int, signed: bool = False, grouped: bool = True) -> str:
    """``v`` with ``decimals`` decimals and thousands separators (unless not
    ``grouped``); ``signed`` writes the sign of every figure, ``+`` included
    (``+0.0`` for no change)."""
    return f"{v:{'+' if signed else ''}{',' if grouped else ''}.{decimals}f}"


def format_count(n: Any) -> str:
    """A count with thousands separators: ``1,234``."""
    return MISSING if _missing(n) else f"{int(n):,}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, in the plural (``many``, else ``word + "s"``) unless
    ``n`` is 1; ``n`` is written with thousands separators."""
    return f"{format_count(n)} {word if n == 1 else (many or word + 's')}"


def format_bytes(n: Any, *, signed: bool = False, missing: str = MISSING) -> str:
    """Bytes in binary units: ``16 B``, ``4.0 MiB``, ``1.5 GiB`` (``signed``: a
    change, ``+4.0 MiB``)."""
    if _missing(n):
        return missing
    v = float(n)
    for unit, decimals in (("B", 0), ("KiB", 1), ("MiB", 1)):
        if abs(v) < 1024 - 0.5 * 10**-decimals:  # never "1,024.0 KiB"
            return f"{_fixed(v, decimals, signed, grouped=False)} {unit}"
        v /= 1024
    return f"{_fixed(v, 1, signed, grouped=False)} GiB"


def format_us(us: Any, *, signed: bool = False, missing: str = MISSING) -> str:
    """Microseconds, in µs: ``12.3 µs``."""
    return missing if _missing(us) else f"{_fixed(float(us), 1, signed)} µs"


def format_ms(ms: Any, *, signed: bool = False, unit: bool = True,
              missing: str = MISSING) -> str:
    """Milliseconds, in ms: ``12.3 ms`` (``unit=False``: ``12.3``, in a column
    whose header names the unit)."""
    if _missing(ms):
        return missing
    return _fixed(float(ms), 1, signed) + (" ms" if unit else "")


def format_us_as_ms(us: Any, *, signed: bool = False, missing: str = MISSING) -> str:
    """Microseconds written in ms: ``12.3 ms`` for 12,300 µs."""
    return missing if _missing(us) else format_ms(float(us) / 1e3, signed=signed)


def format_seconds(s: Any, *, signed: bool = False, missing: str = MISSING) -> str:
    """Seconds, in s: ``3.2 s``."""
    return missing if _missing(s) else f"{_fixed(float(s), 1, signed)} s"


def format_duration(us: Any, *, signed: bool = False, missing: str = MISSING) -> str:
    """Microseconds in the unit that suits them: ``950.0 µs``, ``12.3 ms``,
    ``1.3 s`` (the unit chosen after rounding, so never ``1,000.0 µs``)."""
    if _missing(us):
        return missing
    v = float(us)
    if abs(v) < 999.95:
        return format_us(v, signed=signed)
    if abs(v) < 999_950:
        return format_ms(v / 1e3, signed=signed)
    return format_seconds(v / 1e6, signed=signed)


def format_durations(us: Iterable[Any]) -> list[str]:
    """``format_duration`` of each figure: the same text for a column of thousands
    (a timeline's hover labels), without three calls per figure."""
    out = []
    for v in us.tolist() if isinstance(us, np.ndarray) else us:
        if v is None or v != v:  # None or NaN
            out.append(MISSING)
        elif -999.95 < v < 999.95:
            out.append(f"{v:,.1f} µs")
        elif -999_950 < v < 999_950:
            out.append(f"{v / 1e3:,.1f} ms")
        else:
            out.append(f"{v / 1e6:,.1f} s")
    return out


def format_percent(pct: Any, *, signed: bool = False, missing: str = MISSING) -> str:
    """A share given in percent (0-100) as a whole percent: ``12%``."""
    return missing if _missing(pct) else f"{_fixed(float(pct), 0, signed)}%"


def format_gbps(gbps: Any, *, missing: str = MISSING) -> str:
    """A bandwidth in GB/s, three significant figures: ``0.485 GB/s``, ``123 GB/s``."""
    if _missing(gbps):
        return missing
    v = float(gbps)
    text = f"{v:.3g}"
    if "e" in text and abs(v) >= 1:
        text = f"{v:,.0f}"
    return f"{text} GB/s"


def format_flops(flops: Any) -> str:
    """A FLOP count with an SI prefix: ``3.00 TFLOP``; blank where the trace has
    none (None, NaN or 0: torch records no estimate for most ops)."""
    if _missing(flops) or not math.isfinite(float(flops)) or float(flops) <= 0:
        return ""
    v = float(flops)
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:,.2f} {prefix}FLOP"
    return f"{v:,.0f} FLOP"


def format_flop_rate(flops_per_s: Any) -> str:
    """Achieved FLOP/s with an SI prefix: ``1.25 GFLOP/s``; blank where unknown."""
    text = format_flops(flops_per_s)
    return f"{text}/s" if text else ""

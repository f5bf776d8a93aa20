"""Counted nouns and byte sizes for sentences the user reads: "1 sync",
"3 syncs", "4.0 MiB"."""

from __future__ import annotations

import math


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, in the plural (``many``, else ``word + "s"``) unless
    ``n`` is 1; ``n`` is written with thousands separators."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def format_bytes(n: float | None) -> str:
    """Bytes as every view writes them (1 decimal; None or NaN as n/a)."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"

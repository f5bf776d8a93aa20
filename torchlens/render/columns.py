"""Rows into Bokeh source columns, shared by the per-rank figures of every
kind (heartbeats, the rank profile panels, the run's step chart).

One place for the conventions those figures must agree on: a rank's colour,
MiB as the memory unit, NaN (a gap in a line) for "not measured", and how
often a live view streams what arrived.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bokeh.palettes import Category10_10

MIB = 1 << 20
#: seconds a live view holds new rows before it streams them: at least twice a second
FLUSH_S = 0.4


def rank_color(rank: int) -> str:
    """A rank's colour among few ranks (ten, repeating)."""
    return Category10_10[rank % 10]


def as_number(value: Any, scale: float = 1.0) -> float:
    """A number for a source column: NaN (a gap in the line) for "not measured"."""
    return float("nan") if value is None else float(value) * scale


def as_mib(value: Any) -> float:
    """Bytes as MiB for a source column; NaN for "not measured"."""
    return as_number(value, 1 / MIB)


def to_columns(rows: Iterable[dict[str, Any]]) -> dict[str, list[Any]]:
    """Rows (dicts) as the column dict a ``ColumnDataSource`` takes or streams."""
    out: dict[str, list[Any]] = {}
    for row in rows:
        for k, v in row.items():
            out.setdefault(k, []).append(v)
    return out

"""The y axis of every memory chart (the timeline, the diff's, the per-rank one): from 0,
so a gap between two lines is drawn at its true share of the whole, and in the unit the
text states the chart's peak in (``format_bytes``: GiB from 1 GiB), so the number a
reader sees in a sentence is the number the axis shows."""

from __future__ import annotations

from typing import Any

from torchlens.model.units import format_bytes

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
#: hover format of a value in that unit: three significant decimals at most
HOVER = {"KiB": "{0,0}", "MiB": "{0,0.0}", "GiB": "{0,0.00}"}


def memory_unit(peak: float) -> tuple[str, int]:
    """The unit (name, bytes) the text gives ``peak`` in; KiB below a KiB."""
    name = format_bytes(max(peak, 1024)).split()[-1]
    return name, UNITS[name]


def memory_axis(p: Any, unit: str, what: str = "") -> None:
    """Label ``p``'s y axis with ``unit`` (and ``what``) and start it at 0."""
    p.yaxis.axis_label = f"{unit} {what}".strip()
    p.y_range.start = 0

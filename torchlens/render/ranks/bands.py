"""Every rank of a big job at once, in the live view of ``%ddp_check --profile``
and ``torchlens.watch``: the spread across ranks at each step as a grey band
(lowest to highest) with the median as a grey line.

The figures come from ``analysis.ranks.spread.Spread``; here they are only
converted to the panels' units and merged into the Bokeh sources, sending
only the steps that changed.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, HoverTool

from torchlens.render.columns import as_mib, as_number, to_columns

#: the memory figures whose spread across ranks is drawn, as ``memory_rows`` names them
SPREAD_MEM = ("allocated", "reserved", "rss", "frag", "largest_free")
SPREAD_COLOR = "#555"


def spread_columns(keys: tuple[str, ...]) -> dict[str, list[Any]]:
    """The (empty) columns of a spread source: ``analysis.ranks.spread.Spread.changed``'s."""
    return {"step": [], "ranks": [],
            **{f"{k}_{end}": [] for k in keys for end in ("lo", "mid", "hi")}}


def band(fig: Any, src: ColumnDataSource, key: str, label: str | None = None,
          visible: bool = True) -> list[Any]:
    """All ranks at once: their range as a grey band, their median as a grey line."""
    area = fig.varea("step", f"{key}_lo", f"{key}_hi", source=src, fill_color=SPREAD_COLOR,
                     fill_alpha=0.15, visible=visible)
    extra = {"legend_label": label} if label else {}
    line = fig.line("step", f"{key}_mid", source=src, color=SPREAD_COLOR, line_width=1.5,
                    line_dash="dotdash", visible=visible, **extra)
    fig.add_tools(HoverTool(renderers=[line], tooltips=[
        ("step", "@step"), ("ranks", "@ranks"), ("median", f"@{key}_mid{{0,0.0}}"),
        ("range", f"@{key}_lo{{0,0.0}} to @{key}_hi{{0,0.0}}")]))
    return [area, line]


def mem_spread_units(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """A memory spread's columns in the panels' units (MiB, %)."""
    out = dict(columns)
    for key, values in columns.items():
        if key.startswith("frag_"):
            out[key] = [as_number(v, 100.0) for v in values]
        elif key != "step" and key != "ranks":
            out[key] = [as_mib(v) for v in values]
    return out


def merge(src: ColumnDataSource, columns: dict[str, list[Any]], rollover: int) -> None:
    """Changed steps of a spread into its source: patched where drawn, streamed
    when newer than every step drawn, the whole source again otherwise (a
    rank that lags sends a step the others sent long ago)."""
    steps = columns["step"]
    if not steps:
        return
    drawn = src.data["step"]
    index = {step: i for i, step in enumerate(drawn)}
    new = [i for i, step in enumerate(steps) if step not in index]
    if new and drawn and steps[new[0]] < drawn[-1]:
        rows = {step: {k: src.data[k][i] for k in src.data} for step, i in index.items()}
        rows.update({step: {k: columns[k][i] for k in columns} for i, step in enumerate(steps)})
        src.data = to_columns([rows[step] for step in sorted(rows)][-rollover:])
        return
    patches: dict[str, list[tuple[int, Any]]] = {}
    for i, step in enumerate(steps):
        if step in index:
            for k in columns:
                patches.setdefault(k, []).append((index[step], columns[k][i]))
    if patches:
        src.patch(patches)
    if new:
        src.stream({k: [columns[k][i] for i in new] for k in columns}, rollover=rollover)

"""HTML fragments of the report: op, kernel and step tables, environment.

Every function takes analysis output (DataFrames, dicts, lists) rather than a
Profile, so each fragment can be tested on a hand-made table. The markup is in
``templates/`` and autoescaped (``render.html``): op names, file paths and
annotations are user-controlled text, and the report is opened in a browser
(and inside notebooks) where unescaped text would run as markup. Each function
returns ``Markup``.

Tables are sortable by clicking a header, with a few lines of inline vanilla
JavaScript (``SORT_JS``): the report must work offline and inside a sandboxed
iframe, so no library and no network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup
from msgspec import UnsetType

from torchlens.model import OpDisplay
from torchlens.model.units import (
    MISSING,
    format_count,
    format_duration,
    format_flop_rate,
    format_flops,
)
from torchlens.render import html

#: The few lines that sort a table when a header is clicked (also in the page).
SORT_JS = html.source("sort.js")

DEFAULT_TOP = 20


@dataclass(frozen=True)
class Column:
    """One table column: DataFrame key, header, cell formatter, numeric sort."""

    key: str
    label: str
    fmt: Callable[[Any], str] = str
    numeric: bool = True
    #: text longer than this is cut, with the whole text on hover (``title``)
    max_chars: int | None = None


#: Where long names are cut: C++ kernel names run to 300+ characters and once
#: made the report 13,700 px wide; the cut ones keep their text on hover.
NAME_CHARS = 90


def cell_text(c: Column, value: Any) -> str:
    """A cell as ``c`` writes it; ``MISSING`` (the word every view writes for a
    figure that could not be measured) where there is no figure: None, or a
    numeric value that is not finite (NaN, as a DataFrame holds it)."""
    if value is None or (c.numeric and not math.isfinite(float(value))):
        return MISSING
    return c.fmt(value)


def shorten(text: str, limit: int | None) -> str:
    """``text``, or its first ``limit - 1`` characters and "…" when longer."""
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def cell_value(row: object, key: str) -> Any:
    """A row's figure under ``key``: a dict's item, or a typed row's field
    (``analysis.runs.rows``); ``None`` where the row has none."""
    if isinstance(row, Mapping):
        return row.get(key)
    value = getattr(row, key, None)
    return None if isinstance(value, UnsetType) else value


#: rows beyond which a table scrolls in a box of its own (the page goes on below it)
FOLD_ROWS = 25


def html_table(rows: Iterable[object], columns: list[Column], css_class: str = "") -> Markup:
    """A sortable table of dict rows or typed rows; numeric cells carry their
    raw value in ``data-v``. A table of more than ``FOLD_ROWS`` rows scrolls in
    a box about that tall, its header kept in view, and says so above it."""
    cells = []
    for row in rows:
        out = []
        for c in columns:
            value = cell_value(row, c.key)
            if value is None:
                out.append((c.numeric, "-1e308", MISSING, ""))
            elif c.numeric:
                raw = float(value)
                out.append((True, repr(raw) if math.isfinite(raw) else "-1e308",
                            cell_text(c, value), ""))
            else:
                text = c.fmt(value)
                short = shorten(text, c.max_chars)
                out.append((False, None, short, text if short != text else ""))
        cells.append(out)
    folded = (f"{len(cells):,} rows: the table scrolls in its box (click a heading to sort)"
              if len(cells) > FOLD_ROWS else "")
    return html.render("table.html.j2", classes=f"tl-sort {css_class}".strip(),
                       labels=[c.label for c in columns], rows=cells, folded=folded)


def op_columns(display: OpDisplay, has_gpu: bool) -> list[Column]:
    """The op table's columns as chosen by the profile's display options and the trace."""
    cols = [
        Column("name", "op", str, numeric=False, max_chars=NAME_CHARS),
        Column("calls", "calls", format_count),
        Column("self_cpu_us", "self CPU", format_duration),
        Column("total_cpu_us", "total CPU", format_duration),
    ]
    if has_gpu:
        cols += [Column("device_us", "device time", format_duration), Column("kernels", "kernels", format_count)]
    if display.shapes:
        cols.append(Column("input_shapes", "input shapes", str, numeric=False,
                           max_chars=NAME_CHARS))
        # an op autocast ran in bfloat16 or float16 says so here
        cols.append(Column("input_types", "input dtypes", str, numeric=False,
                           max_chars=NAME_CHARS))
    if display.flops:
        # the time FLOP/s divide by (analysis.trace.ops.flops_basis), named in the header
        basis = "device time" if has_gpu else "total CPU"
        cols += [Column("flops", "FLOPs", format_flops),
                 Column("flops_per_s", f"FLOP/s ({basis})", format_flop_rate)]
    if display.stack:
        cols.append(Column("stack", "source (your code)", str, numeric=False))
    return cols


def op_table_html(ops: Any, shown: Any, display: OpDisplay, has_gpu: bool) -> Markup:
    """The ``shown`` rows (``TraceView.top_ops``) of the op table ``ops`` as ``display`` asks."""
    cols = [c for c in op_columns(display, has_gpu) if c.key in shown.columns]
    return html.render("ops.html.j2", shown=len(shown), total=len(ops),
                       table=html_table(shown.to_dict("records"), cols, "ops"),
                       no_stack=display.stack and not any(shown.get("stack", [])))


KERNEL_COLUMNS = [
    Column("name", "kernel", str, numeric=False, max_chars=NAME_CHARS),
    Column("calls", "calls", format_count),
    Column("total_us", "total", format_duration),
    Column("mean_us", "mean", format_duration),
    Column("max_us", "max", format_duration),
    Column("streams", "streams", str, numeric=False),
    Column("is_comm", "communication", lambda v: "yes" if v else "", numeric=False),
]


def kernel_table_html(kernels: Any, top: int = DEFAULT_TOP) -> Markup:
    """The kernels taking most GPU time (an ``ops.kernel_table`` DataFrame)."""
    shown = kernels.sort_values("total_us", ascending=False, kind="stable").head(top)
    cols = [c for c in KERNEL_COLUMNS if c.key in shown.columns]
    return html.render("kernels.html.j2", shown=len(shown), total=len(kernels),
                       table=html_table(shown.to_dict("records"), cols, "kernels"))


STEP_COLUMNS = [
    Column("step", "step", str, numeric=False),
    Column("dur_us", "step time", format_duration),
    Column("kernel_us", "kernel", format_duration),
    Column("memcpy_us", "memcpy", format_duration),
    Column("memset_us", "memset", format_duration),
    Column("runtime_us", "runtime", format_duration),
    Column("dataloader_us", "dataloader", format_duration),
    Column("cpu_exec_us", "CPU exec", format_duration),
    Column("other_us", "other", format_duration),
    Column("comm_us", "communication", format_duration),
]


#: Step columns only a trace with GPU activity can fill: hidden on a CPU trace,
#: where they would be zero in every row.
GPU_STEP_COLUMNS = ("kernel_us", "memcpy_us", "memset_us", "runtime_us", "comm_us")


def step_columns(has_gpu: bool) -> list[Column]:
    """The step table's columns: without GPU activity, not the GPU roles."""
    return [c for c in STEP_COLUMNS if has_gpu or c.key not in GPU_STEP_COLUMNS]


def step_table_html(steps: Any, has_gpu: bool = True, chart: Markup | None = None) -> Markup:
    """Per-step time breakdown (TensorBoard profiler plugin definitions), under
    ``chart`` (the slot of its stacked bar chart) when given."""
    cols = [c for c in step_columns(has_gpu) if c.key in steps.columns]
    return html.render("steps.html.j2", has_gpu=has_gpu, chart=chart,
                       table=html_table(steps.to_dict("records"), cols, "steps"))


def value_html(value: Any) -> Markup:
    """Any JSON-like value as HTML (nested dicts become key/value tables)."""
    return html.render("value.html.j2", value=value)


def environment_html(environment: Mapping[str, Any]) -> Markup:
    """Where the profile was taken, so two runs can be compared honestly."""
    return html.render("environment.html.j2", environment=environment, value=environment)


def unmeasured_html(unmeasured: list[str]) -> Markup:
    """What could not be measured on the capturing machine, said plainly."""
    return html.render("unmeasured.html.j2", unmeasured=[str(u) for u in unmeasured])


def error_html(error: Mapping[str, Any]) -> Markup:
    """The exception that ended the profiled cell (what was captured is above)."""
    head = ": ".join(str(error[k]) for k in ("type", "message") if error.get(k))
    tb = error.get("traceback")
    rest = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
    return html.render("error.html.j2", head=head, traceback=str(tb) if tb else "", rest=rest)

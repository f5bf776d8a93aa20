"""HTML fragments of the report: op, kernel and step tables, hints, environment.

Every function takes analysis output (DataFrames, dicts, lists) rather than a
Profile, so each fragment can be tested on a hand-made table. Every string that
came from a trace or the user's machine goes through ``html.escape``: op names,
file paths and annotations are user-controlled text, and the report is opened
in a browser (and inside notebooks) where unescaped text would run as markup.

Tables are sortable by clicking a header, with a few lines of inline vanilla
JavaScript (``SORT_JS``): the report must work offline and inside a sandboxed
iframe, so no library and no network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

from ..model import OpDisplay

SORT_JS = """
document.querySelectorAll("table.tl-sort").forEach(function (t) {
  t.querySelectorAll("thead th").forEach(function (th, i) {
    th.addEventListener("click", function () {
      var asc = th.getAttribute("data-dir") !== "asc";
      t.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("data-dir"); });
      th.setAttribute("data-dir", asc ? "asc" : "desc");
      var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[i], y = b.cells[i], vx = x.getAttribute("data-v"), vy = y.getAttribute("data-v");
        var r = (vx !== null && vy !== null) ? Number(vx) - Number(vy)
                                             : x.textContent.localeCompare(y.textContent);
        return asc ? r : -r;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""

DEFAULT_TOP = 20


def fmt_us(value: Any) -> str:
    """A duration in µs for people: 950 µs, 12.3 ms, 1.25 s."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    v = float(value)
    if abs(v) < 1e3:
        return f"{v:,.1f} µs"
    if abs(v) < 1e6:
        return f"{v / 1e3:,.2f} ms"
    return f"{v / 1e6:,.3f} s"


def fmt_flops(value: Any) -> str:
    """A FLOP count with an SI prefix; blank when the trace has none."""
    if value is None or not math.isfinite(float(value)) or float(value) <= 0:
        return ""
    v = float(value)
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:,.2f} {unit}FLOP"
    return f"{v:,.0f} FLOP"


def fmt_int(value: Any) -> str:
    return f"{int(value):,}"


@dataclass(frozen=True)
class Column:
    """One table column: DataFrame key, header, cell formatter, numeric sort."""

    key: str
    label: str
    fmt: Callable[[Any], str] = str
    numeric: bool = True


def html_table(
    rows: Iterable[Mapping[str, Any]], columns: list[Column], css_class: str = ""
) -> str:
    """A sortable table; numeric cells carry their raw value in ``data-v``."""
    head = "".join(
        f'<th title="click to sort">{escape(c.label)}</th>' for c in columns
    )
    body = []
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c.key)
            if value is None:
                cells.append('<td class="num" data-v="-1e308"></td>' if c.numeric
                             else "<td></td>")
            elif c.numeric:
                # float() has accepted the value, so its formatted text is
                # digits and units: nothing to escape (thousands of cells).
                raw = float(value)
                sort_v = repr(raw) if math.isfinite(raw) else "-1e308"
                cells.append(f'<td class="num" data-v="{sort_v}">{c.fmt(value)}</td>')
            else:
                cells.append(f"<td>{escape(c.fmt(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    classes = escape(f"tl-sort {css_class}".strip())
    return (
        f'<table class="{classes}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def op_columns(display: OpDisplay, has_gpu: bool) -> list[Column]:
    """The op table's columns as chosen by the profile's display options and the trace."""
    cols = [
        Column("name", "op", str, numeric=False),
        Column("calls", "calls", fmt_int),
        Column("self_cpu_us", "self CPU", fmt_us),
        Column("total_cpu_us", "total CPU", fmt_us),
    ]
    if has_gpu:
        cols += [Column("device_us", "device time", fmt_us), Column("kernels", "kernels", fmt_int)]
    if display.shapes:
        cols.append(Column("input_shapes", "input shapes", str, numeric=False))
    if display.flops:
        cols.append(Column("flops", "FLOPs", fmt_flops))
    if display.stack:
        cols.append(Column("stack", "source (your code)", str, numeric=False))
    return cols


def op_table_html(ops: Any, shown: Any, display: OpDisplay, has_gpu: bool) -> str:
    """The ``shown`` rows (``TraceView.top_ops``) of the op table ``ops`` as ``display`` asks."""
    cols = [c for c in op_columns(display, has_gpu) if c.key in shown.columns]
    note = ""
    if display.stack and not any(shown.get("stack", [])):
        note = ('<p class="note">No op was issued from your own code in a recorded '
                "Python stack (with_stack records python_function events).</p>")
    caption = f'<p class="note">Top {len(shown)} of {len(ops)} ops; click a header to sort.</p>'
    return caption + html_table(shown.to_dict("records"), cols, "ops") + note


KERNEL_COLUMNS = [
    Column("name", "kernel", str, numeric=False),
    Column("calls", "calls", fmt_int),
    Column("total_us", "total", fmt_us),
    Column("mean_us", "mean", fmt_us),
    Column("max_us", "max", fmt_us),
    Column("streams", "streams", str, numeric=False),
    Column("is_comm", "communication", lambda v: "yes" if v else "", numeric=False),
]


def kernel_table_html(kernels: Any, top: int = DEFAULT_TOP) -> str:
    """The kernels taking most GPU time (an ``ops.kernel_table`` DataFrame)."""
    shown = kernels.sort_values("total_us", ascending=False, kind="stable").head(top)
    cols = [c for c in KERNEL_COLUMNS if c.key in shown.columns]
    caption = f'<p class="note">Top {len(shown)} of {len(kernels)} kernels by total time.</p>'
    return caption + html_table(shown.to_dict("records"), cols, "kernels")


STEP_COLUMNS = [
    Column("step", "step", str, numeric=False),
    Column("dur_us", "step time", fmt_us),
    Column("kernel_us", "kernel", fmt_us),
    Column("memcpy_us", "memcpy", fmt_us),
    Column("memset_us", "memset", fmt_us),
    Column("runtime_us", "runtime", fmt_us),
    Column("dataloader_us", "dataloader", fmt_us),
    Column("cpu_exec_us", "CPU exec", fmt_us),
    Column("other_us", "other", fmt_us),
    Column("comm_us", "communication", fmt_us),
]


def step_table_html(steps: Any) -> str:
    """Per-step time breakdown (TensorBoard profiler plugin definitions)."""
    cols = [c for c in STEP_COLUMNS if c.key in steps.columns]
    note = (
        '<p class="note">Per ProfilerStep: time in GPU kernels, memcpy, memset, CUDA '
        "runtime, DataLoader, CPU-only execution and other, as the TensorBoard profiler "
        "overview defines them; communication kernels are counted apart.</p>"
    )
    return note + html_table(steps.to_dict("records"), cols, "steps")


def _field(hint: Any, name: str) -> Any:
    return hint.get(name) if isinstance(hint, Mapping) else getattr(hint, name, None)


def hints_html(hints: list[Any]) -> str:
    """Plain-language hints, most severe first as analysis ordered them."""
    if not hints:
        return '<p class="note">No known problem found in this trace.</p>'
    items = []
    for h in hints:
        severity = escape(str(_field(h, "severity") or "info"))
        evidence = _field(h, "evidence")
        items.append(
            f'<li class="hint {severity}"><b>{escape(str(_field(h, "title") or ""))}</b> '
            f'<span class="sev">[{severity}]</span><br>{escape(str(_field(h, "detail") or ""))}'
            + (f'<div class="evidence">{value_html(evidence)}</div>' if evidence else "")
            + "</li>"
        )
    return f'<ul class="hints">{"".join(items)}</ul>'


def value_html(value: Any) -> str:
    """Any JSON-like value as escaped HTML (nested dicts become definition lists)."""
    if isinstance(value, Mapping):
        if not value:
            return '<span class="note">none</span>'
        rows = "".join(
            f"<tr><th>{escape(str(k))}</th><td>{value_html(v)}</td></tr>"
            for k, v in value.items()
        )
        return f'<table class="kv">{rows}</table>'
    if isinstance(value, (list, tuple)):
        if not value:
            return '<span class="note">none</span>'
        return "<ul>" + "".join(f"<li>{value_html(v)}</li>" for v in value) + "</ul>"
    if value is None:
        return '<span class="note">n/a</span>'
    return escape(str(value))


def environment_html(environment: Mapping[str, Any]) -> str:
    """Where the profile was taken, so two runs can be compared honestly."""
    if not environment:
        return '<p class="note">No environment was recorded with this profile.</p>'
    return value_html(environment)


def unmeasured_html(unmeasured: list[str]) -> str:
    """What could not be measured on the capturing machine, said plainly."""
    items = "".join(f"<li>{escape(str(u))}</li>" for u in unmeasured)
    return f'<p>Could not be measured on this machine:</p><ul class="unmeasured">{items}</ul>'


def error_html(error: Mapping[str, Any]) -> str:
    """The exception that ended the profiled cell (what was captured is above)."""
    head = escape(": ".join(str(error[k]) for k in ("type", "message") if error.get(k)))
    tb = error.get("traceback")
    rest = {k: v for k, v in error.items() if k not in ("type", "message", "traceback")}
    return (
        f'<p class="error">The profiled code raised {head or "an exception"}.</p>'
        + (f"<pre>{escape(str(tb))}</pre>" if tb else "")
        + (value_html(rest) if rest else "")
    )

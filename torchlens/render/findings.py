"""A ``Finding`` drawn the one way every view draws it: as text
(``finding_text``) and as HTML (``finding_html``, ``findings_html``).

Text, one line: ``[severity] title: sentence; advice`` (the severity and
title only when the finding has a title: a hint, a checklist line, an OOM;
the advice only when something is wrong or worth knowing, not for what passed
or does not apply, so a checklist's quiet lines stay short; an untitled
finding that is wrong is ``str(finding)``, what ``--json`` and the public
string APIs give). HTML: the same parts, the advice as ``what to do`` on a line of its
own and the figures as one grey line under it (``name value``, each
formatted by its unit). A plain string (a verdict saved by an older
torchlens) is drawn as an untitled finding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from markupsafe import Markup

from torchlens.model.findings import (
    FAILED,
    INFO,
    NA,
    PASSED,
    WARNING,
    Figure,
    Finding,
    as_finding,
)
from torchlens.model.units import (
    MISSING,
    format_bytes,
    format_count,
    format_duration,
    format_percent,
)
from torchlens.render import html

#: the colour of each severity (inline: the HTML also goes into Bokeh Divs and
#: widgets): the one map every view draws a status with, so one status has one
#: colour everywhere (a slow rank's warning is never a rank's line colour)
COLORS = {FAILED: "#b00", WARNING: "#b35900", INFO: "#333", PASSED: "#1a7f37", NA: "#777"}
#: the severities whose colour says something (``finding_html``'s ``color`` cannot change it)
STATUS_COLORED = (FAILED, WARNING, PASSED)
_SUFFIXES = ("_us", "_ms", "_pct", "_bytes")


def figure_name(fig: Figure) -> str:
    """``largest_gap_us`` -> ``largest gap`` (the unit says what the suffix said)."""
    name = fig.name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.replace("_", " ")


def _value(value: Any, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_value(v, unit)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_value(v, unit) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    # the rules the sentences use, so a figure line never gives its sentence's
    # number a second value ("768.1 µs" in both, not "0.8 ms" under it)
    formats = {"B": format_bytes, "µs": format_duration,
               "ms": lambda v: format_duration(1e3 * v),
               "share": lambda v: format_percent(100 * v), "%": format_percent,
               "x": lambda v: f"{v:,.1f}x"}
    if unit in formats:
        return formats[unit](value)
    number = (format_count(value) if isinstance(value, int) or float(value).is_integer()
              else f"{value:,.3g}")
    return f"{number} {unit}".rstrip()


def figure_text(fig: Figure) -> str:
    """One figure's value as people read it: bytes, durations and shares in
    their units, counts with thousands separators."""
    return _value(fig.value, fig.unit)


def finding_text(finding: Finding | str) -> str:
    """The text form (module docstring)."""
    f = as_finding(finding)
    assert f is not None
    quiet = f.severity in (PASSED, NA)
    return (f"[{f.severity}] {f.title}: " if f.title else "") + (f.sentence if quiet else str(f))


def finding_html(finding: Finding | str, color: str | None = None,
                 figures: bool = True) -> Markup:
    """The HTML form (module docstring); ``color``: the sentence's colour for
    a finding whose severity says nothing by colour (info, not applicable);
    a failed, warning or passed finding is drawn in its severity's colour
    whatever ``color`` says; ``figures``: False where the view tables them
    itself."""
    f = as_finding(finding)
    assert f is not None
    shown = [(figure_name(x), figure_text(x)) for x in f.figures] if figures else []
    own = COLORS.get(f.severity, "#333")
    return html.render("finding.html.j2", f=f, figures=shown,
                       color=own if f.severity in STATUS_COLORED or not color else color,
                       severity_color=COLORS.get(f.severity, "#333"))


def findings_html(findings: list[Finding] | list[str], empty: str = "") -> Markup:
    """Findings in the order analysis gave them; ``empty`` when there are none."""
    if not findings:
        return html.note(empty) if empty else Markup("")
    return html.join([finding_html(f) for f in findings])

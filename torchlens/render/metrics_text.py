"""Prometheus's text exposition format 0.0.4, from ``analysis.ranks.metrics``'s families.

Label values are escaped as the format says (backslash, double quote, line
feed), so a host name cannot break a line or forge a label; HELP text
likewise (backslash, line feed). A family without samples is left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from torchlens.analysis.ranks.metrics import Family

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


def exposition(families: Iterable[Family]) -> str:
    """The families as one scrape's body."""
    lines = []
    for f in families:
        if not f.samples:
            continue
        lines.append(f"# HELP {f.name} {_escape_help(f.help)}")
        lines.append(f"# TYPE {f.name} {f.kind}")
        for suffix, labels, value in f.samples:
            inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{f.name}{suffix}{{{inner}}} {_value(value)}")
    return "\n".join(lines) + "\n"

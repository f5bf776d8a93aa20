"""The status block of ``torchlens.watch``: the run's verdict and one row per rank.

Drawn from a live frame's ``status`` (``analysis.ranks.verdict.live_status``):
numbers are only formatted here. The same HTML sits above the live view
while the run goes on and is left in the notebook as its static copy when
the watch ends (widgets are not saved with a notebook). Host names, errors
and the verdict came from the ranks: the template escapes them.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from torchlens.analysis.ranks.crash import error_words
from torchlens.model.findings import INFO, SEVERITIES, as_finding
from torchlens.model.units import MISSING, format_ms
from torchlens.render import html
from torchlens.render.findings import finding_html
from torchlens.render.ranks.terminal import (
    memory_cell,
    more_ranks_line,
    restart_line,
    rows_in_order,
)

LABELS = ("rank", "node", "host", "state", "steps", "step ms", "data ms", "memory")
#: rows of the table at most; the live view below draws as many ranks (SHOWN_RANKS)
STATUS_ROWS = 16
STATE_COLORS = {"running": "#2ca02c", "ended": "#555", "stopped": "#b00", "waiting": "#777"}


def _more(status: dict[str, Any], shown: int) -> str:
    hidden = len(status.get("ranks") or []) - shown
    return more_ranks_line(hidden, status.get("spread")) if hidden > 0 else ""


def status_rows(status: dict[str, Any], max_rows: int = STATUS_ROWS) -> list[dict[str, Any]]:
    """The table's rows (text cells) and which one is the slow rank."""
    out = []
    ranks = [r for r in status.get("ranks") or [] if isinstance(r, dict)]
    said = error_words(ranks)  # a peer's closed connection in the terminal's words
    for row in rows_in_order(ranks, status.get("order"), max_rows):
        state = str(row.get("state") or MISSING)
        if row.get("error"):
            state = f"{state} ({said[row.get('rank')][:80]})"
        out.append({"slow": bool(row.get("slow")), "cells": [
            str(row.get("rank")), MISSING if row.get("node") is None else str(row["node"]),
            str(row.get("host") or MISSING), state, f"{row.get('steps') or 0:,}",
            format_ms(row.get("step_ms"), unit=False),
            format_ms(row.get("data_ms"), unit=False), memory_cell(row)]})
    return out


def _verdict(status: dict[str, Any]) -> Markup:
    """The verdict as a finding: its line (sentence and advice) and, in a live
    status, its severity (a run folder's manifest has the line alone)."""
    said = status.get("verdict")
    severity = status.get("severity")
    return finding_html(as_finding(str(said), severity if severity in SEVERITIES else INFO)
                        ) if said else Markup("")


def status_html(source: str, state: str, status: dict[str, Any] | None,
                facts: str = "", notes: list[str] | tuple[str, ...] = ()) -> Markup:
    """The block: ``source`` (what is watched), ``state`` (``running``, ``ended``,
    ``stopped``, ``waiting``: coloured), the verdict (``render.findings``),
    ``notes`` and the rank table."""
    status = status or {}
    rows = status_rows(status)
    notes = [*notes, *(str(n) for n in status.get("notes") or []),
             *(f"lost: {w}" for w in status.get("lost") or []),
             *(restart_line(r.get("number"), str(r.get("words") or ""))
               for r in status.get("restarts") or [] if isinstance(r, dict))]
    return html.render("watch_status.html.j2", source=source, state=state,
                       state_color=STATE_COLORS.get(state.split(" ")[0], "#333"), facts=facts,
                       verdict=_verdict(status), notes=notes, labels=LABELS,
                       rows=rows, more=_more(status, len(rows)))


def note_html(text: str) -> Markup:
    """One quiet line in place of the block (the final status is shown elsewhere)."""
    return Markup('<div style="color:#666;font-style:italic">{}</div>').format(text)


def status_text(source: str, state: str, status: dict[str, Any] | None, facts: str = "") -> str:
    """One line for ``text/plain`` (a terminal, or a front end without widgets)."""
    status = status or {}
    verdict = status.get("verdict")
    return (f"torchlens.watch {source}: {state}" + (f" ({facts})" if facts else "")
            + (f"; verdict: {verdict}" if verdict else ""))

"""The status block of ``torchlens.watch``: the run's verdict and one row per rank.

Drawn from a live frame's ``status`` (``analysis.ranks.verdict.live_status``):
numbers are only formatted here. The same HTML sits above the live view
while the run goes on and is left in the notebook as its static copy when
the watch ends (widgets are not saved with a notebook). Host names, errors
and the verdict came from the ranks: the template escapes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup

from torchlens.analysis.ranks.crash import error_words
from torchlens.analysis.ranks.verdict import LiveStatus
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


@dataclass(frozen=True)
class StatusRow:
    """One row of the table: its text cells, and whether it is the slow rank."""

    slow: bool
    cells: list[str]


def _more(status: LiveStatus, shown: int) -> str:
    hidden = len(status.ranks) - shown
    return more_ranks_line(hidden, status.spread or None) if hidden > 0 else ""


def status_rows(status: LiveStatus, max_rows: int = STATUS_ROWS) -> list[StatusRow]:
    """The table's rows (text cells) and which one is the slow rank."""
    out = []
    said = error_words(status.ranks)  # a peer's closed connection in the terminal's words
    for row in rows_in_order(status.ranks, status.order or None, max_rows):
        state = str(row.state or MISSING)
        if row.error:
            state = f"{state} ({said[row.rank][:80]})"
        out.append(StatusRow(row.slow, [
            str(row.rank), MISSING if row.node is None else str(row.node),
            str(row.host or MISSING), state, f"{row.steps or 0:,}",
            format_ms(row.step_ms, unit=False), format_ms(row.data_ms, unit=False),
            memory_cell(row)]))
    return out


def _verdict(status: LiveStatus) -> Markup:
    """The verdict as a finding: its line (sentence and advice) and, in a live
    status, its severity (a run folder's manifest has the line alone)."""
    finding = status.verdict_finding()
    return finding_html(finding) if finding is not None else Markup("")


def status_html(source: str, state: str, status: LiveStatus | None,
                facts: str = "", notes: list[str] | tuple[str, ...] = ()) -> Markup:
    """The block: ``source`` (what is watched), ``state`` (``running``, ``ended``,
    ``stopped``, ``waiting``: coloured), the verdict (``render.findings``),
    ``notes`` and the rank table."""
    status = status or LiveStatus()
    rows = status_rows(status)
    notes = [*notes, *status.notes, *(f"lost: {w}" for w in status.lost),
             *(restart_line(r.number, r.words) for r in status.restarts)]
    return html.render("watch_status.html.j2", source=source, state=state,
                       state_color=STATE_COLORS.get(state.split(" ")[0], "#333"), facts=facts,
                       verdict=_verdict(status), notes=notes, labels=LABELS,
                       rows=rows, more=_more(status, len(rows)))


def note_html(text: str) -> Markup:
    """One quiet line in place of the block (the final status is shown elsewhere)."""
    return Markup('<div style="color:#666;font-style:italic">{}</div>').format(text)


def status_text(source: str, state: str, status: LiveStatus | None, facts: str = "") -> str:
    """One line for ``text/plain`` (a terminal, or a front end without widgets)."""
    verdict = status.verdict if status is not None else None
    return (f"torchlens.watch {source}: {state}" + (f" ({facts})" if facts else "")
            + (f"; verdict: {verdict}" if verdict else ""))

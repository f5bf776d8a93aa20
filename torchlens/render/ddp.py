"""The %ddp_check report: checklist, per-rank figures and tables, stacks, logs.

Reads only the Profile (``extra["ddp"]`` records and the ``heartbeats`` and
``collectives`` tables), so a saved ``.tlprof`` renders the same report on a
machine without torch. Every string from the workers (file paths, exception
messages, stacks, logs) is escaped.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from ..analysis import ddp as ddp_analysis
from ..analysis.collectives import describe_collective
from ..model import Profile
from . import tables
from .live import rank_figures
from .tables import Column

MAX_COLLECTIVE_ROWS = 400
_STATUS_STYLE = {"passed": "color:#1a7f37", "failed": "color:#b00;font-weight:600",
                 "not applicable": "color:#777"}


def records(profile: Profile) -> dict[str, Any]:
    """The run's records with the heartbeats put back from their table."""
    rec = dict(profile.extra.get("ddp") or {})
    if "heartbeats" in profile.tables:
        rec["heartbeats"] = [
            {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
            for row in profile.tables["heartbeats"].to_pandas().to_dict("records")]
    return rec


def checklist_html(items: list[ddp_analysis.CheckItem]) -> str:
    rows = []
    for it in items:
        style = _STATUS_STYLE.get(it.status, "")
        rows.append(f'<tr><td style="{style}">{escape(it.status)}</td><th>{escape(it.name)}</th>'
                    f"<td>{escape(it.evidence)}</td><td>{escape(it.advice)}</td></tr>")
    return ('<table class="checklist"><thead><tr><th>status</th><th>check</th><th>evidence</th>'
            f"<th>what to do</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _rank_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    codes = rec.get("exit_codes") or []
    for r in range(int(rec.get("world_size") or 0)):
        res = (rec.get("ranks") or [None] * (r + 1))[r] or {}
        peak = (rec.get("memory_peak") or [{}] * (r + 1))[r] or {}
        steps = [s for s in res.get("steps") or [] if s.get("end")]
        err = res.get("error") or {}
        out.append({
            "rank": r, "pid": res.get("pid"), "device": res.get("device", ""),
            "exit": "killed" if r in (rec.get("killed") or []) else
                    ("" if r >= len(codes) or codes[r] is None else str(codes[r])),
            "collectives": len((rec.get("fingerprints") or [[]] * (r + 1))[r] or []),
            "steps_s": sum(s["end"] - s["start"] for s in steps) if steps else None,
            "rss": peak.get("rss"), "tensor": peak.get("tensor_bytes"),
            "error": f"{err.get('type')}: {err.get('message')}" if err else ""})
    return out


def _mib(v: Any) -> str:
    return f"{float(v) / (1 << 20):,.1f} MiB"


RANK_COLUMNS = [Column("rank", "rank", str), Column("pid", "pid", str),
                Column("device", "device", str, False), Column("exit", "exit", str, False),
                Column("collectives", "collectives", tables.fmt_int),
                Column("steps_s", "step time", lambda v: f"{v:.3f} s"),
                Column("rss", "peak RSS", _mib), Column("tensor", "peak tensor bytes", _mib),
                Column("error", "error", str, False)]
COLLECTIVE_COLUMNS = [Column("rank", "rank", str), Column("index", "#", str),
                      Column("op", "op", str, False), Column("tensors", "tensors", str, False),
                      Column("line", "issued at", str, False),
                      Column("call_ms", "call", lambda v: f"{v:.3f} ms")]


def _collective_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r, fps in enumerate(rec.get("fingerprints") or []):
        for fp in (fps or [])[:MAX_COLLECTIVE_ROWS]:
            tensors = describe_collective({**fp, "line": "", "op": ""})
            rows.append({"rank": r, "index": fp.get("index"), "op": fp.get("op"),
                         "tensors": tensors.split(" ", 1)[-1].strip(), "line": fp.get("line"),
                         "call_ms": None if fp.get("call_s") is None else fp["call_s"] * 1e3})
    return rows


def _pre_blocks(title: str, texts: list[str]) -> str:
    blocks = [f"<details><summary>rank {r}</summary><pre>{escape(t)}</pre></details>"
              for r, t in enumerate(texts) if t]
    return f"<p>{escape(title)}</p>" + "".join(blocks) if blocks else ""


def sections(profile: Profile, figures: list[Any]) -> list[tuple[str, str, str]]:
    """(title, html, anchor) of each report section."""
    rec = records(profile)
    items = ddp_analysis.checklist(rec)
    out = [("Checklist", checklist_html(items), "checklist")]
    hang = rec.get("hang") or {}
    extra = _pre_blocks("Python stack of each rank when the hang was detected:",
                        hang.get("stacks") or [])
    crash = next((i for i in items if i.name == "crashed worker" and i.status == "failed"), None)
    if crash and crash.details.get("traceback"):
        extra += f"<p>Traceback of the first failing rank:</p><pre>{escape(crash.details['traceback'])}</pre>"
    if extra:
        out.append(("Stacks and tracebacks", extra, "stacks"))
    heartbeats = rec.get("heartbeats") or []
    if heartbeats:
        figures.append(rank_figures(heartbeats, int(rec.get("world_size") or 1),
                                    rec.get("fingerprints"), float(rec.get("t0") or 0.0)))
        out.append(("Per-rank memory, collectives and timeline",
                    f"<!--bokeh-{len(figures) - 1}-->", "ranks-plot"))
    out.append(("Ranks", tables.html_table(_rank_rows(rec), RANK_COLUMNS), "ranks"))
    coll = _collective_rows(rec)
    if coll:
        out.append(("Collectives", tables.html_table(coll, COLLECTIVE_COLUMNS), "collectives"))
    logs = [(res or {}).get("log", "") for res in rec.get("ranks") or []]
    if any(logs):
        out.append(("Worker output", _pre_blocks("Last lines each rank printed:", logs), "logs"))
    out.append(("Environment (kernel)", tables.environment_html(profile.environment),
                "environment"))
    return out


def summary_text(profile: Profile) -> str:
    rec = records(profile)
    return ddp_analysis.summary(ddp_analysis.checklist(rec), rec)


def ddp_text(profile: Profile) -> str:
    """The text/plain view: summary and one line per check."""
    rec = records(profile)
    items = ddp_analysis.checklist(rec)
    lines = [ddp_analysis.summary(items, rec)]
    for it in items:
        lines.append(f"[{it.status}] {it.name}: {it.evidence}")
        if it.status == "failed" and it.advice:
            lines.append(f"    what to do: {it.advice}")
    return "\n".join(lines)


def report_parts(profile: Profile, figures: list[Any]) -> tuple[str, list[str]]:
    """Summary line and sections of a ddp_check report (``report.render_body``)."""
    from .report import _section

    return summary_text(profile), [_section(t, body, anchor)
                                   for t, body, anchor in sections(profile, figures)]

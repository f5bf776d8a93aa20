"""The registry of result kinds: for each, how it is analysed, drawn, told in
text and written to files. The report, the display bundle, ``repr`` and
``export`` all dispatch through ``KINDS``; adding a kind is one entry here
(beside its payload in ``model.payloads``, its analysis and its render module).

Each function below takes the analysis when the caller has one (a result
object keeps its own), and makes it otherwise.

Entries name their functions as ``"module:function"`` strings, imported on
first use: asking for numbers (``analyze``) must not import Bokeh, and a
``.pickle`` export must not import the HTML renderer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from torchlens.model import InputError, Profile


@dataclass(frozen=True)
class Kind:
    """How one kind of Profile is analysed and shown.

    ``analyze(profile) -> analysis``; ``report(profile, analysis, figures) ->
    (summary line, [section Markup])``; ``text(profile, analysis) -> str``;
    ``summary(profile, analysis) -> str``; ``exports`` maps a file suffix to
    ``write(profile, analysis, path) -> str`` beyond the ``.html`` report and
    the ``.tlprof`` file every kind has.
    """

    analyze: str
    report: str
    text: str
    summary: str
    exports: dict[str, str] = field(default_factory=dict)


_TRACE_EXPORTS = {".json": "torchlens.frontends.export:write_trace",
                  ".json.gz": "torchlens.frontends.export:write_trace"}
_TRACE = Kind(analyze="torchlens.analysis.trace.analyze:analyze",
              report="torchlens.render.trace.report:report_parts",
              text="torchlens.render.trace.text:text_report",
              summary="torchlens.render.trace.text:summary_line",
              exports=_TRACE_EXPORTS)

KINDS: dict[str, Kind] = {
    "torchprof": _TRACE,
    "trace": _TRACE,
    "gpumem": Kind(analyze="torchlens.analysis.memory.analyze:analyze",
                   report="torchlens.render.memory.report:report_parts",
                   text="torchlens.render.memory.report:text_report",
                   summary="torchlens.render.memory.report:summary_line",
                   exports={".pickle": "torchlens.frontends.export:write_snapshot"}),
    "ddp_check": Kind(analyze="torchlens.analysis.ddp.analyze:analyze",
                      report="torchlens.render.ddp.report:report_parts",
                      text="torchlens.render.ddp.report:text_report",
                      summary="torchlens.render.ddp.report:summary_line",
                      exports={"/": "torchlens.frontends.export:write_run_folder"}),
    "run": Kind(analyze="torchlens.analysis.runs.analyze:analyze",
                report="torchlens.render.runs.report:report_parts",
                text="torchlens.render.runs.report:text_report",
                summary="torchlens.render.runs.report:summary_line"),
    "diff": Kind(analyze="torchlens.analysis.runs.diff:analyze",
                 report="torchlens.render.runs.diff:report_parts",
                 text="torchlens.render.runs.diff:text_report",
                 summary="torchlens.render.runs.diff:summary_line"),
    "memdiff": Kind(analyze="torchlens.analysis.memory.diff:analyze",
                    report="torchlens.render.memory.diff:report_parts",
                    text="torchlens.render.memory.diff:text_report",
                    summary="torchlens.render.memory.diff:summary_line"),
    "memranks": Kind(analyze="torchlens.analysis.memory.ranks:analyze",
                     report="torchlens.render.memory.ranks:report_parts",
                     text="torchlens.render.memory.ranks:text_report",
                     summary="torchlens.render.memory.ranks:summary_line"),
}


def _resolve(ref: str) -> Any:
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def kind_of(profile: Profile) -> Kind:
    return KINDS[profile.kind]


def analyze(profile: Profile) -> Any:
    """The kind's analysis of ``profile`` (callers keep it: it is not cached here)."""
    return _resolve(kind_of(profile).analyze)(profile)


def _or_analyze(profile: Profile, analysis: Any) -> Any:
    return analyze(profile) if analysis is None else analysis


def summary(profile: Profile, analysis: Any = None) -> str:
    """The one-line summary (``repr`` of a result, the report's header line)."""
    return _resolve(kind_of(profile).summary)(profile, _or_analyze(profile, analysis))


def text(profile: Profile, analysis: Any = None) -> str:
    """The text/plain view."""
    return _resolve(kind_of(profile).text)(profile, _or_analyze(profile, analysis))


def report_html(profile: Profile, analysis: Any = None, packed: bool = False) -> str:
    """The self-contained HTML report (``packed``: BokehJS gzipped, for notebooks)."""
    from torchlens.render.page import render_report

    return render_report(profile, _or_analyze(profile, analysis),
                         _resolve(kind_of(profile).report), packed)


def display_bundle(profile: Profile, analysis: Any = None) -> dict[str, str]:
    """``{"text/html": ..., "text/plain": ...}`` for IPython's ``display``: the
    report with BokehJS packed (each notebook output carries its own copy)."""
    from torchlens.render.bundle import iframe_html

    analysis = _or_analyze(profile, analysis)
    return {"text/html": iframe_html(report_html(profile, analysis, packed=True)),
            "text/plain": text(profile, analysis)}


#: Every kind writes these; ``Kind.exports`` adds its own.
COMMON_EXPORTS = {
    ".html": "self-contained HTML report (opens with no network)",
    ".tlprof": "saved torchlens result (re-render later with `torchlens report`)",
}
EXPORT_FORMATS = {
    **COMMON_EXPORTS,
    ".json": "Chrome/Perfetto trace (Kineto JSON as the profiler wrote it)",
    ".json.gz": "Chrome/Perfetto trace, gzipped",
    ".pickle": ("allocator snapshot in torch's format (memory_viz, torch.cuda._memory_viz); "
                "torchlens reopens it with the live figures"),
    "/": "the run folder of a --profile run (a path ending in /): every rank's traces, "
         "step records and manifest, plus the result itself",
}


def export_suffixes(kind: str) -> list[str]:
    """The file suffixes a result of ``kind`` can be written to."""
    return [*COMMON_EXPORTS, *KINDS[kind].exports]


def exporter(profile: Profile, suffix: str) -> Any:
    """``write(profile, analysis, path)`` for a kind-specific suffix."""
    ref = kind_of(profile).exports.get(suffix)
    if ref is None:
        raise InputError(f"a {profile.kind} result cannot be written as {suffix}; use one of "
                         + ", ".join(export_suffixes(profile.kind)))
    return _resolve(ref)

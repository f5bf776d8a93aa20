"""Compiled code in a profile: time per compiled region, graph breaks, recompiles.

Two sources, each said where it is shown:

- the profiler's events: torch wraps each call of code dynamo made in a
  ``Torch-Compiled Region: F/C`` range (frame F, its C-th compile), so the
  time per region and the eager time between regions are measured;
- torch's compile records (``model.compiled.CompileLog``, read by
  ``capture.trace.compiled``): which function each region is, how long each
  compile took, the reason of each graph break and the guard whose failure
  made each recompile.

A graph break's place: dynamo goes on after a break in a new function,
``torch_dynamo_resume_in_<fn>_at_<line>``, whose first line is the line the
break was on; so a compile that restarted for a break reason is paired with
the next such function of its file. A break dynamo met on a frame it had
compiled before the capture began has no compile of its own in the capture:
its reason and count are still shown, its line as not known.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from torchlens.formats.locations import CellNames, is_cell, location_label
from torchlens.model import Trace
from torchlens.model.compiled import CompiledFrame, CompileLog
from torchlens.model.findings import GRAPH_BREAK, INFO, WARNING, Figure, Finding
from torchlens.model.units import format_duration, plural

REGION = re.compile(r"^Torch-Compiled Region: (\d+/\d+)$")
GUARD_OF = re.compile(r"^\d+/\d+: ")
#: a guard on a tensor's size (torch's words: "size mismatch", "x.size()[0]")
SIZE_GUARD = re.compile(r"size mismatch|\.size\(\)|stride mismatch|numel")
#: a failed guard's words in a sentence (torch's full text stays in the details)
GUARD_CHARS = 200
RESUME_PREFIX = "torch_dynamo_resume_in_"
#: compile time above this share of the cell's wall time is a finding
COMPILE_SHARE = 0.5
RECOMPILE, COMPILE_TIME = "recompile", "compile_time"


@dataclass(frozen=True)
class Region:
    """One compiled region's calls and time (the profiler's ranges)."""

    compile_id: str
    function: str  # the frame compiled ("forward"), or "" if the records do not say
    where: str  # "model.py:15", or ""
    calls: int
    total_us: float


@dataclass(frozen=True)
class GraphBreak:
    """One graph-break reason: its first line, torch's hint, where, how often."""

    reason: str
    hint: str
    function: str
    where: str  # "model.py:17", or "" (not known: see the module docstring)
    count: int
    file: str = ""  # the path of ``where``


@dataclass(frozen=True)
class Recompile:
    """A compile made because a guard failed (``compile_id`` C > 0)."""

    compile_id: str
    function: str
    where: str
    guard: str  # torch's recompile reason: the guard that failed
    compile_s: float | None
    file: str = ""  # the path of ``where``


@dataclass
class CompiledCode:
    """What a profile's compiled code cost and why it was compiled as it was."""

    regions: list[Region] = field(default_factory=list)
    region_us: float = 0.0  # time inside compiled regions (their union, per thread)
    eager_us: float = 0.0  # time between the first and last region outside any
    compiles: int = 0
    compile_s: float = 0.0
    wall_s: float | None = None
    graphs: int = 0
    breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    failed: list[CompiledFrame] = field(default_factory=list)
    lost: int = 0
    measured: str = ""  # where the region times came from
    recorded: str = ""  # where the compile figures came from

    @property
    def findings(self) -> list[Finding]:
        """Graph breaks, recompiles and a cell that mostly compiled, most severe first."""
        out = [_break_finding(b) for b in self.breaks]
        out += [_recompile_finding(r) for r in self.recompiles]
        if self.wall_s and self.compile_s >= COMPILE_SHARE * self.wall_s:
            out.append(Finding(
                INFO, f"torch.compile took {format_duration(self.compile_s * 1e6)} of the "
                f"cell's {format_duration(self.wall_s * 1e6)} "
                f"({plural(self.compiles, 'compile')}): the figures are mostly compiling, "
                "not running.",
                (Figure("compile_s", self.compile_s, "s"), Figure("wall_s", self.wall_s, "s"),
                 Figure("compiles", self.compiles)),
                "Profile a later call of the compiled code (its compiles are cached) to "
                "see what it costs to run.", "compile time", code=COMPILE_TIME))
        return out


def _short(path: str) -> str:
    return os.path.basename(path) if path else ""


def _where(file: str, line: int, cells: CellNames | None = None) -> str:
    """``net.py:41``; a notebook cell's code as ``cell [N] line L`` (``cells``: the
    shell's cell file names, ``TorchprofPayload.cells``)."""
    if file and is_cell(file):
        return location_label(file, line, cells)
    return f"{_short(file)}:{line}" if file and line else _short(file)


def _function(name: str) -> str:
    """A resume function as what it continues: ``forward, after a graph break``."""
    if name.startswith(RESUME_PREFIX):
        inner = name[len(RESUME_PREFIX):].rsplit("_at_", 1)[0]
        return f"{inner}, after a graph break"
    return name


def _reason_parts(reason: str) -> tuple[str, str]:
    """A break reason's first line, and torch's ``Hint:`` line if it gives one."""
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else reason
    hint = next((ln[len("Hint:"):].strip() for ln in lines if ln.startswith("Hint:")), "")
    return first, hint


def _region_times(trace: Trace | None) -> tuple[dict[str, tuple[int, float]], float, float]:
    """Calls and time per region id; the regions' union time; the eager time
    between the first and last region, on the threads that ran regions."""
    if trace is None or len(trace.events) == 0:
        return {}, 0.0, 0.0
    ev = trace.events
    # matched once per distinct name, not per event: a trace has millions
    region_of = {code: m.group(1) for code, name in enumerate(ev.categories["name"])
                 if (m := REGION.match(name)) is not None}
    if not region_of:
        return {}, 0.0, 0.0
    rows = np.isin(ev["name"], list(region_of))
    ts, dur, tid = ev["ts"][rows], ev["dur"][rows], ev["tid"][rows]
    per: dict[str, list[float]] = {}
    for code, d in zip(ev["name"][rows], dur, strict=True):
        per.setdefault(region_of[int(code)], []).append(float(d))
    inside = between = 0.0
    for t in np.unique(tid):
        on = tid == t
        starts, ends = ts[on], ts[on] + dur[on]
        order = np.argsort(starts)
        starts, ends = starts[order], ends[order]
        covered, reach = 0.0, -np.inf
        for s, e in zip(starts, ends, strict=True):  # the union of nested/overlapping ranges
            if e <= reach:
                continue
            covered += e - max(s, reach)
            reach = e
        inside += covered
        between += float(ends.max() - starts.min()) - covered
    return ({k: (len(v), float(sum(v))) for k, v in per.items()}, inside, max(between, 0.0))


def compiled_code(log: CompileLog | None, trace: Trace | None,
                  wall_s: float | None = None, cells: CellNames | None = None
                  ) -> CompiledCode | None:
    """The profile's compiled code; None when it neither compiled nor ran any."""
    times, inside, between = _region_times(trace)
    if not times and (log is None or not (log.frames or log.graph_breaks)):
        return None  # compiled nothing and ran nothing compiled (``known`` only names)
    log = log or CompileLog()
    by_id = {f.compile_id: f for f in (*log.known, *log.frames)}
    regions = [Region(cid, _function(by_id[cid].frame) if cid in by_id else "",
                      _where(by_id[cid].file, by_id[cid].line, cells) if cid in by_id else "",
                      calls, total)
               for cid, (calls, total) in times.items()]
    regions.sort(key=lambda r: (-r.total_us, r.compile_id))
    return CompiledCode(
        regions=regions, region_us=inside, eager_us=between, compiles=len(log.frames),
        compile_s=sum(f.compile_s or 0.0 for f in log.frames), wall_s=wall_s,
        graphs=log.unique_graphs, breaks=graph_breaks(log, cells),
        recompiles=recompiles(log, cells),
        failed=[f for f in log.frames if f.failed], lost=log.lost,
        measured="the profiler's Torch-Compiled Region ranges" if times else "",
        recorded=log.source)


def graph_breaks(log: CompileLog, cells: CellNames | None = None) -> list[GraphBreak]:
    """Each break reason dynamo counted, with the line it was on where a
    compile in the log says it (module docstring)."""
    reasons = set(log.graph_breaks)
    placed: dict[str, tuple[str, str, str]] = {}
    used: set[int] = set()
    frames = log.frames
    for i, f in enumerate(frames):
        for reason in f.restart_reasons:
            if reason not in reasons or reason in placed:
                continue
            resume = next((j for j in range(i + 1, len(frames)) if j not in used
                           and frames[j].frame.startswith(RESUME_PREFIX)
                           and frames[j].file == f.file), None)
            if resume is not None:
                used.add(resume)
                placed[reason] = (_function(f.frame),
                                  _where(f.file, frames[resume].line, cells), f.file)
            else:
                placed[reason] = (_function(f.frame), "", f.file)
    out = []
    for reason, count in sorted(log.graph_breaks.items(), key=lambda kv: -kv[1]):
        first, hint = _reason_parts(reason)
        function, where, file = placed.get(reason, ("", "", ""))
        out.append(GraphBreak(first, hint, function, where, int(count), file))
    return out


def recompiles(log: CompileLog, cells: CellNames | None = None) -> list[Recompile]:
    """Each compile a failed guard made, with the guard (torch's words less the
    ``F/C: `` of the compile whose guard it was)."""
    return [Recompile(f.compile_id, _function(f.frame), _where(f.file, f.line, cells),
                      GUARD_OF.sub("", f.recompile_reason), f.compile_s, f.file)
            for f in log.frames if f.recompile_reason]


#: a path inside torch's package or Python's standard library (not the user's code)
_LIBRARY = re.compile(r"[/\\](?:site|dist)-packages[/\\](?:torch|torchlens)[/\\]"
                      r"|[/\\]lib[/\\]python3\.\d+[/\\](?!site-packages|dist-packages)"
                      r"|[/\\]torchlens[/\\](?:capture|analysis|frontends)[/\\]")


def user_code(path: str) -> bool:
    """Whether ``path`` is the user's code: not torch's package, torchlens' or
    Python's standard library (a graph break there is no line of theirs)."""
    return bool(path) and _LIBRARY.search(path) is None


def _break_finding(b: GraphBreak) -> Finding:
    at = f" at {b.where}" if b.where else ""
    inside = f" in {b.function}" if b.function else ""
    return Finding(
        WARNING, f"the graph breaks{inside}{at} (dynamo met it {plural(b.count, 'time')} "
                 f"while compiling): {b.reason}",
        (Figure("count", b.count), *((Figure("where", b.where),) if b.where else ()),
         *((Figure("function", b.function),) if b.function else ())),
        b.hint or "Each break splits the compiled code in two and runs the line between "
        "them eagerly; torch._dynamo.explain(fn)(*args) lists every break.",
        "graph break", code=GRAPH_BREAK)


def guard_line(guard: str, limit: int = GUARD_CHARS) -> str:
    """A failed guard's first line (torch adds the user's stack below it), cut to
    ``limit`` characters."""
    first = guard.strip().splitlines()[0] if guard.strip() else guard
    return first if len(first) <= limit else first[: limit - 1] + "…"


def recompile_advice(guard: str) -> str:
    """What to do about a recompile, by what its guard checked: a size, or a
    value the compiled code read (a Python number, a flag)."""
    if SIZE_GUARD.search(guard):
        return ("A shape that changes from call to call recompiles until dynamo marks it "
                "dynamic; torch._dynamo.mark_dynamic(x, 0) or a fixed (padded) shape avoids it.")
    return ("The compiled code read a value that changed (a Python number, a flag, an "
            "object's attribute) and dynamo specialised on it: pass it as a tensor, keep it "
            "constant, or read it outside the compiled function; TORCH_LOGS=recompiles "
            "shows each guard as it fails.")


def _recompile_finding(r: Recompile) -> Finding:
    took = f", {format_duration(r.compile_s * 1e6)}" if r.compile_s is not None else ""
    return Finding(
        WARNING, f"{r.function} ({r.where}) recompiled ({r.compile_id}{took}): "
        f"guard failed: {guard_line(r.guard)}",
        (Figure("compile_id", r.compile_id), Figure("where", r.where),
         Figure("compile_s", r.compile_s, "s")),
        recompile_advice(r.guard), "recompile", details={"guard": r.guard}, code=RECOMPILE)

"""The rank view of ``%ddp_check --profile``: the records as they arrive,
drawn on ``render.ranks.panels``.

Drawn live while the ranks run (``RankProfileView``: a Bokeh layout in a
``jupyter_bokeh.BokehModel`` whose sources grow with ``stream(rows,
rollover)``, so only new rows travel to the browser) and again from the run's
kept records (``rank_profile_figures``) for the static copy the notebook keeps
and the HTML report. The static copy is the live view fed everything at once,
so the two cannot drift apart. The timeline keeps each summary's longest ops
and a bounded number of rows, so a long run does not slow the browser down.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import msgspec
from markupsafe import escape

from torchlens.analysis.ranks.arrivals import collective_arrivals
from torchlens.analysis.ranks.overlap import profiled_overlap
from torchlens.analysis.ranks.slow import WINDOW, slow_rank
from torchlens.analysis.ranks.spread import Spread, ranks_to_show
from torchlens.analysis.ranks.steps import (
    ROLES,
    memory_rows,
    profiled_breakdown,
    rank_table,
    step_rows,
)
from torchlens.analysis.ranks.verdict import RankRow, summary_dicts, table_row
from torchlens.model.findings import Finding
from torchlens.model.payloads import RankProfiling
from torchlens.model.records import StepRecord, StepSummary, summaries_from
from torchlens.render.columns import FLUSH_S, as_number
from torchlens.render.ranks.bands import SPREAD_MEM, mem_spread_units, merge
from torchlens.render.ranks.lanes import EndMark, lane_names
from torchlens.render.ranks.overlap import overlap_caption
from torchlens.render.ranks.panels import (
    ARRIVAL_ROWS,
    COLLECTIVE_ROWS,
    OPS_BUDGET,
    PARTS,
    STEP_KEYS,
    TIMELINE_ROWS,
    Panels,
    columns_or_empty,
    end_mark,
    heap_of,
    mem_row,
    one_rank,
    profiled_points,
    stream,
    verdict_html,
)
from torchlens.render.ranks.spans import span_points, training
from torchlens.render.tables import shorten

STEP_ROLLOVER = 5000  # points per rank in the step and memory panels
SPREAD_STEPS = 256  # steps whose band a late rank still moves (analysis.ranks.spread.Spread)
WAITING_STEPS = 3  # profiled steps held back until every rank sent its summary
VERDICT_S = 1.0  # the verdict and breakdown are recomputed at most this often
KEEP_SUMMARIES = 50  # per rank, as RankProfiling.keep
REASON_CHARS = 80


class RankProfileView:
    """The live view: ``push_*`` records as the kernel decodes them, ``flush``
    from the same thread (at least twice a second while records arrive).

    ``t0``: the run's start (unix seconds) that timeline times are relative
    to; without it, the first record's start. ``modelled``: the memory
    figures will come from the allocator model (a CPU run), so the titles say
    so before the first summary arrives.
    """

    def __init__(self, world_size: int, every: int, modelled: bool,
                 t0: float | None = None) -> None:
        self.world_size = world_size
        self.every = every
        self.t0 = t0
        self.panels = Panels(world_size, every, modelled)
        self.layout = self.panels.layout
        self._widget: Any = None
        self.flushes = 0
        #: every record pushed, per rank (the analysis reads whole runs)
        self.records: list[list[StepRecord]] = [[] for _ in range(world_size)]
        self.summaries: list[deque[StepSummary]] = [deque(maxlen=KEEP_SUMMARIES)
                                                       for _ in range(world_size)]
        self.ended: dict[int, str] = {}
        self._new_steps: list[list[StepRecord]] = [[] for _ in range(world_size)]
        self._redraw: set[int] = set()  # ranks whose set-up windows were dropped
        self._windows = self._stepped = False  # windows seen; real steps seen
        self._new_summaries: list[tuple[int, StepSummary]] = []
        self._new_ended: list[tuple[int, str, float]] = []
        self._new_restarts: list[tuple[int, str]] = []  # step, text
        self._waiting: dict[int, dict[int, StepSummary]] = {}  # step -> rank -> summary
        self._last_point: dict[int, tuple[int, float]] = {}
        self._mem_sources: set[str] = set()
        self._latest: tuple[int, float, float] | None = None  # step, start, end shown
        self._dirty = False
        self._last_flush = 0.0
        self._last_analysis = -math.inf
        self._analysis_every = VERDICT_S
        self._profiled_steps: set[int] = set()  # every step some rank profiled
        self._table: list[RankRow] = []  # the last analysis' rank_table
        self._ranked = False  # the slots were picked from a rank_table
        self._slow: int | None = None
        #: the verdict shown instead of one judged here (``take_verdict``)
        self._given: tuple[Finding, int | None] | None = None
        self._due_now = False
        self.step_spread = Spread(("step_ms",), keep=SPREAD_STEPS)
        self.mem_spread = Spread(SPREAD_MEM, keep=SPREAD_STEPS)
        self.prof_spread = Spread(SPREAD_MEM, keep=SPREAD_STEPS)

    @property
    def widget(self) -> Any:
        """The ``BokehModel`` that shows ``layout`` in a notebook (made on first use)."""
        if self._widget is None:
            from jupyter_bokeh import BokehModel

            self._widget = BokehModel(self.layout)
        return self._widget

    def hide_verdict(self) -> None:
        """No verdict line above the step chart: ``torchlens.watch``'s status block
        says it, newest first (a copy here lagged it between analyses)."""
        self.panels.verdict.visible = False

    def hide_timeline(self) -> None:
        """Drop the profiled-step timeline: for summaries cut to their figures
        (``torchlens run``'s live feed has no ops to draw)."""
        self.panels.tl_fig.visible = False

    def push_steps(self, rank: int, records: list[StepRecord]) -> None:
        """A batch of step records of ``rank`` (docs/RANK_PROFILE.md).

        Windows a rank cut before its first ``torchlens.step()`` were its
        set-up (the stepper counts from step 0 again): once a real step
        arrives they are taken off the panels, as the run's records drop
        them, so a set-up of seconds is not drawn as step 0.
        """
        if not records:
            return
        if self.t0 is None:
            self.t0 = records[0].t0
        self._windows = self._windows or records[0].window
        if any(not rec.window for rec in records):
            self._stepped = True
            if any(rec.window for rec in self.records[rank]):
                self.records[rank] = [rec for rec in self.records[rank] if not rec.window]
                # windows not drawn yet go too (they came in the same flush)
                self._new_steps[rank][:] = [rec for rec in self._new_steps[rank]
                                            if not rec.window]
                self._redraw.add(rank)
            records = [rec for rec in records if not rec.window]
        # a rank's first steps are judged at the next flush: a verdict that
        # lags the lines drawn would say "only one rank has reported steps"
        self._due_now = self._due_now or (not self.records[rank] and bool(records))
        self.records[rank].extend(records)
        self._new_steps[rank].extend(records)
        self._dirty = True

    def push_summary(self, rank: int, summary: StepSummary | Any) -> None:
        """One profiled-step summary of ``rank`` (or its decoded JSON, as
        ``%ddp_check``'s kernel reads it: typed here, once; one that is not a
        summary is left out)."""
        try:
            summary = StepSummary.of(summary)
        except msgspec.ValidationError:
            return
        if self.t0 is None:
            self.t0 = summary.t0
        self.summaries[rank].append(summary)
        self._new_summaries.append((rank, summary))
        self._dirty = True

    def mark_restart(self, step: int, text: str) -> None:
        """The job restarted: its next start's steps are drawn from ``step``."""
        self._new_restarts.append((step, text))

    def rank_ended(self, rank: int, reason: str, t: float) -> None:
        """``rank`` stopped early (crash, kill) at unix time ``t``, for ``reason``.
        A rank that finished is no news: the red mark is for one that stopped
        early, never for every rank that reached ``--steps``."""
        self.ended[rank] = reason
        if reason.startswith("finished"):
            return
        self._new_ended.append((rank, reason, t))

    def flush(self, force: bool = False) -> None:
        """Stream what arrived since the last flush; at most every ``FLUSH_S``
        unless ``force`` (the run's end: held-back collectives are drawn too)."""
        now = time.monotonic()
        # a verdict handed in, or a rank's first steps, are shown at once
        analysis_due = self._dirty and (force or self._due_now
                                        or now - self._last_analysis >= self._analysis_every)
        pending = (any(self._new_steps) or self._redraw or self._new_summaries or self._new_ended
                   or self._new_restarts or analysis_due or (force and self._waiting))
        if not pending or (not force and now - self._last_flush < FLUSH_S):
            self.panels.settle_captions(force)
            return
        self._last_flush = now
        self._flush_steps()
        restarts, self._new_restarts = self._new_restarts, []
        stream(self.panels.restarts, [{"step": step, "text": text} for step, text in restarts],
               STEP_ROLLOVER)
        if any(r not in self.panels.slot_of for r, _, _ in self._new_ended):
            self._pick()  # a rank that stopped early is drawn before its end is marked
        self._flush_ended()
        self._flush_summaries(force)
        if analysis_due:
            self._analyse()
        self.panels.settle_captions(force)
        self.flushes += 1

    # ---- one flush -----------------------------------------------------------------

    def _flush_steps(self) -> None:
        p = self.panels
        seen = set(self._mem_sources)
        redraw, self._redraw = self._redraw, set()
        for r in sorted(redraw):
            self._redraw_rank(r)
        for r, new in enumerate(self._new_steps):
            if not new:
                continue
            rows = step_rows(one_rank(training(new)))
            spans = span_points(p.color(r), new)
            p.spans_legend.visible = p.spans_legend.visible or bool(spans)
            mem = memory_rows(one_rank(new), [[]])
            heaps = [heap_of(rec) for rec in new]  # one memory row per record, in order
            if any(h is not None for h in heaps):
                p.show_heap()  # drawn once a rank's C library says it
            seen.update(m.get("source") for m in mem)
            new.clear()
            if rows:
                self._last_point[r] = (rows[-1]["step"], rows[-1]["step_ms"])
            profiled = {row["step"] for row in rows if row["profiled"]} - self._profiled_steps
            if profiled:
                self._profiled_steps |= profiled
                p.set_profiled_steps(sorted(self._profiled_steps))
            if p.spread:
                self.step_spread.add(r, rows)
                self.mem_spread.add(r, mem)
            slot = self.panels.slot_of.get(r)
            if slot is None:
                continue
            stream(p.steps[slot], [{k: row[k] for k in STEP_KEYS} for row in rows],
                    STEP_ROLLOVER)
            stream(p.profiled, profiled_points(p.color(r), rows), STEP_ROLLOVER * len(p.shown))
            stream(p.spans, spans, STEP_ROLLOVER)
            stream(p.mem[slot], [mem_row(m, h) for m, h in zip(mem, heaps, strict=False)],
                   STEP_ROLLOVER)
        if p.spread:
            merge(p.step_spread, self.step_spread.changed(), STEP_ROLLOVER)
            merge(p.mem_spread, mem_spread_units(self.mem_spread.changed()), STEP_ROLLOVER)
        # "window" only while no rank has called torchlens.step(): then the
        # points are fixed windows of time, not steps
        p.step_fig.xaxis.axis_label = "window" if self._windows and not self._stepped else "step"
        p.fit_step_axis()
        self._set_memory_sources(seen)

    def _redraw_rank(self, r: int) -> None:
        """Rank ``r``'s step and memory points drawn again from its records
        (its set-up windows were dropped)."""
        p = self.panels
        self._last_point.pop(r, None)
        slot = p.slot_of.get(r)
        if slot is None:
            return
        p.steps[slot].data = columns_or_empty(p.steps[slot], [])
        p.mem[slot].data = columns_or_empty(p.mem[slot], [])
        color = p.color(r)
        keep = [i for i, c in enumerate(p.profiled.data["color"]) if c != color]
        p.profiled.data = {k: [v[i] for i in keep] for k, v in p.profiled.data.items()}
        # windows come only before a rank's first real step: what it has left
        # are the real steps of this batch, streamed next

    def _point_at(self, rank: int, t: float) -> tuple[int, float]:
        """The step point ``rank`` had drawn when it stopped at ``t``: its last
        step ended by then. Not simply its latest point: a replayed feed, or
        a restarted rank, has drawn steps after it."""
        for rec in reversed(self.records[rank]):
            if rec.t1 <= t:
                (row,) = step_rows(one_rank([rec]))
                return row["step"], row["step_ms"]
        return self._last_point.get(rank, (0, 0.0))

    def _flush_ended(self) -> None:
        p = self.panels
        steps, ends = [], []
        for rank, reason, t in self._new_ended:
            if rank not in self.panels.slot_of:  # one of many: the checklist names it
                continue
            step, ms = self._point_at(rank, t)
            text = f"rank {rank}: {shorten(reason, REASON_CHARS)}"
            steps.append(end_mark(p.ended.data, steps, step, ms, text, rank))
            row = p.tl.place_end(EndMark(t - (self.t0 or t), text, f"rank {rank} stopped"), rank)
            p.tl.ends.append((row, rank))
            ends.append(row)
        if self._new_ended and p.lanes.slot:
            p.relayout(self.ended)
        self._new_ended.clear()
        stream(p.ended, steps, STEP_ROLLOVER)
        stream(p.tl_ends, ends, STEP_ROLLOVER)

    def _flush_summaries(self, force: bool) -> None:
        p = self.panels
        new, self._new_summaries = self._new_summaries, []
        moved = added = False
        for rank, s in sorted(new, key=lambda x: (x[0], x[1].step)):
            if rank not in self.panels.slot_of:
                continue
            a, m = p.lanes.add(rank, lane_names(s))
            added, moved = added or a, moved or m
        if added:
            p.relayout(self.ended)
            if moved:  # rows already drawn sit on the old lanes: send them all again
                p.replace_timeline()
            elif p.tl.ends:  # an ended rank's mark spans its lanes
                p.tl_ends.data = columns_or_empty(
                    p.tl_ends, [p.tl.place_end(r, w) for r, w in p.tl.ends])
        ops, colls, seen = [], [], set(self._mem_sources)
        for rank, s in new:
            mem = memory_rows([[]], one_rank(msgspec.to_builtins([s])))
            seen.update(m.get("source") for m in mem)
            if p.spread:
                self.prof_spread.add(rank, mem)
            slot = self.panels.slot_of.get(rank)
            if slot is None:
                continue
            ops += p.tl.add_ops(rank, s, self.t0, max(50, OPS_BUDGET // len(p.shown)))
            colls += p.tl.add_collectives(rank, s, self.t0)
            self._waiting.setdefault(s.step, {})[rank] = s
            self._show_step(s)
            rows = [mem_row(m) for m in mem]
            stream(p.mem_prof[slot], rows, STEP_ROLLOVER)
            stream(p.mem_marks, [{**m, "color": p.color(rank)} for m in rows],
                    STEP_ROLLOVER * len(p.shown))
        if p.spread:
            merge(p.prof_spread, mem_spread_units(self.prof_spread.changed()), STEP_ROLLOVER)
        self._set_memory_sources(seen)
        stream(p.ops, ops, TIMELINE_ROWS)
        stream(p.colls, colls, COLLECTIVE_ROWS)
        self._flush_arrivals(force)

    def _flush_arrivals(self, force: bool) -> None:
        """Join each collective across ranks once every running rank has sent the step."""
        p = self.panels
        segs, marks = [], []
        running = [r for r in p.shown if r not in self.ended]
        for step in sorted(self._waiting):
            got = self._waiting[step]
            if not (force or len(self._waiting) > WAITING_STEPS
                    or all(r in got for r in running)):
                break
            del self._waiting[step]
            s, m = p.tl.add_arrivals(step, got, collective_arrivals(got), self.t0)
            segs += s
            marks += m
        stream(p.arrivals, segs, ARRIVAL_ROWS)
        stream(p.last, marks, ARRIVAL_ROWS)

    def _analyse(self) -> None:
        """The verdict and the breakdown, from every record so far."""
        p = self.panels
        started = time.monotonic()
        self._due_now = False
        if self._given is not None:
            finding, slow = self._given
        else:
            sr = slow_rank(self.records)
            finding, slow = sr.finding, sr.rank
        self._slow = slow
        self._table = [table_row(RankRow(rank=row["rank"]), row) for row in rank_table(
            self.records, summary_dicts(self._summaries()), window=WINDOW)]
        self._pick()
        color = p.color(slow) if slow is not None else "#333"
        if p.verdict.visible:  # hidden, its changes would still cross to the browser
            p.verdict.text = str(verdict_html(finding, color))
        for r, line in zip(p.shown, p.step_lines, strict=True):
            line.glyph.line_width = 3.0 if r == slow else 1.5
        table = [self._table[r] for r in p.shown]
        data: dict[str, list[Any]] = {"rank": [f"rank {row.rank}" for row in table],
                                      "median_step_ms": [as_number(row.step_ms)
                                                         for row in table]}
        for part in PARTS:
            data[f"{part}_ms"] = [row.figure(f"{part}_ms") or 0.0 for row in table]
        p.breakdown.data = data
        by_rank = {row.rank: row for row in profiled_breakdown(
            summary_dicts(self._summaries()))}
        roles = [by_rank[r] for r in p.shown]
        p.roles.data = {"rank": [f"rank {row.rank}" for row in roles],
                        "step_ms": [as_number(row.step_ms) for row in roles],
                        "profiled": [row.profiled for row in roles],
                        **{f"{role}_ms": [row.role_ms(role) or 0.0 for row in roles]
                           for role in ROLES}}
        said = str(escape(overlap_caption(profiled_overlap(self._summaries()),
                                          p.shown)))
        if p.overlap_note.text != said:
            p.overlap_note.text = said
        self._dirty = False
        self._last_analysis = time.monotonic()
        # a long run makes the analysis slower: keep it a small share of the kernel's time
        self._analysis_every = max(VERDICT_S, 10 * (self._last_analysis - started))

    def take_verdict(self, finding: Finding, rank: int | None) -> None:
        """Show ``finding`` (naming ``rank`` slow, or nobody) rather than judge
        this view's own records: ``torchlens.watch`` gives the collector's,
        the one its status header says, so the page has one set of figures
        (the collector judges the records it holds, which this view receives
        a moment later)."""
        if self._given != (finding, rank):
            self._given = (finding, rank)
            self._dirty = self._due_now = True

    def _pick(self) -> None:
        """A job of many ranks: which ranks get a line (the slow rank and the
        ranks that stopped early first), and their slots refilled."""
        p = self.panels
        if not p.spread:
            return
        stopped = [r for r, why in self.ended.items() if why != "finished"]  # in end order
        first = ([self._slow] if self._slow is not None else []) + stopped
        table = self._table or [RankRow(rank=r) for r in range(self.world_size)]
        # before the first analysis the slots hold ranks 0.. for want of better: not kept
        current = p.shown if self._ranked else []
        self._ranked = self._ranked or bool(self._table)
        shown = ranks_to_show(table, first, current, len(p.shown))
        if shown != p.shown:
            self._show(shown)

    def _show(self, shown: list[int]) -> None:
        p, old = self.panels, list(self.panels.shown)
        p.show_ranks(shown)
        points, marks, spans = [], [], []
        for i, r in enumerate(shown):
            rows = step_rows(one_rank(training(self.records[r])))
            spans += span_points(p.color(r), self.records[r])
            prof = [mem_row(m) for m in memory_rows(
                [[]], one_rank(msgspec.to_builtins(list(self.summaries[r]))))]
            points += profiled_points(p.color(r), rows)
            marks += [{**m, "color": p.color(r)} for m in prof]
            if old[i] == r:
                continue
            p.steps[i].data = columns_or_empty(p.steps[i], [{k: row[k] for k in STEP_KEYS}
                                                             for row in rows[-STEP_ROLLOVER:]])
            mem = memory_rows(one_rank(self.records[r]), [[]])[-STEP_ROLLOVER:]
            heaps = [heap_of(rec) for rec in list(self.records[r])[-STEP_ROLLOVER:]]
            if any(h is not None for h in heaps):
                p.show_heap()
            p.mem[i].data = columns_or_empty(p.mem[i], [mem_row(m, h) for m, h in
                                                        zip(mem, heaps, strict=False)])
            p.mem_prof[i].data = columns_or_empty(p.mem_prof[i], prof)
        p.profiled.data = columns_or_empty(p.profiled, points[-STEP_ROLLOVER * len(shown):])
        p.spans.data = columns_or_empty(p.spans, spans[-STEP_ROLLOVER:])
        p.mem_marks.data = columns_or_empty(p.mem_marks, marks)
        # the timeline keeps the lanes of the ranks drawn
        kept = set(shown)
        self._waiting = {step: got for step, got in (
            (step, {r: s for r, s in got.items() if r in kept}) for step, got in
            self._waiting.items()) if got}
        tl = p.tl
        tl.ops = deque(((r, w) for r, w in tl.ops if w[0] in kept), maxlen=tl.ops.maxlen)
        tl.colls = deque(((r, w) for r, w in tl.colls if w[0] in kept), maxlen=tl.colls.maxlen)
        tl.arrivals = deque(((r, w) for r, w in tl.arrivals
                             if all(k[0] in kept for k in w)), maxlen=tl.arrivals.maxlen)
        tl.last = deque(((r, w) for r, w in tl.last if w[0] in kept), maxlen=tl.last.maxlen)
        tl.ends = [(r, w) for r, w in tl.ends if w in kept]
        if p.lanes.keep(kept):
            p.relayout(self.ended)
            p.replace_timeline()

    # ---- helpers ----------------------------------------------------------------------

    def _summaries(self) -> list[list[StepSummary]]:
        return [list(s) for s in self.summaries]

    def _set_memory_sources(self, seen: set[Any]) -> None:
        seen.discard(None)
        if seen != self._mem_sources:
            self._mem_sources = seen
            self.panels.set_memory_titles(seen)
            # the profiled points are joined when they are the only allocator figures
            joined = "modelled" in seen and "cuda" not in seen
            for line in self.panels.prof_lines:
                line.visible = joined

    def _show_step(self, s: StepSummary) -> None:
        """Keep the timeline on the newest profiled step (every rank's copy of it)."""
        if not self.panels.tl_fig.visible:  # hidden: nothing to move, nothing to send
            return
        step, start, end = s.step, s.t0 - self.t0, s.t1 - self.t0
        if self._latest is not None and step < self._latest[0]:
            return
        if self._latest is not None and step == self._latest[0]:
            start, end = min(start, self._latest[1]), max(end, self._latest[2])
        self._latest = (step, start, end)
        pad = (end - start) * 0.03 or 0.001
        self.panels.tl_fig.x_range.update(start=start - pad, end=end + pad,
                                          reset_start=start - pad, reset_end=end + pad)


def rank_profile_figures(profiling: RankProfiling, world_size: int, t0: float | None,
                         ended: dict[int, str] | None = None,
                         ended_at: dict[int, float] | None = None) -> Any:
    """The static layout of a finished ``--profile`` run: the live view's panels
    fed the kept records at once (so both show the same points).

    ``ended``: rank -> why it stopped early; drawn at ``ended_at[rank]`` (unix
    s), else at the end of the rank's last step.
    """
    summaries = [summaries_from(sums)[0] for sums in profiling.summaries]
    modelled = any(s.memory is not None and s.memory.source == "modelled"
                   for sums in summaries for s in sums)
    view = RankProfileView(world_size, profiling.every, modelled, t0=t0 or None)
    for r in range(world_size):
        if r < len(profiling.steps) and profiling.steps[r]:
            view.push_steps(r, profiling.steps[r])
        for s in summaries[r] if r < len(summaries) else []:
            view.push_summary(r, s)
    for r, reason in sorted((ended or {}).items()):
        steps = profiling.steps[r] if r < len(profiling.steps) else []
        t = (ended_at or {}).get(r) or (steps[-1].t1 if steps else view.t0 or 0.0)
        view.rank_ended(r, reason, t)
    view.flush(force=True)
    return view.layout

"""``torchlens.watch(RUN_DIR or "host:port")``: a running ``torchlens run`` job, live in a notebook.

The view is ``%ddp_check --profile``'s (``frontends.shared.live_view.ProfiledLiveView``:
step time per rank, memory, the slow rank, the breakdown, and the heartbeat
panels) under a status block (``render.ranks.watch_status``: the collector's
verdict and one row per rank). It is fed from the collector's live feed
(``capture.ranks.feed``): the run folder's ``live.jsonl`` (tailed) or the
collector's store (sealed frames; the run's secret is needed). Frames carry
what is new, so the view gets exactly the pushes ``%ddp_check``'s launcher
makes: ``push`` (heartbeats), ``push_steps``, ``push_summary``,
``rank_ended``, ``flush``.

Who draws: a daemon thread polls the feed and streams into the Bokeh
sources, as ``%gpumonitor`` does; ``jupyter_bokeh`` sends only the new rows,
and the kernel stays free for other cells (``%ddp_check`` streams from the
cell that runs it instead, because that cell is busy until the ranks end).
BokehJS is loaded into the page when ``watch()`` is called
(``bokeh_page.load_bokehjs``), before any widget can be drawn; when the watch
ends, that output is replaced by the final status, the static copy a saved
notebook keeps.

The feed's summaries are cut to their figures (the collector keeps them so)
and its heartbeats count no collectives: the view leaves out the timeline of
the latest profiled step and the collectives panel (``for_run_feed``) rather
than draw them empty; ``torchlens report RUN_DIR`` draws the timeline after
the run, and a finished folder without a feed is shown from its full files.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

from torchlens.frontends.ranks.watch_sources import open_source
from torchlens.frontends.shared.metrics_publish import Tee, needs_server, watch_feed
from torchlens.model import InputError
from torchlens.model.errors import shown_alone
from torchlens.model.findings import FindingLine
from torchlens.model.messages import DdpHeartbeat

if TYPE_CHECKING:
    from torchlens.analysis.ranks.verdict import LiveStatus
    from torchlens.capture.ranks.feed import LiveFrame

T = TypeVar("T")
POLL_S = 0.5
DEFAULT_TIMEOUT_S = 60.0
PHASES = {"running": "step", "finished": "done", "failed": "failed"}


def watch(target: Any, secret_file: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
          run_id: str | None = None, metrics: bool = False) -> Watch:
    """Watch a ``torchlens run`` job; returns a handle that shows its live view.

    ``target``: the run folder (``--out``) or the collector's ``host:port``
    (then ``secret_file``, the run's ``run.secret``, or the environment
    ``TORCHLENS_RUN_SECRET_FILE`` / ``TORCHLENS_RUN_SECRET``; ``run_id`` or
    ``TORCHLENS_RUN_ID`` only if the collector should be checked to host
    that run). ``timeout``: seconds without a new frame after which the
    watch gives up (the collector publishes one a second). The handle polls
    in the background and stops by itself when the run ends; ``.stop()``
    stops it sooner, ``.wait()`` waits for the end. ``metrics``: the run's per-rank
    series also on this kernel's Jupyter server's ``/metrics`` (docs/METRICS.md).
    """
    if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
            or not math.isfinite(timeout) or timeout <= 0):
        raise shown_alone(InputError(f"timeout must be a number of seconds > 0, got {timeout!r}"))
    try:
        publisher = needs_server("torchlens.watch(metrics=True)") if metrics else None
        source, label, note = open_source(target, secret_file, run_id, float(timeout))
    except InputError as exc:
        raise shown_alone(exc) from None
    handle = Watch(source, label, float(timeout), note)
    handle.metrics = watch_feed(os.fspath(target), source, publisher)
    handle.start()
    return handle


# -- what is watched ------------------------------------------------------------------
class Watch:
    """What ``torchlens.watch`` returns: displays the live view, polls in a thread.

    ``view``: the ``ProfiledLiveView`` (None until the first frame says the
    world size); ``status``: the newest frame's status (``findings``: the
    same as typed findings); ``state``:
    ``waiting``, ``running``, ``ended`` (the run ended; the view holds its
    final state) or ``stopped`` (``message`` says why).
    """

    def __init__(self, source: Any, label: str, timeout: float, note: str = "") -> None:
        self.source, self.label, self.timeout = source, label, timeout
        self.note = note
        self.view: Any = None
        self.status: LiveStatus | None = None
        self.frames = 0
        self.seq: int | None = None
        self.state = "waiting"
        self.message = ""
        self.ended = False
        self.metrics: Any = None  # a MetricsFeed (watch(metrics=True))
        from torchlens.analysis.ranks.starts import StepStarts

        #: a restarted job's steps counted across its starts, for the panels drawn by step
        self.starts = StepStarts()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._box: Any = None
        self._header: Any = None
        self._button: Any = None
        self._loaded: Any = None
        self._copied = False  # the final status was written above the widget (_end)
        self._thread = threading.Thread(target=self._run, daemon=True, name="torchlens-watch")

    # -- public ------------------------------------------------------------------
    def start(self) -> None:
        from torchlens.frontends.shared.cells import in_kernel

        if in_kernel():  # BokehJS in the page before any widget of ours is drawn
            from torchlens.frontends.shared.bokeh_page import load_bokehjs
            from torchlens.frontends.shared.live_view import ProfiledLiveView

            self._loaded = load_bokehjs([ProfiledLiveView(1, None, False).layout])
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (the view keeps what it shows)."""
        self._stop.set()
        self._thread.join(timeout=5)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the watch ends (the run ended, or it stopped); True if the run ended."""
        self._done.wait(timeout)
        return self.ended

    @property
    def findings(self) -> list[FindingLine]:
        """What the status block says, as findings (``LiveStatus.findings``: the
        verdict, then the slow rank's when it is another), each the line it
        reads as, with its ``code``, ``severity`` and ``.finding`` (ranks,
        cause figure); [] before the first status. After ``wait()`` on an
        ended run: its final verdict."""
        with self._lock:
            said = self.status.findings() if self.status is not None else []
        return [FindingLine(f) for f in said]

    @property
    def dropped(self) -> int:
        """Frames dropped because their seal did not open (store transport)."""
        return int(getattr(self.source, "dropped", 0))

    @property
    def widget(self) -> Any:
        """The notebook widget: the status block, the live view, a Stop button
        while the watch runs."""
        with self._lock:
            if self._box is None:
                import ipywidgets

                from torchlens.frontends.shared.live_view import held_widget

                # the browser's messages to them are taken under the lock the
                # thread draws under: the two never change one widget at once
                self._header = held_widget(ipywidgets.HTML, self._lock, self._header_html())
                self._button = held_widget(ipywidgets.Button, self._lock, description="Stop",
                                           icon="stop", disabled=self._done.is_set())
                self._button.on_click(lambda _b: self._stop.set())
                self._box = held_widget(ipywidgets.VBox, self._lock)
                self._fill_box()
            return self._box

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        with self._lock:
            bundle = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
            bundle["text/plain"] = self._text()
        return bundle

    def __repr__(self) -> str:
        with self._lock:
            return self._text()

    # -- the thread ----------------------------------------------------------------
    def _run(self) -> None:
        from torchlens.capture.ranks.feed import FeedGone, FeedReplaced

        last = time.monotonic()
        state, why = "stopped", "stopped by .stop()"
        try:
            while not self._stop.is_set():
                try:
                    frames = self.source.read()
                except FeedReplaced as exc:
                    state, why = "stopped", (
                        f"{exc}: this watch keeps what it showed of its run and stops; "
                        "torchlens.watch(RUN_DIR) again watches the new one")
                    break
                except FeedGone as exc:
                    state, why = "stopped", (
                        f"the collector closed its store before the last frame ({exc}): the "
                        "run ended or was interrupted; torchlens.load(RUN_DIR) reads its folder")
                    break
                # everything the kernel's thread also reads or changes (the view's
                # document, the widgets, the status) is changed under the lock;
                # the feed is read outside it, so the kernel never waits on a read
                with self._lock:
                    for frame in frames:
                        self._apply(frame)
                    Tee(self.view, self.metrics).flush(force=self.ended)
                    if frames:
                        last = time.monotonic()
                        self.state = "ended" if self.ended else "running"
                        self._refresh()
                if self.ended:
                    self.source.finished()
                    state, why = "ended", ""
                    break
                if time.monotonic() - last > self.timeout:
                    state, why = "stopped", (
                        f"no new frame for {self.timeout:.0f} s: the run's collector is gone "
                        "or stalled (torchlens run killed?); torchlens.load(RUN_DIR) reads "
                        "what its folder holds")
                    break
                self._stop.wait(POLL_S)
        except Exception as exc:  # noqa: BLE001 - the kernel must not lose the thread silently
            state, why = "stopped", f"the watch failed: {type(exc).__name__}: {exc}"
        finally:
            self.source.close()
            self._end(state, why)

    def _apply(self, frame: LiveFrame) -> None:
        """One frame (``capture.ranks.feed``, typed by its reader): its status and
        summaries decoded here, once, into their types."""
        from torchlens.analysis.ranks.verdict import LiveStatus
        from torchlens.model.records import summaries_from

        world = frame.world_size or 0
        if world and (self.view is None or world > self.view.profile.world_size):
            self._new_view(world)
        self.status = LiveStatus.of(frame.status) or self.status
        self.seq = frame.seq
        self.frames += 1
        self.ended = self.ended or frame.ended
        view = self.view
        if view is None:
            return
        world = view.profile.world_size
        rows = {row.rank: row for row in self.status.ranks} if self.status else {}
        t0 = float(frame.t0 or 0.0)
        view.profile.t0 = view.profile.t0 or t0 or None  # the timeline's origin: the lanes'
        for r, beats in _ranks(frame.heartbeats, world):
            row = rows.get(r)
            state = row.state if row is not None else None
            for beat in beats if isinstance(beats, list) else [beats]:
                if beat.t is not None:
                    view.push(DdpHeartbeat(
                        rank=r, t=beat.t, t_rel=beat.t - t0, rss=beat.rss,
                        node=row.node if row is not None else None,
                        phase=(beat.phase if isinstance(beat.phase, str) else "")
                        or PHASES.get(state, str(state))))
        batches = dict(_ranks(frame.steps, world))
        feed = Tee(view, self.metrics)  # the metrics too, when asked
        for r, records in self.starts.place_steps(batches).items():
            feed.push_steps(r, records)
        for r, summaries in _ranks(frame.summaries, world):
            typed, _ = summaries_from(summaries)
            for s in typed:
                feed.push_summary(r, self.starts.place_summary(r, s))
        if self.metrics is not None:
            self.metrics.take_status(self.status)
        # the section's verdict is the header's (the collector judged it)
        if self.status is not None and self.status.slow_finding is not None:
            view.profile.take_verdict(self.status.slow_finding, self.status.slow_rank)
        for number, step in self.starts.take_marks():
            view.mark_restart(step, self._restart_label(number))
        for r, (why, when) in _ranks(frame.ended_ranks, world):
            # the view's red x is for a rank that stopped early, as in %ddp_check;
            # a finished rank is said in the status table
            if not why.startswith("finished"):
                view.rank_ended(r, why, float(when or frame.t or 0.0))

    def _restart_label(self, number: int) -> str:
        """The status's few words for restart ``number`` ("restart 1: rank 1
        failed"), or just its number while the status does not have it yet."""
        for r in self.status.restarts if self.status is not None else []:
            if r.number == number and r.label:
                return r.label
        return f"restart {number}"

    def _new_view(self, world: int) -> None:
        """A view for ``world`` ranks (again, with what the old one holds, if it grew)."""
        from torchlens.frontends.shared.live_view import ProfiledLiveView

        old, self.view = self.view, ProfiledLiveView(world, None, False)
        self.view.lock = self._lock  # its widget takes the browser's messages under it
        self.view.for_run_feed(timeline=getattr(self.source, "full_summaries", False))
        if old is not None:
            for r, records in enumerate(old.profile.records):
                self.view.push_steps(r, records)
            for r, kept in enumerate(old.profile.summaries):
                for s in kept:
                    self.view.push_summary(r, s)
            for number, step in self.starts.marks():
                self.view.mark_restart(step, self._restart_label(number))
        if self._box is not None:
            self._fill_box()

    def _fill_box(self) -> None:
        children = [self._header]
        if self.view is not None:
            children.append(self.view.widget)  # its empty panels held (render.empty_ranges)
        if self.state not in ("ended", "stopped"):  # nothing left to stop once it ended
            children.append(self._button)
        self._box.children = children

    def _refresh(self) -> None:
        if self._header is not None:
            self._header.value = self._header_html()

    def _header_html(self) -> str:
        """The widget's status block; once the final status has been copied above
        it (``_end``), a note pointing there, so the block is not shown twice, also
        when the widget is first drawn after the run ended (a watch of an ended run)."""
        if self._copied:
            from torchlens.render.ranks.watch_status import note_html

            return str(note_html(f"torchlens.watch {self.label}: {self.state}; "
                                 "its final status is above"))
        return str(self._html())

    def _end(self, state: str, why: str) -> None:
        # under the lock, and ``_done`` last: a ``wait()`` that returns, and a widget
        # drawn after it, find the final status already copied (shown once)
        with self._lock:
            self.state, self.message = state, why
            if self._loaded is not None and self._loaded.handle is not None:
                from IPython.display import HTML

                copy = self._html(["the final state, kept when the notebook is saved (the "
                                   "live view below is a widget: a saved notebook does not "
                                   "keep it)"])
                self._loaded.handle.update(HTML(str(copy)))
                self._loaded.handle = None
                self._copied = True  # the copy above says it all, once is enough
            if self._box is not None:
                self._fill_box()  # the Stop button goes
            self._refresh()
            self._done.set()

    # -- words ---------------------------------------------------------------------
    def _facts(self) -> str:
        parts = []
        if self.frames:
            parts.append(f"frame {self.seq}")
        if self.status:
            parts.append(f"{self.status.attached} of "
                         f"{self.status.world_size or '?'} ranks")
        if self.dropped:
            parts.append(f"{self.dropped} forged frame(s) dropped")
        return ", ".join(parts)

    def _notes(self) -> list[str]:
        return [n for n in (self.note, self.message) if n]

    def _html(self, more: list[str] | None = None) -> Any:
        from torchlens.render.ranks.watch_status import status_html

        return status_html(self.label, self.state, self.status, self._facts(),
                           [*self._notes(), *(more or [])])

    def _text(self) -> str:
        from torchlens.render.ranks.watch_status import status_text

        text = status_text(self.label, self.state, self.status, self._facts())
        return "; ".join([text, *self._notes()])


def _ranks(by_rank: dict[str, T], world: int) -> list[tuple[int, T]]:
    """A frame's ``{rank: value}`` as (int rank, value) for ranks the view has."""
    out = []
    for key, value in by_rank.items():
        try:
            r = int(key)
        except (TypeError, ValueError):
            continue
        if 0 <= r < world:
            out.append((r, value))
    return out

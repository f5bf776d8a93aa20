"""The one live view of ``%ddp_check --profile``: rank profile panels above the heartbeat panels.

Why a composite: the launcher talks to one sink (``RankSink``), which hands
heartbeats, step records, summaries and rank endings to one ``inner`` view;
the two render views each own their Bokeh sources and streaming, and live in
one Bokeh document, so the notebook shows a single widget.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from torchlens.model.messages import DdpHeartbeat
from torchlens.model.records import StepRecord, StepSummary


class _Held:
    """A widget that handles the browser's messages holding ``held_by`` (a
    lock; None: no lock). The browser's messages run on the kernel's thread and
    change what they are about (a Bokeh range the user panned: the document
    the drawing thread streams into; an ipywidget's state, whose pending keys
    are a set the drawing thread adds to): under the lock the drawing thread
    holds, the two never touch them at once."""

    held_by: Any = None

    def _handle_msg(self, msg: Any) -> Any:
        with self.held_by if self.held_by is not None else contextlib.nullcontext():
            return super()._handle_msg(msg)  # type: ignore[misc]


@functools.cache
def _held_class(base: type) -> type:
    return type(f"Held{base.__name__}", (_Held, base), {})


def held_widget(base: type, lock: Any, *args: Any, **kwargs: Any) -> Any:
    """A ``base`` widget (an ipywidgets class) made with ``args``, whose browser
    messages are handled under ``lock``."""
    widget = _held_class(base)(*args, **kwargs)
    widget.held_by = lock
    return widget


class ProfiledLiveView:
    """``render.ranks.view.RankProfileView`` + ``render.ddp.heartbeats.LivePlot`` in one widget
    (a ``model.feed.RankFeed``)."""

    def __init__(self, world_size: int, every: int | None, modelled: bool) -> None:
        from bokeh.layouts import column

        from torchlens.render.ddp.heartbeats import LivePlot
        from torchlens.render.ranks.view import RankProfileView

        self.profile = RankProfileView(world_size, every or 0, modelled)
        self.beats = LivePlot(world_size)
        self.layout = column(self.profile.layout, self.beats.layout, sizing_mode="stretch_width")
        self._widget: Any = None
        #: the lock the thread that draws this view holds (``torchlens.watch``'s): the
        #: widget takes the browser's messages under it
        self.lock: Any = None

    def for_run_feed(self, timeline: bool = False) -> None:
        """As ``torchlens.watch`` shows a ``torchlens run`` job: its heartbeats
        count no collectives, and its live feed's summaries have no ops (the
        ``timeline`` of a finished folder's full summaries stays), so those
        panels go rather than draw nothing. Its verdict is the status block's,
        above the view: the view does not repeat it."""
        self.beats.hide_collectives()
        self.profile.hide_verdict()
        if not timeline:
            self.profile.hide_timeline()

    @property
    def widget(self) -> Any:
        if self._widget is None:
            from jupyter_bokeh import BokehModel

            from torchlens.render.empty_ranges import hold_empty_ranges

            hold_empty_ranges(self.layout)  # its panels open with no rows
            self._widget = held_widget(BokehModel, self.lock, self.layout)
        return self._widget

    @property
    def flushes(self) -> int:
        return self.profile.flushes

    def start(self) -> None:
        """Nothing to set up: the view was built when it was asked for."""

    def push(self, hb: DdpHeartbeat) -> None:
        self.beats.push(hb)

    def push_steps(self, rank: int, records: list[StepRecord]) -> None:
        self.profile.push_steps(rank, records)

    def push_summary(self, rank: int, summary: StepSummary) -> None:
        self.profile.push_summary(rank, summary)

    def mark_restart(self, step: int, text: str) -> None:
        self.profile.mark_restart(step, text)

    def rank_ended(self, rank: int, reason: str, t: float | None) -> None:
        self.profile.rank_ended(rank, reason, t)

    def flush(self, force: bool = False) -> None:
        self.profile.flush(force)
        self.beats.flush(force)

    def close(self) -> None:
        """Nothing held open: the widget keeps what it shows."""

"""A one-line text progress of a %ddp_check run, for a terminal IPython.

Why: without a widgets front end a live Bokeh widget prints as its raw repr
(``BokehModel(render_bundle=...)``). A terminal user wants the same thing the
plot says in one line: how many ranks, each rank's phase, time elapsed.

On a terminal the line is rewritten in place (``\\r``) at most once a
``interval``; anywhere else (a log file) a new line is written only when a
rank's phase changes. A ``model.feed.RankFeed`` like the live plot: ``push``
heartbeats, ``flush`` from the launcher's loop, ``flush(force=True)`` at the
end; ``close`` ends the line (also after an interrupt); the line has no room
for step records, summaries or a rank's end (its phase says it).
"""

from __future__ import annotations

import shlex
import sys
import time
from typing import TextIO

from markupsafe import Markup

from torchlens.model.messages import DdpHeartbeat
from torchlens.model.records import StepRecord, StepSummary
from torchlens.model.units import format_seconds


class TextProgress:
    def __init__(self, world_size: int, stream: TextIO | None = None,
                 interval: float = 1.0) -> None:
        self.world_size = world_size
        self.stream = stream if stream is not None else sys.stdout
        self.interval = interval
        self.phases: list[str] = ["starting"] * world_size
        self.started = time.monotonic()
        self._last_write = 0.0
        self._last_phases: list[str] | None = None
        self._last_text = ""
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._width = 0
        self._open = False  # a \r line waiting for its newline
        self.lines = 0

    def start(self) -> None:
        """Nothing to set up."""

    def push(self, hb: DdpHeartbeat) -> None:
        if 0 <= hb.rank < self.world_size:
            self.phases[hb.rank] = str(hb.phase or "?")

    def push_steps(self, rank: int, records: list[StepRecord]) -> None:
        """Not shown: the line says each rank's phase."""

    def push_summary(self, rank: int, summary: StepSummary) -> None:
        """Not shown: the line says each rank's phase."""

    def rank_ended(self, rank: int, reason: str, t: float | None) -> None:
        """Not shown: the rank's last heartbeat says done or failed."""

    def line(self) -> str:
        ranks = ", ".join(f"rank {r} {p}" for r, p in enumerate(self.phases))
        elapsed = time.monotonic() - self.started
        return f"%ddp_check: {self.world_size} ranks · {ranks} · {format_seconds(elapsed)}"

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        changed = self.phases != self._last_phases
        if self._tty:
            if not force and now - self._last_write < self.interval:
                return
        elif not (force or changed):
            return
        text = self.line()
        if not self._tty and text == self._last_text:
            return  # a forced flush right after a change would print the same line again
        self._last_write, self._last_phases, self._last_text = now, list(self.phases), text
        if self._tty:
            pad = " " * max(0, self._width - len(text))
            self._width = len(text)
            self.stream.write("\r" + text + pad)
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.lines += 1

    def close(self) -> None:
        """End the progress line, so what follows starts on its own line."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


def running_note(world_size: int, run_dir: str) -> Markup:
    """The line above a --profile run's live view that a saved notebook keeps:
    the live view is a widget, which a notebook reopened after its kernel
    died shows as an error; this says where the ranks' records are."""
    return Markup(
        '<div style="color:#666">%ddp_check --profile: {} ranks started at {}; run folder '
        '<code>{}</code>. If this kernel dies before the run ends, the live view below '
        "(a widget: a reopened notebook then shows it as an error) is lost, and the run "
        "was cut off there; the folder keeps what the ranks recorded: "
        "<code>torchlens report {}</code></div>").format(
        world_size, time.strftime("%H:%M:%S"), run_dir, shlex.quote(run_dir))

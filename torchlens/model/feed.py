"""``RankFeed``: what whoever consumes a running job's rank data implements.

The launcher of ``%ddp_check`` and ``torchlens.watch`` push into one feed
(``frontends.shared.live_publish.RankSink``, which hands everything on to its live
view and sends memory to the sidebar); the views behind it (the profiled
live view, the heartbeat plot, the terminal's progress line) implement it
too. The launcher calls ``start`` once the ranks are spawned, then ``push``,
``push_steps``, ``push_summary`` and ``rank_ended`` as the data arrives with
``flush`` after each poll; ``close`` comes at the end. A consumer with
nothing to do for one of them says so with an empty method rather than
leaving it out, so that a missing method is an error where it is called,
never a silently skipped call.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torchlens.model.messages import DdpHeartbeat
from torchlens.model.records import StepRecord, StepSummary


@runtime_checkable
class RankFeed(Protocol):
    def start(self) -> None:
        """The ranks are starting: the moment for costly set-up (Bokeh imports)."""

    def push(self, heartbeat: DdpHeartbeat) -> None:
        """One rank's heartbeat (``rank``, ``t``, ``phase``, memory figures)."""

    def push_steps(self, rank: int, records: list[StepRecord]) -> None:
        """A batch of ``rank``'s step records, in step order."""

    def push_summary(self, rank: int, summary: StepSummary) -> None:
        """One profiled step's summary of ``rank``."""

    def rank_ended(self, rank: int, reason: str, t: float | None) -> None:
        """``rank`` stopped at unix time ``t``; ``reason`` in a few words."""

    def flush(self, force: bool = False) -> None:
        """Draw or send what was pushed (``force``: now, whatever the rate limit)."""

    def close(self) -> None:
        """The job is over: end what this feed holds open (a progress line)."""

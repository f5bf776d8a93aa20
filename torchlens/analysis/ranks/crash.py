"""A rank that failed only because a peer went away, and how it is said.

When one rank raises, its peers fail in their next collective: gloo raises
"Connection closed by peer" with its source path and a sign-off, NCCL and the
TCP store say much the same. That is the consequence, not the cause: the
verdict and the run's last line lead with the rank that raised, and say the
others in a few words ("rank 0 stopped when rank 1 went away (gloo:
connection closed by peer)"), never with the whole message.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

#: a rank's error that says a peer went away (gloo, NCCL, a TCP store)
_PEER_GONE = re.compile(r"connection (closed|reset) by peer|remote worker crash|remote process "
                        r"exited|broken pipe", re.I)
#: the transports whose words are recognised, as the error names them
_TRANSPORTS = (("gloo", "gloo"), ("nccl", "NCCL"), ("tcpstore", "TCP store"))


def peer_gone(error: Any) -> bool:
    """Whether ``error`` (a rank's goodbye's error) says a peer went away."""
    return bool(error) and bool(_PEER_GONE.search(str(error)))


def peer_gone_words(error: Any) -> str:
    """What the transport said, in a few words: ``gloo: connection closed by peer``."""
    m = _PEER_GONE.search(str(error or ""))
    said = m.group(0).lower() if m else "a peer went away"
    said = "a remote worker crashed" if said == "remote worker crash" else said
    low = str(error or "").lower()
    transport = next((name for key, name in _TRANSPORTS if key in low), None)
    return f"{transport}: {said}" if transport else said


def stopped_when(ranks: str, gone: str | None, error: Any) -> str:
    """``rank 0 stopped when rank 1 went away (gloo: connection closed by peer)``;
    ``ranks``, ``gone``: as ``slow.rank_list`` names them (``gone`` None: unknown)."""
    return f"{ranks} {went_away(gone, error)}"


def went_away(gone: str | None, error: Any) -> str:
    """``stopped when rank 1 went away (gloo: connection closed by peer)``."""
    return f"stopped when {gone or 'a peer'} went away ({peer_gone_words(error)})"


class ErrorRow(Protocol):
    """What ``error_words`` reads of a rank row (``verdict.RankRow``, ``RankStatus``)."""

    @property
    def rank(self) -> int: ...
    @property
    def state(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...


def error_words(rows: Sequence[ErrorRow]) -> dict[int, str]:
    """Each rank's error as a rank table says it (``rank`` -> words, for the
    rows with an error): a rank that failed only because a peer went away,
    as the run's last line says it (``stopped when rank 1 went away (gloo:
    connection closed by peer)``, the peer being the rank that failed of its
    own error, else the ranks that finished early: ``left_early``); any other
    error as the rank gave it."""
    cause = next((r.rank for r in rows if r.state == "failed"
                  and r.error and not peer_gone(r.error)), None)
    left = left_early(rows, {}) if cause is None else []
    gone = (f"rank {cause}" if cause is not None
            else ("rank " if len(left) == 1 else "ranks ") + ", ".join(map(str, left))
            if left else None)
    return {r.rank: (went_away(gone, r.error) if peer_gone(r.error) else str(r.error))
            for r in rows if r.error}


def left_early(rows: Sequence[ErrorRow], steps: dict[int, int | None]) -> list[int]:
    """The ranks that finished (said goodbye without an error) while every rank
    that failed failed only because a peer went away: the ranks that left the
    job early, when their loop ran out of batches before their peers' did.
    ``steps``: each rank's training steps (None: unknown). Empty when a rank
    failed of its own error (that rank is the cause), or none finished."""
    failed = [r for r in rows if r.state == "failed"]
    if not failed or not all(peer_gone(r.error) for r in failed):
        return []
    finished = [r.rank for r in rows if r.state == "finished" and not r.error]
    if not finished:
        return []
    # a rank that ran more steps than a failed one did not leave before it
    most = max((steps.get(r.rank) or 0 for r in failed), default=0)
    return [r for r in finished if (steps.get(r) or 0) <= most or not most]


def uneven_words(left: list[int], failed: list[int], steps: dict[int, int | None],
                 error: Any) -> str:
    """``rank 1 finished after 50 steps while rank 0 was still training: rank 0
    failed in its next collective (gloo: connection closed by peer)``."""
    def who(ranks: list[int]) -> str:
        return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
    counts = sorted({steps.get(r) for r in left} - {None})
    after = (f" after {counts[0]} steps" if len(counts) == 1 else "")
    verb = "was" if len(failed) == 1 else "were"
    return (f"uneven inputs: {who(left)} finished{after} while {who(failed)} {verb} still "
            f"training: {who(failed)} failed in the next collective when "
            f"{'it' if len(left) == 1 else 'they'} left ({peer_gone_words(error)})")

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
    own error); any other error as the rank gave it."""
    cause = next((r.rank for r in rows if r.state == "failed"
                  and r.error and not peer_gone(r.error)), None)
    gone = None if cause is None else f"rank {cause}"
    return {r.rank: (went_away(gone, r.error) if peer_gone(r.error) else str(r.error))
            for r in rows if r.error}

"""A notebook job's per-rank series, published through the Jupyter server's ``/metrics``.

``%ddp_check --profile --metrics`` and ``torchlens.watch(..., metrics=True)``
feed a ``MetricsFeed`` what they feed their live view; every ``interval``
seconds (and once at the end) it turns what it holds into the series
``torchlens run --metrics`` exports (``analysis.ranks.notebook_metrics``) and
POSTs them to the kernel's own Jupyter server (``rank_channel``: the server's
token, the channel the sidebar's rank samples use), which serves them on its
``/metrics`` (docs/METRICS.md). The run label is the run folder's name (or
the run id): nothing of the job's code travels.

Best effort, like the sidebar's samples: a server that refuses or does not
answer costs the cell at most the channel's timeout per post and never
stops it; ``failures`` and ``last_error`` say what went wrong, and the
front end says it once at the end.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from torchlens.analysis.ranks.notebook_metrics import NotebookRun
from torchlens.frontends.shared.rank_channel import RankPublisher
from torchlens.model import InputError
from torchlens.model.messages import DdpHeartbeat
from torchlens.model.records import StepRecord, StepSummary

if TYPE_CHECKING:
    from torchlens.analysis.ranks.verdict import LiveStatus

PATH = "torchlens/monitor/metrics"
#: seconds between posts: Prometheus scrapes every 15 s or so
INTERVAL_S = 5.0


def needs_server(what: str, publisher: RankPublisher | None = None) -> RankPublisher:
    """The channel to this kernel's Jupyter server; InputError when there is none."""
    publisher = publisher if publisher is not None else RankPublisher("metrics")
    if not publisher.enabled:
        raise InputError(f"{what}: the series go to the Jupyter server that started this "
                         "kernel, and none was found (in another kernel, set "
                         "TORCHLENS_SERVER_URL and TORCHLENS_SERVER_TOKEN)")
    return publisher


class MetricsFeed:
    """A ``RankFeed`` that keeps a ``NotebookRun`` and posts its series."""

    def __init__(self, run: str, world_size: int, publisher: RankPublisher,
                 interval: float = INTERVAL_S, where: dict[str, Any] | None = None) -> None:
        self.job = NotebookRun(run, world_size, where)
        self.publisher = publisher
        self.interval = interval
        self.sent = 0
        self._last = float("-inf")

    def start(self) -> None:
        pass

    def push(self, hb: DdpHeartbeat) -> None:
        if hb.t is not None:
            self.job.heartbeat(hb.rank, float(hb.t), hb.node, hb.host)

    def push_steps(self, rank: int, records: list[StepRecord]) -> None:
        self.job.add_steps(rank, records)

    def push_summary(self, rank: int, summary: StepSummary) -> None:
        self.job.add_summary(rank, summary)

    def rank_ended(self, rank: int, reason: str, t: float | None) -> None:
        self.job.ended(rank, reason, t)

    def take_status(self, status: LiveStatus | None) -> None:
        self.job.take_status(status)

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        try:
            families = self.job.families(time.time())
        except Exception as exc:  # noqa: BLE001 - a figure that fails must not stop the job
            self.publisher.failures += 1
            self.publisher.last_error = f"{type(exc).__name__}: {exc}"
            return
        body = {"run": self.job.run, "families": [
            {"name": f.name, "samples": [[s, labels, v] for s, labels, v in f.samples]}
            for f in families if f.samples]}
        if self.publisher.post(PATH, body):
            self.sent += 1

    def close(self) -> None:
        """The job is over: its final figures (how each rank ended) go now."""
        self.flush(force=True)

    def trouble(self) -> str:
        """One line when posts failed (empty when none did)."""
        if not self.publisher.failures:
            return ""
        return (f"metrics: {self.publisher.failures} post(s) to the Jupyter server failed "
                f"({self.publisher.last_error}); {self.sent} went through")


class Tee:
    """Feeds several ``RankFeed``s the same pushes (the live view and the metrics)."""

    def __init__(self, *feeds: Any) -> None:
        self.feeds = [f for f in feeds if f is not None]

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            for f in self.feeds:
                getattr(f, name)(*args, **kwargs)
        return call


def this_machine() -> dict[str, Any]:
    """Where a ``%ddp_check`` without ``--nnodes`` runs every rank: this host, node 0
    (``torchlens run``'s labels: ``GROUP_RANK``, and the rank's host name)."""
    import socket

    return {"node": 0, "host": socket.gethostname()}


def watch_feed(target: str, source: Any, publisher: RankPublisher | None) -> MetricsFeed | None:
    """``torchlens.watch``'s feed (None without ``metrics=True``), labelled as
    ``torchlens run --metrics`` labels the run: its folder's name, else its run id."""
    if publisher is None:
        return None
    import os

    name = (os.path.basename(os.path.normpath(target)) if os.path.isdir(target)
            else str(source.key.run_id))
    return MetricsFeed(name, 0, publisher)

"""torchlens's GPU and host series on the Jupyter server's own ``/metrics``.

jupyter_server serves ``prometheus_client.REGISTRY`` at ``/metrics``, behind
its token unless the user set ``authenticate_prometheus=False``. This adds a
collector that reads the newest sample of the sidebar's sampler (the one
``Monitor``: no second NVML poller) and turns it into series
(``analysis.monitor_metrics``). A scrape does not wake the sampler: a server
nobody watches samples every ``idle_interval`` (10 s), and
``torchlens_monitor_sample_age_seconds`` says how old the figures are.

It also yields the per-rank series notebook kernels published
(``notebook_metrics``: ``%ddp_check --profile --metrics``, ``torchlens.watch(...,
metrics=True)``), the newest batch of each run.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import Metric

from torchlens.analysis.monitor_metrics import machine_families
from torchlens.frontends.server.notebook_metrics import NotebookRuns


class MonitorCollector:
    """A ``prometheus_client`` custom collector over a ``Monitor``'s history (none: no series)."""

    def __init__(self, monitor: Any = None, host: str | None = None,
                 notebook: NotebookRuns | None = None) -> None:
        self.monitor = monitor
        self.notebook = notebook
        self.host = host or socket.gethostname()

    def collect(self) -> Iterator[Metric]:
        monitor, notebook = self.monitor, self.notebook
        if monitor is None:
            return
        items, _ = monitor.history.tail(monitor.history.seq - 1)
        families = machine_families(items[-1] if items else None, self.host, time.time())
        if notebook is not None:
            families += notebook.families()
        for family in families:
            if not family.samples:
                continue
            # prometheus_client names a counter's family without "_total" (it adds it)
            base = family.name.removesuffix("_total") if family.kind == "counter" else family.name
            metric = Metric(base, family.help, family.kind)
            for suffix, labels, value in family.samples:
                metric.add_sample(family.name + suffix, labels, value)
            yield metric


#: one per process: the registry refuses a second collector of the same names
#: (a process that loads the extension into a second server, as tests do)
_COLLECTOR: MonitorCollector | None = None


def register(monitor: Any, notebook: NotebookRuns | None = None) -> MonitorCollector:
    """The process's collector, now reading ``monitor`` (and ``notebook``'s runs)."""
    global _COLLECTOR
    if _COLLECTOR is None:
        _COLLECTOR = MonitorCollector()
        REGISTRY.register(_COLLECTOR)
    _COLLECTOR.monitor, _COLLECTOR.notebook = monitor, notebook
    return _COLLECTOR


def unregister(collector: MonitorCollector | None) -> None:
    """Its series go (the collector stays registered, empty, for the next server)."""
    if collector is not None:
        collector.monitor = collector.notebook = None

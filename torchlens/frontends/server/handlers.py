"""REST handlers of the GPU monitor, all behind the Jupyter server's own auth.

Endpoints (relative to the server's base_url, e.g. ``/user/alice/``):

* ``WS   torchlens/monitor/ws`` - the sidebar's live feed (``stream.py``):
  history on connect, then each new sample pushed, encoded once for all
  sockets.
* ``GET  torchlens/monitor/samples?since=T&wait=S`` - samples newer than T
  (epoch seconds; 0 = the whole history) plus per-rank samples. With
  ``wait`` the request is held up to S seconds until a new sample exists
  (long polling). The sidebar's fallback when no WebSocket gets through
  (some proxies), and simple to script against; it costs the server about
  1 ms per answer, which is why the sidebar prefers the socket.
* ``GET|PUT torchlens/monitor/config`` - read / set ``{"interval": s}``.
* ``POST torchlens/monitor/ranks`` - a kernel publishes per-rank memory
  (see ``torchlens/frontends/shared/rank_channel.py`` for the channel);
  ``GET torchlens/monitor/ranks?since=T`` - the per-rank samples newer than T.
* ``POST torchlens/monitor/metrics`` - a kernel publishes a run's per-rank
  series for the server's ``/metrics`` (``notebook_metrics.py``).
* ``GET  torchlens/monitor/history.csv`` - the history as CSV.
* ``GET  torchlens/runs`` - the ``torchlens run`` jobs of this machine and their
  ranks (``{"t", "registry", "runs": [...]}``, see ``RunsHandler``).

Without the server's token (or login cookie) every one answers 403.
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
import tornado.web
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join

from torchlens.frontends.monitor.sampler import Monitor
from torchlens.frontends.ranks.registry import RecentRuns, registry_dir
from torchlens.frontends.server.stream import SamplesSocket, tag_kernels

MAX_WAIT = 30.0


class _MonitorHandler(APIHandler):
    """Common base: the monitor instance is in the tornado settings."""

    @property
    def monitor(self) -> Monitor:
        return self.settings["torchlens_monitor"]

    def _json_body(self) -> dict[str, Any]:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as err:
            raise tornado.web.HTTPError(400, "body is not JSON") from err
        if not isinstance(body, dict):
            raise tornado.web.HTTPError(400, "body must be a JSON object")
        return body


class SamplesHandler(_MonitorHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        mon = self.monitor
        mon.touch()
        since = _float_arg(self, "since", 0.0)
        wait = min(MAX_WAIT, max(0.0, _float_arg(self, "wait", 0.0)))
        await mon.wait_for_newer(since, wait)
        samples = mon.history.since(since)
        tag_kernels(samples, self.settings)
        self.finish(
            {
                "interval": mon.interval,
                "samples": msgspec.to_builtins(samples),
                "ranks": msgspec.to_builtins(mon.ranks.since(since)),
            }
        )


class ConfigHandler(_MonitorHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.finish(self._config())

    @tornado.web.authenticated
    def put(self) -> None:
        body = self._json_body()
        interval = body.get("interval")
        if not isinstance(interval, int | float) or isinstance(interval, bool):
            raise tornado.web.HTTPError(400, "expected {'interval': seconds}")
        self.monitor.set_interval(interval)
        self.finish(self._config())

    def _config(self) -> dict[str, float]:
        """The sampler's settings as the page reads them (``MonitorConfig``'s JSON)."""
        mon = self.monitor
        return msgspec.to_builtins(MonitorConfig(
            interval=mon.interval, idle_interval=mon.idle_interval, idle_after=mon.idle_after,
            history_seconds=mon.history.seconds))


class MonitorConfig(msgspec.Struct, frozen=True):
    """``torchlens/monitor/config``: seconds between samples while watched and
    when idle, how long until idle, and how much history is kept."""

    interval: float
    idle_interval: float
    idle_after: float
    history_seconds: float


class RanksHandler(_MonitorHandler):
    """Per-rank memory: a kernel POSTs ``{"run": str, "samples": [{rank, t, device,
    allocated, reserved, inactive_split, largest_free, source}]}`` (the last
    three optional: ``%ddp_check --profile``'s allocator figures); GET answers
    ``{"ranks": [...]}`` newer than ``since``. A sample that is not what
    ``monitor.rank_sample`` accepts (numbers or null, ``source`` from a fixed
    set) refuses the whole batch with 400. Any other method (PUT, DELETE) is
    405, tornado's answer for a method the class does not define."""

    @tornado.web.authenticated
    def get(self) -> None:
        self.finish({"ranks": msgspec.to_builtins(
            self.monitor.ranks.since(_float_arg(self, "since", 0.0)))})

    @tornado.web.authenticated
    def post(self) -> None:
        body = self._json_body()
        run, samples = body.get("run"), body.get("samples")
        if not isinstance(run, str) or not isinstance(samples, list):
            raise tornado.web.HTTPError(400, "expected {'run': str, 'samples': [...]}")
        try:
            stored = self.monitor.add_rank_samples(run[:200], samples)
        except (KeyError, TypeError, ValueError) as err:
            raise tornado.web.HTTPError(400, f"bad sample: {err}") from err
        self.finish({"stored": stored})


class MetricsHandler(_MonitorHandler):
    """A kernel's run series: ``{"run": str, "families": [{"name", "samples":
    [[suffix, labels, value]]}]}`` replaces that run's batch; anything
    ``notebook_metrics.checked`` refuses is 400, the whole batch."""

    @tornado.web.authenticated
    def post(self) -> None:
        runs = self.settings.get("torchlens_notebook_metrics")
        if runs is None:
            raise tornado.web.HTTPError(404, "this server does not keep notebook metrics")
        try:
            stored = runs.put(self._json_body())
        except ValueError as err:
            raise tornado.web.HTTPError(400, f"bad metrics: {err}") from err
        self.finish({"stored": stored})


class CsvHandler(_MonitorHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.set_header(
            "Content-Disposition", 'attachment; filename="torchlens-gpu-monitor.csv"'
        )
        self.finish(self.monitor.to_csv(), set_content_type="text/csv; charset=utf-8")


class RunsHandler(APIHandler):
    """The ``torchlens run`` jobs registered on this machine (``frontends/run_registry``).

    ``{"t": now, "registry": dir, "runs": [{run_id, run_dir, collector, pid,
    command: [words], started, state: starting|running|ended, stopped, ended,
    live: null | {t, age_s, world_size, verdict, verdict_code, verdict_ranks,
    ended, restarts, dropped,
    ranks: [{rank, node, host, state, restart, steps, step_ms, data_ms,
    allocated, reserved, rss, ..., source, error}]}}]}``. It reads the
    registry and the live.json (and, once a run ended, manifest.json) of the
    folders named there, nothing else, and runs nothing; every value is
    type-checked first (``run_registry.live_status``).
    """

    @tornado.web.authenticated
    def get(self) -> None:
        recent = self.settings.get("torchlens_runs")
        if recent is None:  # one per server: it remembers runs it saw that went away
            recent = self.settings["torchlens_runs"] = RecentRuns()
        self.finish({"t": time.time(), "registry": recent.folder or registry_dir(),
                     "runs": recent.runs()})


def handlers(base_url: str) -> list[tuple[str, type[JupyterHandler]]]:
    """URL patterns under the server's base_url."""
    root = url_path_join(base_url, "torchlens", "monitor")
    return [
        (url_path_join(root, "ws"), SamplesSocket),
        (url_path_join(root, "samples"), SamplesHandler),
        (url_path_join(root, "config"), ConfigHandler),
        (url_path_join(root, "ranks"), RanksHandler),
        (url_path_join(root, "metrics"), MetricsHandler),
        (url_path_join(root, "history.csv"), CsvHandler),
        (url_path_join(base_url, "torchlens", "runs"), RunsHandler),
    ]


def _float_arg(handler: APIHandler, name: str, default: float) -> float:
    raw = handler.get_query_argument(name, None)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError as err:
        raise tornado.web.HTTPError(400, f"{name} must be a number") from err

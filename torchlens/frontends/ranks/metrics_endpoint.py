"""``torchlens run --metrics [HOST:]PORT``: the job's series at ``/metrics`` while it runs.

The collector hands each batch of step records to the step histograms as it
keeps them (``Collector.listeners``). The collector's loop (``command.watch``)
calls ``MetricsEndpoint.tick`` each poll: it keeps the newest ``RunView`` (the one the terminal or the live
feed computed; its own when theirs is old). A scrape, in the HTTP server's
thread, formats what the loop last kept: it never polls the collector nor
computes a verdict, and the loop never waits for a scrape.

At the end, ``close(linger=True)`` keeps serving the final view (how each
rank ended: a killed rank ``lost``, a crash ``failed``) until Prometheus has
scraped it once, at most two scrape intervals (as seen so far: one scrape may
come late or fail on a loaded machine) and a second, or ``LINGER_MAX_S``: else the job's end would reach Prometheus only as
``up == 0``, and no rank-state alert would fire for a job that crashed.
Only a request whose User-Agent is Prometheus's (``Prometheus/<version>``,
sent on every scrape) counts as a scrape there: a user's curl loop with the
token gets the figures too, but it neither ends the hold nor sets its length.

Every request must carry ``Authorization: Bearer <token>``; the token is new
for every run, in ``RUN_DIR/metrics.token`` (0600), deleted at the end, or
the user's own from ``--metrics-token-file`` (read, never deleted: a fixed
Prometheus config across runs; docs/METRICS.md). Bound to 127.0.0.1 unless
a host is named.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from torchlens.analysis.ranks.metrics import StepHistograms, metric_families
from torchlens.analysis.ranks.verdict import RunView, run_view
from torchlens.capture.channel.store import interface_address
from torchlens.model import InputError
from torchlens.render.metrics_text import CONTENT_TYPE, exposition

TOKEN_FILE = "metrics.token"
#: a view older than this (or than ``VIEW_COST_FACTOR`` x its cost) is computed again
VIEW_EVERY_S = 5.0
VIEW_COST_FACTOR = 10
#: at the end, how long the endpoint waits at most for a scrape of the final view
LINGER_MAX_S = 20.0
#: how Prometheus's scrapes start their User-Agent header (every version sends it)
PROMETHEUS_AGENT = "prometheus/"


def parse_address(spec: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[IPV6]:PORT`` -> (host, port); host 127.0.0.1 when not named."""
    host, port = "127.0.0.1", spec
    if spec.startswith("["):
        inside, _, rest = spec[1:].partition("]")
        if not rest.startswith(":"):
            raise InputError(f"--metrics {spec}: write an IPv6 address as [ADDRESS]:PORT")
        host, port = inside, rest[1:]
    elif ":" in spec:
        host, _, port = spec.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise InputError(f"--metrics {spec}: expected [HOST:]PORT (a port from 0 to 65535, "
                         "e.g. 9464 or 0.0.0.0:9464)")
    return host, int(port)


def write_token(path: str) -> str:
    """A new bearer token in a 0600 file (no newline: Prometheus reads the file as is)."""
    token = secrets.token_urlsafe(32)
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token


def read_token(path: str) -> str:
    """The bearer token in the user's file (``--metrics-token-file``); InputError, one
    line, when it is missing, empty, or readable by group or others. Surrounding
    white space is not part of it (Prometheus trims the file's content too)."""
    what = f"--metrics-token-file {path}"
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
    except FileNotFoundError:
        raise InputError(f"{what} does not exist: make it first, e.g. "
                         f"(umask 077; openssl rand -hex 32 > {path})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} cannot be read ({getattr(exc, 'strerror', None) or exc})") \
            from None
    if st.st_mode & 0o077:
        raise InputError(f"{what} is readable by group or others (mode "
                         f"{oct(st.st_mode & 0o777)[2:]}): chmod 600 {path}")
    if not token:
        raise InputError(f"{what} is empty: write a token into it (e.g. openssl rand -hex 32)")
    return token


class MetricsEndpoint:
    """The HTTP server and what the loop hands it."""

    def __init__(self, host: str, port: int, run_dir: str, token_file: str | None = None) -> None:
        address = interface_address(host)
        self.run = os.path.basename(os.path.normpath(run_dir))
        #: the user's token file (kept), else this run's own (deleted at the end)
        self.own_token = token_file is None
        self.token_path = os.path.join(run_dir, TOKEN_FILE) if token_file is None else token_file
        self.histograms = StepHistograms()
        self.view: RunView | None = None
        self._view_at = float("-inf")
        self._view_cost = 0.0
        self._seen: dict[int, float] = {}  # rank -> when its heartbeat last changed (monotonic)
        self._scrapes: list[float] = []  # Prometheus's last two scrapes (monotonic)
        self._collector: Any = None  # the one whose batches the histograms count
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        server_class = type("Server", (_Server,), {"address_family": family})
        self.server = server_class((address, port), _handler(self))
        self.host, self.port = self.server.server_address[:2]
        self.token = write_token(self.token_path) if self.own_token else read_token(token_file)
        self._thread = threading.Thread(target=self.server.serve_forever, name="torchlens-metrics",
                                        daemon=True)
        self._thread.start()

    def _took(self, s: Any, kind: int, values: list[Any]) -> None:
        """The collector kept ``values`` of slot ``s`` (kind 0: step records)."""
        if kind == 0:
            self.histograms.add(s.rank, values)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def tick(self, collector: Any, view: RunView | None) -> None:
        """In the collector's loop: keep the newest view (and, the first time,
        count what the collector kept so far and listen for every batch after)."""
        if self._collector is None:
            self._collector = collector
            for s in collector.all_slots():
                self._took(s, 0, s.steps)
            collector.listeners.append(self._took)
        seen = {}
        for s in collector.all_slots():  # slot order: a rank's latest start comes last
            seen[s.rank] = s.seen
        self._seen = seen
        now = time.monotonic()
        if view is None and now - self._view_at >= max(VIEW_EVERY_S,
                                                      VIEW_COST_FACTOR * self._view_cost):
            view = run_view(collector.snapshot())
            self._view_cost = time.monotonic() - now
        if view is not None:
            self.view = view
            # stamped after the swap: a scrape that began at or after this time read it
            self._view_at = time.monotonic()

    def body(self) -> str:
        """One scrape (in the server's thread: reads only what ``tick`` replaced whole)."""
        view = self.view
        if view is None:
            return ""
        now = time.monotonic()
        ages = {r: max(0.0, now - t) for r, t in self._seen.items()}
        return exposition(metric_families(view, self.run, dict(self.histograms.ranks), ages))

    def authorized(self, header: str | None) -> bool:
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                                  self.token.encode())

    def scraped(self, user_agent: str | None, began: float) -> None:
        """A request begun at ``began`` (monotonic, before it read the view) was
        answered; only Prometheus's own count for the hold. Counted once the answer
        is written, so the hold never shuts the server under it; timed by when it
        read the view, so an answer of the view before the last ``tick`` does not
        pass for a scrape of the last."""
        if (user_agent or "").lower().startswith(PROMETHEUS_AGENT):
            self._scrapes = [*self._scrapes[-1:], began]

    def linger_s(self) -> float:
        """How long to wait for a scrape of the final view: 0 when Prometheus
        has not scraped twice (its interval unknown)."""
        if len(self._scrapes) < 2:
            return 0.0
        return min(LINGER_MAX_S, 2 * (self._scrapes[1] - self._scrapes[0]) + 1.0)

    def close(self, linger: bool = False) -> None:
        """Stop serving; ``linger``: after a scrape of the view ``tick`` kept last."""
        if linger:
            # from now, not from the final tick: writing the folder and the feed's
            # own hold come between, and on a loaded machine they outlasted it
            since = self._view_at
            deadline = time.monotonic() + self.linger_s()
            try:
                while time.monotonic() < deadline and self._scrapes[-1] < since:
                    time.sleep(0.05)
            except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
                pass
        if self._collector is not None:
            with contextlib.suppress(ValueError):
                self._collector.listeners.remove(self._took)
        self.server.shutdown()
        self.server.server_close()
        if self.own_token:
            with contextlib.suppress(OSError):
                os.remove(self.token_path)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer's own looks the address up in DNS (getfqdn): seconds before
        # the job starts on a machine whose resolver does not answer
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


def _handler(endpoint: MetricsEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if not endpoint.authorized(self.headers.get("Authorization")):
                self._send(401, "a bearer token is needed: the run folder's "
                           f"{TOKEN_FILE} (docs/METRICS.md)\n",
                           {"WWW-Authenticate": 'Bearer realm="torchlens"'})
            elif self.path.split("?", 1)[0] != "/metrics":
                self._send(404, "torchlens serves /metrics only\n")
            else:
                began = time.monotonic()
                self._send(200, endpoint.body(), {}, CONTENT_TYPE)
                endpoint.scraped(self.headers.get("User-Agent"), began)

        def _send(self, code: int, text: str, headers: dict[str, str] | None = None,
                  kind: str = "text/plain; charset=utf-8") -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # a scrape every 15 s is not news for the terminal

    return Handler


def serve(address: tuple[str, int], run_dir: str, say: Callable[[str], None],
          token_file: str | None = None) -> MetricsEndpoint | None:
    """The endpoint, or None after one line when it cannot listen (the job runs without it)."""
    host, port = address
    try:
        endpoint = MetricsEndpoint(host, port, run_dir, token_file)
    except OSError as exc:
        say(f"torchlens run: metrics: cannot listen on {host}:{port} "
            f"({exc.strerror or exc}); the job runs without metrics")
        return None
    say(f"torchlens run: metrics at {endpoint.url} (bearer token in {endpoint.token_path})")
    return endpoint

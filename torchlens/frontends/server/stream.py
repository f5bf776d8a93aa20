"""WebSocket push of the GPU monitor's samples: one socket per sidebar, one encode per sample.

Why a socket when long polling already works: each long-poll answer costs
the Jupyter server about 1 ms of request handling (auth, handler set-up, JSON
encoding per client), which at 2 Hz with three tabs was most of the
monitor's CPU. Over a socket the auth happens once at connect, and each new
sample is JSON-encoded once and written as the same bytes to every open socket.

Endpoint: ``<base_url>torchlens/monitor/ws`` (authenticated at the handshake
exactly like jupyter_server's kernel and terminal sockets: the server's
token, as ``?token=`` or ``Authorization`` header, or its login cookie; no
user -> 403; a foreign ``Origin`` -> 403).

Server -> client (text frames, JSON):

* ``{"type": "samples", "history": true, "interval": s, "samples": [...],
  "ranks": [...]}`` right after connect: the whole history (or, with
  ``?since=t`` in the URL, what is newer than ``t``), so a reloaded page keeps
  it and a reconnecting one gets just the gap; then the same shape with ``"history": false`` per new sample (or
  batch of rank samples a kernel posted).

Client -> server:

* ``{"pause": true}`` stops sending to this socket (and it no longer keeps
  the sampler at full rate); ``{"pause": false, "since": t}`` resumes and
  first sends the history newer than ``t``, filling the gap.
* ``{"interval": s}`` sets the server-wide sampling interval.

The REST endpoints in ``handlers.py`` stay: the sidebar falls back to long
polling when a socket cannot be opened (e.g. a proxy without WebSocket
support), and kernels POST rank samples there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
from jupyter_core.utils import ensure_async
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from torchlens.frontends.monitor.sampler import Monitor
from torchlens.model.samples import MachineSample, RankSample

AUTH_RESOURCE = "torchlens"


def kernel_pids(settings: dict[str, Any]) -> dict[int, str]:
    """pid -> kernel id of this server's running kernels (to flag them in process lists)."""
    km = settings.get("kernel_manager")
    pids: dict[int, str] = {}
    if km is None:
        return pids
    for kid in list(km.list_kernel_ids()):
        try:
            pid = getattr(km.get_kernel(kid).provisioner, "pid", None)
        except (KeyError, AttributeError):
            continue
        if pid:
            pids[int(pid)] = kid
    return pids


#: What the sidebar says under a GPU's processes when NVML's pids are the host's.
HOST_PIDS_NOTE = ("process ids are the host's (the server runs in a container); "
                  "names not shown, kernels not matched")

#: How many parents up a GPU process may be from its kernel (kernel -> launcher -> rank ...).
MAX_PARENT_DEPTH = 8


def psutil_parent(pid: int) -> int | None:
    """Parent pid of ``pid``, or None when it is gone or not visible (other container, no access)."""
    try:
        import psutil

        return psutil.Process(pid).ppid()
    except Exception:  # noqa: BLE001 - any failure just means "not ours"
        return None


def kernel_of(
    pid: int,
    kernels: dict[int, str],
    parent_of: Callable[[int], int | None] = psutil_parent,
    max_depth: int = MAX_PARENT_DEPTH,
) -> tuple[str, bool] | None:
    """(kernel id, is a descendant) if ``pid`` is one of ``kernels`` or started by one, else None.

    Why the parent chain: DDP ranks (``%ddp_check``, torchrun, mp.spawn) are
    started by the kernel, often with ``start_new_session``, so neither their
    pid nor their process group is the kernel's; their ancestry still is. The
    walk is bounded and stops at init (pid 1 adopts orphans: an orphan is no
    longer any kernel's) or on any lookup failure.
    """
    if pid in kernels:
        return kernels[pid], False
    seen, current = {pid}, pid
    for _ in range(max_depth):
        parent = parent_of(current)
        if parent is None or parent <= 1 or parent in seen:
            return None
        if parent in kernels:
            return kernels[parent], True
        seen.add(parent)
        current = parent
    return None


def tag_kernels(
    samples: list[MachineSample],
    settings: dict[str, Any],
    parent_of: Callable[[int], int | None] = psutil_parent,
) -> None:
    """Mark the newest sample's GPU processes that are this server's kernels or their children.

    Each process gets ``kernel`` (the kernel id, or None) and ``kernel_child``
    (True for a process the kernel started, e.g. a DDP rank). Only the newest
    sample is tagged because only it is drawn as text; parent lookups are
    shared across GPUs (one rank may hold memory on several).

    When the sampler says NVML's pids are the host's (``pids == "host"``: the
    server runs in a container), they are not this server's pids: walking
    their parents would look up whatever local process has that number, so
    nothing is tagged and ``pids_note`` says why (the sidebar shows it).
    """
    if not samples:
        return
    gpu_sample = samples[-1].gpu
    if gpu_sample.pids == "host":
        gpu_sample.pids_note = HOST_PIDS_NOTE
        for gpu in gpu_sample.gpus:
            for proc in gpu.processes:
                proc.kernel, proc.kernel_child = None, False
        return
    kernels = kernel_pids(settings)
    parents: dict[int, int | None] = {}

    def cached_parent(pid: int) -> int | None:
        if pid not in parents:
            parents[pid] = parent_of(pid)
        return parents[pid]

    for gpu in gpu_sample.gpus:
        for proc in gpu.processes:
            found = kernel_of(proc.pid, kernels, cached_parent) if kernels else None
            proc.kernel = None if found is None else found[0]
            proc.kernel_child = found is not None and found[1]


class Broadcaster:
    """Fans each new sample out to every open, unpaused socket; runs on the server's loop.

    It keeps sequence cursors into the monitor's histories, so every sample
    reaches a socket exactly once: history on connect covers up to the
    cursors, broadcasts cover what comes after them.
    """

    def __init__(self, monitor: Monitor, settings: dict[str, Any]) -> None:
        self.monitor = monitor
        self.settings = settings
        self.sockets: set[SamplesSocket] = set()
        self.sample_seq = monitor.history.seq
        self.rank_seq = monitor.ranks.seq
        self.messages_sent = 0
        monitor.add_listener(self.publish)

    def close(self) -> None:
        """Detach from the monitor and close every socket (server shutdown)."""
        self.monitor.remove_listener(self.publish)
        for ws in list(self.sockets):
            ws.close()
        self.sockets.clear()

    def publish(self) -> None:
        """Called by the monitor on the loop after new samples/ranks: encode once, write to all."""
        samples, self.sample_seq = self.monitor.history.tail(self.sample_seq)
        ranks, self.rank_seq = self.monitor.ranks.tail(self.rank_seq)
        if not self.sockets or not (samples or ranks):
            return
        tag_kernels(samples, self.settings)
        payload = self.encode(samples, ranks, history=False)
        for ws in list(self.sockets):
            ws.send(payload)
        self.messages_sent += 1

    def backlog(self, since: float) -> bytes:
        """History newer than ``since`` up to the broadcast cursors, encoded for one socket."""
        samples, _ = self.monitor.history.tail(0, upto=self.sample_seq)
        ranks, _ = self.monitor.ranks.tail(0, upto=self.rank_seq)
        if since > 0:
            samples = [s for s in samples if s.t > since]
            ranks = [r for r in ranks if r.t > since]
        tag_kernels(samples, self.settings)
        return self.encode(samples, ranks, history=True)

    def encode(
        self, samples: list[MachineSample], ranks: list[RankSample], history: bool
    ) -> bytes:
        message = {
            "type": "samples",
            "history": history,
            "interval": self.monitor.interval,
            "samples": msgspec.to_builtins(samples),
            "ranks": msgspec.to_builtins(ranks),
        }
        # bytes, so tornado frames them without re-encoding per socket
        return json.dumps(message, separators=(",", ":")).encode()

    def attach(self, ws: SamplesSocket, since: float = 0.0) -> None:
        """Start sending to ``ws``: its backlog first, then every broadcast."""
        if ws in self.sockets:
            return
        ws.send(self.backlog(since))
        self.sockets.add(ws)
        self.monitor.watch(+1)

    def detach(self, ws: SamplesSocket) -> None:
        if ws in self.sockets:
            self.sockets.discard(ws)
            self.monitor.watch(-1)


class SamplesSocket(WebSocketMixin, WebSocketHandler, JupyterHandler):
    """``torchlens/monitor/ws``: built like jupyter_server's ``KernelWebsocketHandler``.

    ``WebSocketMixin`` first in the MRO gives jupyter_server's origin check
    (Origin must match Host or the server's allow_origin settings), keep-alive
    pings, and a ``prepare`` that authenticates without redirecting to the
    login page; ``JupyterHandler`` supplies the identity provider (token,
    cookie, JupyterHub) and the authorizer.
    """

    auth_resource = AUTH_RESOURCE

    def set_default_headers(self) -> None:
        """JupyterHandler's default headers (CSP etc.) make no sense on a 101 answer."""

    def get_compression_options(self) -> dict[str, Any] | None:
        """Honour the server's ``websocket_compression_options``, like the kernel socket."""
        return self.settings.get("websocket_compression_options", None)

    async def get(self, *args: Any, **kwargs: Any) -> None:
        # prepare() already refused anonymous users; checked again here like
        # jupyter_server's own sockets, then the authorizer (as for kernels)
        user = self.current_user
        if user is None:
            self.log.warning("Couldn't authenticate torchlens monitor WebSocket")
            raise web.HTTPError(403)
        if not await ensure_async(
            self.authorizer.is_authorized(self, user, "read", AUTH_RESOURCE)
        ):
            raise web.HTTPError(403)
        await super().get(*args, **kwargs)

    @property
    def hub(self) -> Broadcaster:
        return self.settings["torchlens_broadcaster"]

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open(*args, **kwargs)  # starts the keep-alive pings
        # ?since=t: a reconnecting sidebar only needs what it has not drawn yet
        try:
            since = float(self.get_argument("since", "0"))
        except ValueError:
            since = 0.0
        self.hub.attach(self, since)

    def on_message(self, message: str | bytes) -> None:
        try:
            body = json.loads(message)
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        interval = body.get("interval")
        if isinstance(interval, int | float) and not isinstance(interval, bool):
            self.hub.monitor.set_interval(interval)
        pause = body.get("pause")
        if pause is True:
            self.hub.detach(self)
        elif pause is False:
            since = body.get("since", 0.0)
            self.hub.attach(
                self, float(since) if isinstance(since, int | float) else 0.0
            )

    def on_close(self) -> None:
        self.hub.detach(self)
        if self.ping_callback is not None:
            self.ping_callback.stop()

    def send(self, payload: bytes) -> None:
        """Queue ``payload`` as a text frame; a socket that has gone away is dropped."""
        try:
            future = self.write_message(payload)
        except WebSocketClosedError:
            self.hub.detach(self)
            return
        # a peer vanishing mid-write fails the future: retrieve it, no log noise
        future.add_done_callback(_ignore_closed)


def _ignore_closed(future: Any) -> None:
    if not future.cancelled():
        future.exception()

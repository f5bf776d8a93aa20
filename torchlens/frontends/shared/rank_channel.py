"""Kernel side of the per-rank memory channel: magics POST samples to the server.

This module runs in the user's kernel (``%%gpumem``, ``%ddp_check``), not in the
Jupyter server, so it lives beside the other kernel-side front ends rather than
in ``frontends/server`` (importing that package pulls in tornado and
jupyter_server, seconds on a cold kernel). It uses the standard library only;
the server's half is ``RanksHandler`` in ``frontends/server/handlers.py``.

The channel, and why it is this simple:

* A kernel started by a Jupyter server is a child process of that server, and
  every running server writes ``jpserver-<pid>.json`` (url, base_url, token,
  pid) into the Jupyter runtime dir - the same dir that holds the kernel's
  connection file. ``find_server()`` picks the server whose pid is the
  kernel's parent (or the one named by ``TORCHLENS_SERVER_URL`` /
  ``TORCHLENS_SERVER_TOKEN``, for kernels started some other way; under
  JupyterHub the kernel's ``JUPYTERHUB_API_TOKEN`` is accepted as the token).
* The kernel then POSTs JSON to ``<url>torchlens/monitor/ranks`` with
  ``Authorization: token <token>``: the same auth as every other request, so no
  new port and no new secret. Token-authenticated API requests skip the XSRF
  check, so no cookie dance is needed.
* Publishing is best effort with a short timeout: a monitor that is down or
  absent (classic notebook, VS Code) must never slow or break training.

Body: ``{"run": "<label>", "samples": [{"rank": 0, "t": epoch_s, "device": 0,
"allocated": bytes, "reserved": bytes}, ...]}``. A ``%ddp_check --profile``
sample may add ``"inactive_split": bytes, "largest_free": bytes`` and
``"source": "cuda" | "modelled" | "rss"`` (see docs/RANK_PROFILE.md); every
byte count is a number or null, and the server refuses anything else.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from torchlens.model.samples import PostedSample

#: Where a rank's memory figures come from (docs/RANK_PROFILE.md ``mem.source``):
#: the CUDA caching allocator's own counters, torchlens' model of that allocator
#: replayed over a CPU run's allocations, or the process's resident memory.
#: The server accepts these values of ``source`` only.
MEMORY_SOURCES = ("cuda", "modelled", "rss")


@dataclass(frozen=True)
class ServerInfo:
    """Where the Jupyter server is and how to authenticate to it."""

    url: str  # ends with "/", includes the base_url
    token: str


def find_server() -> ServerInfo | None:
    """The Jupyter server that started this kernel, or None outside Jupyter."""
    url = os.environ.get("TORCHLENS_SERVER_URL")
    if url:
        return ServerInfo(
            url.rstrip("/") + "/", os.environ.get("TORCHLENS_SERVER_TOKEN", "")
        )
    parent = os.getppid()
    for info in _server_files():
        if info.pid == parent:
            token = info.token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
            return ServerInfo(info.url.rstrip("/") + "/", token)
    return None


class _RuntimeFile(msgspec.Struct):
    """What torchlens reads of a ``jpserver-<pid>.json``: the server's URL,
    token and pid (the rest of the file is left unread)."""

    url: str
    token: str | None = None
    pid: int | None = None


def _server_files() -> list[_RuntimeFile]:
    """The ``jpserver-<pid>.json`` files of the Jupyter runtime dir.

    Read directly rather than through ``jupyter_server.serverapp``'s
    ``list_running_servers``: importing that module costs seconds (its
    jsonschema formats compile grammars), paid by the first ``%ddp_check``.
    """
    try:
        from jupyter_core.paths import jupyter_runtime_dir
    except ImportError:
        return []
    found = []
    for path in Path(jupyter_runtime_dir()).glob("jpserver-*.json"):
        try:
            found.append(msgspec.json.decode(path.read_bytes(), type=_RuntimeFile))
        except (OSError, ValueError):  # msgspec's errors are ValueErrors
            continue
    return found


class RankPublisher:
    """Sends per-rank memory samples of one run to the server's GPU monitor."""

    def __init__(
        self, run: str, server: ServerInfo | None = None, timeout: float = 1.0
    ) -> None:
        self.run = run
        self.server = server if server is not None else find_server()
        self.timeout = timeout
        self.failures = 0
        self.last_error = ""

    @property
    def enabled(self) -> bool:
        return self.server is not None

    def publish(self, samples: list[PostedSample]) -> bool:
        """POST ``samples``; returns False (and counts) on any failure, never raises."""
        if not samples:
            return False
        return self.post("torchlens/monitor/ranks",
                         {"run": self.run, "samples": msgspec.to_builtins(samples)})

    def post(self, path: str, body: dict[str, Any]) -> bool:
        """POST ``body`` as JSON to the server's ``path``; False (and counted) on any failure."""
        if self.server is None:
            return False
        request = urllib.request.Request(
            self.server.url + path,
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"token {self.server.token}",
                "Content-Type": "application/json",
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return 200 <= response.status < 300
        except OSError as exc:
            self.failures += 1
            self.last_error = str(exc)
            return False

"""Publishing a running magic's memory to the GPU Monitor sidebar.

While ``%%gpumem`` (one process) or ``%ddp_check`` (spawned ranks) runs, a
background thread calls a sample function every ``interval`` seconds and posts
what it returns through the server channel in ``server.publish`` (the
kernel's own Jupyter server, its own token). Outside a Jupyter server (a
script, VS Code) nothing is started. Publishing is best effort: a slow or
absent sidebar must never slow or break the user's cell.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .server.publish import RankPublisher

Sample = list[dict[str, Any]]


class LivePublisher:
    """Context manager: a thread publishing ``sample()`` until the block ends."""

    def __init__(self, run: str, sample: Callable[[], Sample], interval: float = 0.5,
                 publisher: RankPublisher | None = None) -> None:
        self.publisher = publisher if publisher is not None else RankPublisher(run)
        self.sample = sample
        self.interval = interval
        self.sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                samples = self.sample()
            except Exception:  # a failing probe must not end the user's cell
                samples = []
            if self.publisher.publish(samples):
                self.sent += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> LivePublisher:
        if self.publisher.enabled:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="torchlens-live-publish")
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> bool:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + self.publisher.timeout)
        return False

"""A process of ``torchlens run``'s command keeps running when nobody reads its output.

``torchlens run`` relays the command's stdout and stderr through pipes it
reads. If ``torchlens run`` itself dies (SIGKILL, the OOM killer), the pipes
lose their reader, and the next ``print`` in a rank raises BrokenPipeError:
the training job would die with its profiler. ``guard_output`` wraps the
process's ``sys.stdout`` and ``sys.stderr`` so that the first write that
finds the reader gone points the descriptor at ``/dev/null`` instead (the
output is dropped, with nobody left to show it to) and the write returns as
if it had been read. Only a write to a pipe whose reader left is changed:
every other error, and every other attribute of the stream, is the stream's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any


class PipeGuard:
    """A text stream (``sys.stdout``) whose writes survive its reader leaving."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        #: the reader went away: the descriptor is /dev/null now
        self.gone = False

    def _reader_left(self) -> None:
        self.gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())  # C-level writes and the exit flush too
            os.close(null)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            with contextlib.suppress(OSError, ValueError):
                self._stream.write(text)  # into /dev/null: the stream's buffer is clear
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_output() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in a ``PipeGuard`` (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, PipeGuard):
            setattr(sys, name, PipeGuard(stream))

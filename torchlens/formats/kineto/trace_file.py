"""A trace file read once: its JSON bytes and its ``run_folder.peek`` verdict.

Why: placing a file in a run (``run_folder.discover``) needs its top-level
members, which in a gzip file means inflating all of it; reading its events
inflates it again. A run's worker process does both from one read, so each
file is inflated once, in parallel, and never in the notebook's process.

The verdict must be the one ``peek`` gives, word for word, so the fast path
is taken only when everything is ordinary: one whole gzip member (or plain
JSON) whose head and tail parse. Anything else (a damaged, cut or
multi-member gzip file, a head or tail that does not parse, an unreadable
file) returns no bytes and ``peek``'s own verdict, read from the file as
``discover`` would read it; the caller then reads the trace from the path.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from torchlens.formats.run_folder import Peek, peek_bytes, safe_peek


def read_json(path: str | Path) -> tuple[bytes | None, Peek]:
    """The file's JSON bytes (``None`` off the fast path) and its peek verdict."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None, safe_peek(str(path))
    if data[:2] == b"\x1f\x8b":
        inflater = zlib.decompressobj(wbits=31)
        try:
            data = inflater.decompress(data)
        except zlib.error:
            return None, safe_peek(str(path))
        if not inflater.eof or inflater.unused_data:
            return None, safe_peek(str(path))  # cut short, or several members
    try:
        seen = peek_bytes(data)
    except Exception:  # noqa: BLE001 - peek's own path says what is wrong
        seen = Peek(kind="unreadable")
    if seen.kind is not None:
        return None, safe_peek(str(path))
    return data, seen

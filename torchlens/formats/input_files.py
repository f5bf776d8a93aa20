"""Every file torchlens reads: the one guarded open, and the bounds on what it reads.

A file handed to torchlens (a trace, a snapshot, a run folder, a saved result)
is not trusted (docs/SECURITY.md): its sizes, its links and its declared
counts are checked before anything is allocated for them. The command line,
``torchlens.load`` and the Jupyter server all open files through
``open_guarded`` (or ``read_capped`` / ``read_json_bytes`` on top of it), so
the rules are the same everywhere:

- only a regular file is read: a FIFO or a device (``/dev/zero`` named as a
  trace) is refused at once, never read forever (the open is non-blocking, so
  a FIFO without a writer cannot stall it);
- ``within=FOLDER``: the file actually opened (after every link) must lie in
  that folder, so a link in a run folder cannot make torchlens read, or show
  a line of, a file elsewhere;
- ``private``: no link at all and owned by this user (the Jupyter server
  reading a folder it was only told about);
- a gzip stream is inflated in pieces and stopped at ``inflate_cap()`` bytes,
  or once it passes ``RATIO_FLOOR`` at more than ``inflate_ratio()`` times
  the compressed bytes read, so a small file that inflates to gigabytes is
  refused before it fills memory;
- a declared world size above ``world_size_cap()`` is refused before any list
  of its ranks is made.

Each refusal is a ``RefusedFile`` (an ``InputError``): one line naming the
file, what was wrong, the bound and how to raise it.

The open itself, the cap on one file's bytes and the check of a zip's
members live in ``model.guarded_open`` (re-exported here), so the ``.tlprof``
reader below this layer (``Profile.load``, ``load_profile``) uses them too.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from torchlens.model.guarded_open import INFLATE_DEFAULT as INFLATE_DEFAULT
from torchlens.model.guarded_open import INFLATE_ENV as INFLATE_ENV
from torchlens.model.guarded_open import LINK_TARGETS_ENV as LINK_TARGETS_ENV
from torchlens.model.guarded_open import RefusedFile as RefusedFile
from torchlens.model.guarded_open import check_members as check_members
from torchlens.model.guarded_open import check_zip as check_zip
from torchlens.model.guarded_open import inflate_cap as inflate_cap
from torchlens.model.guarded_open import inside as inside
from torchlens.model.guarded_open import link_targets as link_targets
from torchlens.model.guarded_open import next_size as next_size
from torchlens.model.guarded_open import open_guarded as open_guarded
from torchlens.model.guarded_open import outside_link as outside_link
from torchlens.model.guarded_open import parse_size as parse_size
from torchlens.model.units import format_bytes

#: the largest manifest, live status or registry entry read (a 4,096-rank manifest is
#: a few MB)
MAX_JSON_BYTES = 64 << 20
#: the environment variable that raises the most a gzip trace may inflate, as a
#: multiple of its compressed size
RATIO_ENV = "TORCHLENS_MAX_RATIO"
#: that multiple: real Kineto traces inflate 10 to 25 times; a compression bomb
#: a thousand times
RATIO_DEFAULT = 100
#: the ratio is checked only past this much inflated JSON (a small file's header
#: may inflate more)
RATIO_FLOOR = 64 << 20
#: the environment variable that raises the largest world size read
WORLD_SIZE_ENV = "TORCHLENS_MAX_WORLD_SIZE"
#: the largest world size believed (a declared ``world_size`` above it is refused):
#: ten times the largest jobs run today
WORLD_SIZE_DEFAULT = 1 << 20
#: the longest line of a ``steps.jsonl`` / ``summaries.jsonl`` read (a record is < 4 KB)
MAX_LINE_BYTES = 16 << 20

_READ = 1 << 20


def inflate_ratio() -> int:
    """How many times its compressed size a gzip trace may inflate to, past
    ``RATIO_FLOOR``: ``TORCHLENS_MAX_RATIO`` (0: no bound), else 100."""
    text = os.environ.get(RATIO_ENV, "")
    return int(text) if text.strip().isdigit() else RATIO_DEFAULT


def bomb(path: str, total: int, compressed: int, ratio: int) -> RefusedFile:
    """The refusal of a gzip stream that inflates more than ``ratio`` times."""
    return RefusedFile(path, (
        f"it inflates more than {ratio} times its size ({format_bytes(total)} from "
        f"{format_bytes(compressed)} so far; a Kineto trace inflates 10 to 25 times): a "
        f"compression bomb, not a trace; if it is a real trace, raise the bound, e.g. "
        f"{RATIO_ENV}={ratio * 10} (0: none)"))


def world_size_cap() -> int:
    """The largest world size believed: ``TORCHLENS_MAX_WORLD_SIZE``, else 1,048,576."""
    text = os.environ.get(WORLD_SIZE_ENV, "")
    return int(text) if text.strip().isdigit() else WORLD_SIZE_DEFAULT


def world_size_refusal(value: int) -> str | None:
    """Why a declared world size is not believed, None when it is within the bound."""
    cap = world_size_cap()
    if value <= cap:
        return None
    return (f"world_size {value} is above the largest believed ({cap:,}); if the run "
            f"really had that many ranks, raise it with {WORLD_SIZE_ENV}={value}")


def json_too_large(path: str, cap: int) -> RefusedFile:
    """The refusal of a trace whose JSON (inflated, or the plain file) passes ``cap``."""
    return RefusedFile(path, (
        f"its JSON is larger than {format_bytes(cap)} (the cap on a trace's JSON bytes, "
        f"inflated, {INFLATE_ENV}); if it is a real trace, raise the cap, e.g. "
        f"{INFLATE_ENV}={next_size(cap)}"))


def file_too_large(path: str, cap: int) -> RefusedFile:
    """The refusal of a file (a snapshot) larger than ``cap``."""
    return RefusedFile(path, (
        f"larger than {format_bytes(cap)} (the cap on one file's bytes in memory, "
        f"{INFLATE_ENV}); if it is a real file, raise the cap, e.g. "
        f"{INFLATE_ENV}={next_size(cap)}"))


def check_file(path: str | os.PathLike[str]) -> None:
    """Raise what ``open_guarded`` raises for ``path``; read nothing of it."""
    open_guarded(path).close()


def read_capped(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES,
                private: bool = False, within: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, refused when more than ``limit``."""
    with open_guarded(path, private=private, within=within) as fh:
        if os.fstat(fh.fileno()).st_size > limit:
            raise RefusedFile(os.fspath(path), _too_large(limit))
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise RefusedFile(os.fspath(path), _too_large(limit))
    return data


def _too_large(limit: int) -> str:
    return (f"larger than {format_bytes(limit)}, the most read of this kind of file "
            "(a file of this kind that large is not one torchlens wrote)")


def inflate_pieces(fh: BinaryIO, source: str, cap: int | None = None) -> Iterator[bytes]:
    """The inflated bytes of the gzip stream ``fh`` (members one after another, as
    gzip allows), in pieces of at most 8 MB; ``RefusedFile`` once more than
    ``cap`` (default ``inflate_cap()``) came out, or more than
    ``RATIO_FLOOR`` at over ``inflate_ratio()`` times the compressed bytes read
    (a compression bomb); ``zlib.error`` for damaged data, ``EOFError`` for a
    stream cut short."""
    cap = inflate_cap() if cap is None else cap
    ratio = inflate_ratio()
    inflater = zlib.decompressobj(wbits=31)
    pending = b""
    total = read = 0
    started = False
    while True:
        if not pending:
            pending = fh.read(_READ)
            read += len(pending)
            if not pending:
                break
        if inflater.eof:
            if not pending.strip(b"\0"):  # trailing padding after the last member
                pending = b""
                continue
            inflater = zlib.decompressobj(wbits=31)
        started = True
        out = inflater.decompress(pending, min(8 << 20, cap + 1 - total))
        pending = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
        total += len(out)
        if total > cap:
            raise json_too_large(source, cap)
        if ratio and total > max(RATIO_FLOOR, ratio * read):
            raise bomb(source, total, read, ratio)
        if out:
            yield out
    if started and not inflater.eof:
        raise EOFError("the gzip stream stops early")


def inflate_bytes(data: bytes, source: str, cap: int | None = None) -> bytes:
    """``inflate_pieces`` of gzip bytes already in memory, joined."""
    import io

    return b"".join(inflate_pieces(io.BytesIO(data), source, cap))


def streamed_cap() -> int:
    """The most JSON bytes a trace read in pieces (``formats.kineto.pieces``) may
    hold: ``TORCHLENS_MAX_INFLATED`` when set, else two thirds of the memory
    available now (the table it makes is about as large as its JSON)."""
    text = os.environ.get(INFLATE_ENV)
    if text:
        return inflate_cap()
    try:
        import psutil

        free = int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no reading of free memory: the whole-file cap
        return inflate_cap()
    return max(inflate_cap(), free * 2 // 3)


def read_json_bytes(path: str | os.PathLike[str], within: str | None = None) -> bytes:
    """A trace file's JSON bytes: the file read through ``open_guarded``, inflated
    when it is gzip; refused past ``inflate_cap()`` either way."""
    name = os.fspath(path)
    cap = inflate_cap()
    with open_guarded(name, within=within) as fh:
        head = fh.read(2)
        fh.seek(0)
        if head == b"\x1f\x8b":
            return b"".join(inflate_pieces(fh, name, cap))
        if os.fstat(fh.fileno()).st_size > cap:
            raise json_too_large(name, cap)
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise json_too_large(name, cap)
    return data


def read_file_bytes(path: str | os.PathLike[str], within: str | None = None) -> bytes:
    """A whole file's bytes as they are (an allocator snapshot), through
    ``open_guarded``; refused past ``inflate_cap()``, the most one file may
    put in memory."""
    name = os.fspath(path)
    cap = inflate_cap()
    with open_guarded(name, within=within) as fh:
        if os.fstat(fh.fileno()).st_size > cap:
            raise file_too_large(name, cap)
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise file_too_large(name, cap)
    return data


def read_lines(path: str | os.PathLike[str], within: str | None = None,
               limit: int | None = None) -> Iterator[bytes]:
    """The lines of a JSON-lines file; a line longer than ``limit`` (default
    ``MAX_LINE_BYTES``) comes back as ``b""`` (the reader counts it as damaged)
    without being held whole. None at all when the file is not there;
    refusals raise."""
    limit = MAX_LINE_BYTES if limit is None else limit
    try:
        fh = open_guarded(path, within=within)
    except FileNotFoundError:
        return
    with fh:
        while True:
            line = fh.readline(limit + 1)
            if not line:
                return
            if len(line) > limit and not line.endswith(b"\n"):
                while True:  # skip the rest of the long line
                    more = fh.readline(_READ)
                    if not more or more.endswith(b"\n"):
                        break
                yield b""
                continue
            yield line

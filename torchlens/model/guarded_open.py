"""The guarded open every file torchlens reads goes through, and the cap on
the bytes one file may put in memory (docs/SECURITY.md).

It lies here, below every other layer, so the ``.tlprof`` reader
(``model.tlprof``, which ``Profile.load`` and ``load_profile`` call directly)
opens its file the way ``formats.input_files`` and everything above do.
``formats.input_files`` re-exports these names beside the readers built on
them (gzip inflation, JSON lines, declared world sizes): the rules are in its
module doc.
"""

from __future__ import annotations

import os
import re
import stat
from typing import TYPE_CHECKING, BinaryIO

from torchlens.model.errors import InputError
from torchlens.model.units import format_bytes

if TYPE_CHECKING:
    import zipfile

#: the environment variable that raises the cap on a trace's JSON bytes (inflated)
INFLATE_ENV = "TORCHLENS_MAX_INFLATED"
#: that cap's upper figure: never more than this is inflated or read as one trace
INFLATE_DEFAULT = 8 << 30
#: the environment variable naming folders a run folder's links may lead into
LINK_TARGETS_ENV = "TORCHLENS_LINK_TARGETS"

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)


class RefusedFile(InputError):
    """A file torchlens will not read; ``str()`` is one line: the file, why, the
    bound and how to raise it."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: refused: {why}")
        self.path, self.why = path, why


def parse_size(text: str) -> int | None:
    """``"8G"``, ``"512M"``, ``"1048576"`` as bytes; None when it is not a size."""
    m = _SIZE.fullmatch(text)
    return int(m.group(1)) * _UNITS[m.group(2).upper()] if m else None


def _available() -> int | None:
    """Memory this process may still take: the system's available memory, less
    where an address-space limit (``ulimit -v``) is lower; None when unknown."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            used = 0
            with open("/proc/self/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"VmSize:"):
                        used = int(line.split()[1]) * 1024
            found.append(max(0, soft - used))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(found) if found else None


def inflate_cap() -> int:
    """The most JSON bytes one trace may hold (inflated, or as the plain file is):
    ``TORCHLENS_MAX_INFLATED`` when set, else the smaller of 8 GiB and a quarter
    of the memory available now (reading a trace takes about three times its
    JSON; a quarter leaves room for that and the rest of the process)."""
    text = os.environ.get(INFLATE_ENV)
    if text:
        size = parse_size(text)
        if size is None:
            raise InputError(f"{INFLATE_ENV}={text!r}: not a size; give bytes, or a "
                             "number with K, M, G or T (e.g. 16G)")
        return size
    free = _available()
    return INFLATE_DEFAULT if free is None else max(64 << 20, min(INFLATE_DEFAULT, free // 4))

def next_size(cap: int) -> str:
    gib = max(1, -(-2 * cap // (1 << 30)))
    return f"{gib}G"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def _real_path(fd: int, path: str) -> str:
    """Where the open file really is (after every link), by the descriptor itself,
    so a link changed between a check and the open cannot fool it."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` (already resolved) lies in ``folder`` (resolved here)."""
    root = os.path.realpath(folder)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def link_targets() -> list[str]:
    """The folders a run folder's links may lead into (``TORCHLENS_LINK_TARGETS``,
    separated as ``PATH`` is): a shared store of traces a site links to."""
    return [p for p in os.environ.get(LINK_TARGETS_ENV, "").split(os.pathsep) if p]


def _allowed(real: str, folder: str) -> bool:
    return any(inside(real, root) for root in [folder, *link_targets()])


def outside_link(path: str, folder: str) -> str | None:
    """Why ``path`` (a name found in ``folder``) is refused: it resolves outside
    the folder (a link, or ``..`` in a name a manifest lists) and outside every
    ``link_targets()`` folder; None when it may be read. Only names are
    resolved: nothing is opened."""
    real = os.path.realpath(path)
    if _allowed(real, folder):
        return None
    what = "a link" if os.path.islink(path) else "a path"
    return (f"{what} to {real}, outside the run folder {folder}; only files inside it are "
            f"read (copy the file in, or allow its folder with {LINK_TARGETS_ENV}="
            f"{os.path.dirname(real)})")


def open_guarded(path: str | os.PathLike[str], *, private: bool = False,
                 within: str | None = None) -> BinaryIO:
    """``path`` opened for reading, after the checks of the module doc.

    Raises ``FileNotFoundError`` (or another ``OSError``) for a file that is
    not there or cannot be opened, ``RefusedFile`` for one that is refused.
    """
    name = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if private:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        if private and os.path.islink(name):
            raise RefusedFile(name, "a link; the server reads only the file itself") from None
        raise exc from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedFile(name, f"{_kind(st.st_mode)}, not a regular file; torchlens "
                              "reads only regular files (give the file itself)")
        if private and st.st_uid != os.getuid():
            raise RefusedFile(name, "owned by another user; the server reads only this "
                              "user's files")
        if within is not None:
            real = _real_path(fd, name)
            if not _allowed(real, within):
                raise RefusedFile(name, outside_link(name, within) or (
                    f"it resolves to {real}, outside the folder {within}"))
        # a regular file never blocks: back to ordinary reads
        os.set_blocking(fd, True)
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    return fh

def check_zip(path: str | os.PathLike[str]) -> None:
    """Refuse a zip archive (a ``.tlprof``) whose members would inflate past
    ``inflate_cap()`` in all (``check_members``). A file that is no zip is
    left to its reader, which says what is wrong."""
    import zipfile

    name = os.fspath(path)
    with open_guarded(name) as fh:
        try:
            zf = zipfile.ZipFile(fh)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
            return
        with zf:
            check_members(zf, name)


def check_members(zf: zipfile.ZipFile, name: str) -> None:
    """Refuse the open zip archive ``zf`` (of the file ``name``) when its
    members would inflate past ``inflate_cap()`` in all. The sizes its
    directory declares are summed before any member is read; Python's
    ``zipfile`` never inflates a member past its declared size (it stops there
    and fails the checksum), so the sum bounds what reading it can take."""
    cap = inflate_cap()
    total = sum(max(0, info.file_size) for info in zf.infolist())
    if total > cap:
        raise RefusedFile(name, (
            f"its members inflate to {format_bytes(total)}, more than "
            f"{format_bytes(cap)} (the cap on one file's bytes in memory, {INFLATE_ENV}); "
            f"if it is a real file, raise the cap, e.g. {INFLATE_ENV}={next_size(total)}"))

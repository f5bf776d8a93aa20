"""Find the per-rank Kineto traces of one distributed run and name what is wrong.

``discover(inputs)`` takes a folder (searched recursively, hidden folders and
files skipped, for ``*.json`` and ``*.json.gz``, ``*.pt.trace.json`` among
them) or a list of files and folders, and returns every rank it could place
plus one ``Problem`` per thing wrong with the input. It never raises on a bad
file: a run with one damaged rank is still worth looking at, as long as the
report says which rank is missing and why.

Why a peek and not ``load_trace``: deciding the rank of a 100 MB trace must
not cost a full parse. Kineto writes the small top-level members around the
huge ``traceEvents`` list; torch 2.13's ``export_chrome_trace`` (and every
shared trace that has one) writes ``distributedInfo`` before it, older writers
may put members after it. So the peek parses the members in the head of the
(decompressed) stream one by one until ``traceEvents`` opens, and in the
tail finds where that list closes and parses the members after it; both
windows start at 64 KB and grow only when a member is larger. A tail that
does not close the JSON means the file was cut short. A gzip file has no
random access, so its stream is inflated once (output thrown away except
the two windows), but never parsed.

The rank of a file, first match wins:

1. a torchlens run folder's ``manifest.json`` (``docs/RANK_PROFILE.md``, "Run
   folder"): its ``ranks[].traces`` and the ``rank<r>/`` folders; all of a
   rank's ``step<N>.pt.trace.json`` files form one rank, ordered by step;
2. ``distributedInfo.rank`` in the trace;
3. the file name (case-insensitive): ``rank3``, ``rank-3`` or ``rank_3``
   anywhere in it, not after a letter (``sampled_rank-0.json.gz``,
   ``a100_rank0_nccl.json``); else ``_3`` right before the extension
   (``trace_3.json``, ``worker_3.pt.trace.json.gz``; not Kineto's default
   ``host_<pid>.<ns>.pt.trace.json``, whose number is a pid); else a parent
   folder named ``rank3`` (a run folder without its manifest).

Files that share a rank and are not steps of one torchlens rank folder are
duplicates: the first is kept (run folders first, then path order for a
folder, the given order for a list) and each other is named. The world size
is the manifest's, else the one most ``distributedInfo`` blocks give; files
that disagree, ranks at or above it, and ranks below it with no trace are
named too.
"""

from __future__ import annotations

import io
import json
import os
import re
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

#: first size of the head and tail windows
PEEK_BYTES = 64 * 1024
#: a head longer than this without ``traceEvents`` is not a trace
HEAD_CAP = 16 * 1024 * 1024
#: members after ``traceEvents`` longer than this are taken for a cut file
TAIL_CAP = 4 * 1024 * 1024
_READ = 1024 * 1024
#: inflate output per call, so a highly compressed file cannot fill memory
_INFLATE_OUT = 8 * 1024 * 1024

MANIFEST = "manifest.json"
#: the live feed's files in a ``torchlens run`` folder (``capture.ddp.feed`` writes them)
LIVE_STATUS, LIVE_FEED = "live.json", "live.jsonl"
RUN_FORMAT = "torchlens-run"

_RANK_WORD = re.compile(r"(?<![a-z])rank[-_]?(\d+)", re.IGNORECASE)
_RANK_SUFFIX = re.compile(r"_(\d+)(?:\.pt\.trace)?\.json(?:\.gz)?$", re.IGNORECASE)
_RANK_FOLDER = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_STEP_FILE = re.compile(r"step(\d+)\.pt\.trace\.json(?:\.gz)?$", re.IGNORECASE)
_WS = " \t\n\r"
_DECODER = json.JSONDecoder()


@dataclass
class RankFile:
    """One rank's traces: one file, or a torchlens rank folder's steps in step order."""

    rank: int
    paths: list[str]
    world_size: int | None
    source: str  # "distributedInfo" | "file name" | "manifest" | "single file"


@dataclass
class Problem:
    """One thing wrong with the input, named with the file (or folder) it is about."""

    kind: str  # "not a trace" | "truncated" | "duplicate rank" | "world size" |
    #            "missing rank" | "no rank" | "unreadable" | "no traces"
    path: str
    message: str


@dataclass
class RunSources:
    """The ranks found (sorted by rank), the run's world size, and what was wrong."""

    ranks: list[RankFile]
    world_size: int | None
    problems: list[Problem]
    root: str


@dataclass
class Peek:
    """The top-level members of a trace other than ``traceEvents``, or why not."""

    members: dict[str, Any] = field(default_factory=dict)
    kind: str | None = None  # a Problem kind when the file is not a usable trace
    message: str = ""


# --------------------------------------------------------------------------- peek


def peek(path: str | Path) -> Peek:
    """Read just enough of a trace file (plain or gzip) to know its top-level members."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"\x1f\x8b":
                fh.seek(0)
                return _peek_gzip(fh)
            fh.seek(0)
            return _peek_plain(fh, os.fstat(fh.fileno()).st_size)
    except OSError as exc:
        return Peek(kind="unreadable", message=f"cannot read it ({exc.strerror or exc}).")


def peek_bytes(data: bytes) -> Peek:
    """``peek`` of a (plain) trace already in memory."""
    return _peek_plain(io.BytesIO(data), len(data))


@dataclass
class _Head:
    """The head's verdict: members before the events and where the list opens."""

    members: dict[str, Any]
    events_at: int  # byte offset of the ``[`` that opens the events
    bare: bool  # Chrome's bare-array format: the file is the list


def _peek_plain(fh: BinaryIO, size: int) -> Peek:
    buf = b""
    while True:
        want = min(size, max(PEEK_BYTES, 2 * len(buf)))
        more = fh.read(want - len(buf))
        buf += more
        head = _parse_head(buf, eof=len(buf) >= size or not more)
        if head is not None:
            break
        if len(buf) >= HEAD_CAP:
            return _head_too_long()
    if isinstance(head, Peek):
        return head
    window = PEEK_BYTES
    while True:
        start = max(head.events_at, size - window)
        fh.seek(start)
        members = _parse_tail(fh.read(size - start), head.bare)
        if members is not None:
            return Peek({**head.members, **members})
        if start == head.events_at or window >= TAIL_CAP:
            return _cut(size)
        window *= 4


def _peek_gzip(fh: BinaryIO) -> Peek:
    """Inflate once, keeping only the head (until it is parsed) and the last bytes."""
    inflater = zlib.decompressobj(wbits=31)
    pending = b""
    head_buf = bytearray()
    head: _Head | Peek | None = None
    next_try = PEEK_BYTES
    tail = bytearray()
    total = read = 0
    while True:
        if not pending:
            pending = fh.read(_READ)
            read += len(pending)
            if not pending:
                break
        if inflater.eof:  # gzip allows members one after another
            inflater = zlib.decompressobj(wbits=31)
        try:
            out = inflater.decompress(pending, _INFLATE_OUT)
        except zlib.error as exc:
            return Peek(kind="unreadable",
                        message=f"damaged gzip data ({exc}); copy or export it again.")
        pending = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
        total += len(out)
        if head is None:
            head_buf += out
            if len(head_buf) >= next_try:
                head = _parse_head(bytes(head_buf), eof=False)
                if isinstance(head, Peek):
                    return head
                if head is None and len(head_buf) >= HEAD_CAP:
                    return _head_too_long()
                next_try = 2 * len(head_buf)
        tail += out
        if len(tail) > 2 * TAIL_CAP:
            del tail[:-TAIL_CAP]
    if not inflater.eof:
        return Peek(kind="truncated", message=(
            f"the gzip stream stops early (after {read} compressed bytes, {total} "
            "bytes of JSON): the file was cut short; copy or export it again."))
    if head is None:
        head = _parse_head(bytes(head_buf), eof=True)
    if isinstance(head, Peek):
        return head
    assert head is not None  # eof=True always decides
    window = min(PEEK_BYTES, len(tail))
    while True:
        start = max(head.events_at, total - window)
        members = _parse_tail(bytes(tail[len(tail) - (total - start):]), head.bare)
        if members is not None:
            return Peek({**head.members, **members})
        if start == head.events_at or window >= len(tail):
            return _cut(total)
        window = min(4 * window, len(tail))


def _cut(size: int, where: str = "inside traceEvents") -> Peek:
    return Peek(kind="truncated", message=(
        f"the JSON stops {where} (after {size} bytes): the file was cut short while "
        "being written or copied; export or copy it again."))


def _head_too_long() -> Peek:
    return Peek(kind="not a trace", message=(
        f"no traceEvents list in its first {HEAD_CAP // (1024 * 1024)} MB; "
        "a Kineto trace opens it near the start."))


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _ran_out(exc: json.JSONDecodeError, s: str) -> bool:
    """Whether a decode error comes from the text stopping, not from bad JSON."""
    return exc.msg.startswith("Unterminated string") or exc.pos >= len(s) - 8


def _parse_head(data: bytes, eof: bool) -> _Head | Peek | None:
    """The members before ``traceEvents``; None when more bytes are needed."""
    # surrogateescape keeps one character per undecodable byte, so offsets in
    # the text map back to byte offsets in the file
    s = data.decode("utf-8", "surrogateescape")
    i = _ws(s, 1 if s.startswith("\ufeff") else 0)
    early = "before traceEvents"
    if i >= len(s):
        if not eof:
            return None
        return Peek(kind="not a trace", message="the file is empty." if not data
                    else "the file holds only whitespace.")
    if s[i] == "[":
        j = _ws(s, i + 1)
        if j >= len(s):
            return None if not eof else _cut(len(data), early)
        if s[j] in "{]":
            return _Head({}, _offset(s, i), bare=True)
        return Peek(kind="not a trace", message=(
            f"a JSON list of rows like {s[j:j + 30]!r}, not a Kineto trace (an "
            "export_memory_timeline raw file looks like this)."))
    if s[i] != "{":
        return Peek(kind="not a trace", message=f"not JSON (it starts with {s[i:i + 24]!r}).")
    members: dict[str, Any] = {}
    i += 1
    try:
        while True:
            i = _ws(s, i)
            if s[i] == "}":
                return Peek(kind="not a trace", message=_what_it_is(members))
            if members:
                if s[i] != ",":
                    raise json.JSONDecodeError("Expecting ',' delimiter", s, i)
                i = _ws(s, i + 1)
            if s[i] != '"':
                raise json.JSONDecodeError("Expecting property name", s, i)
            key, i = _DECODER.raw_decode(s, i)
            i = _ws(s, i)
            if s[i] != ":":
                raise json.JSONDecodeError("Expecting ':' delimiter", s, i)
            i = _ws(s, i + 1)
            if key == "traceEvents":
                if s[i] != "[":
                    return Peek(kind="not a trace", message=(
                        f"its traceEvents is not a list (it starts with {s[i:i + 20]!r})."))
                return _Head(members, _offset(s, i), bare=False)
            members[key], i = _DECODER.raw_decode(s, i)
    except IndexError:  # the text stopped between tokens
        return None if not eof else _cut(len(data), early)
    except RecursionError:
        return Peek(kind="not a trace", message="JSON nested too deeply to be a trace.")
    except json.JSONDecodeError as exc:
        if _ran_out(exc, s):
            return None if not eof else _cut(len(data), early)
        return Peek(kind="not a trace", message=(
            f"not valid JSON ({exc.msg} at byte {_offset(s, exc.pos)})."))


def _offset(s: str, i: int) -> int:
    return len(s[:i].encode("utf-8", "surrogateescape"))


def _what_it_is(members: dict[str, Any]) -> str:
    keys = list(members)
    if members.get("format") == RUN_FORMAT:
        return "a torchlens run folder's manifest, not a trace."
    if {"segments", "device_traces"} & set(keys):
        return "an allocator memory snapshot, not a Kineto trace."
    shown = ", ".join(keys[:6]) or "none"
    return f"JSON without a traceEvents list (top-level keys: {shown}), not a Kineto trace."


_LIST_CLOSE = re.compile(r"\][ \t\n\r]*[,}]")
_BARE_END = re.compile(r"[}\[][ \t\n\r]*\][ \t\n\r]*$")


def _parse_tail(data: bytes, bare: bool) -> dict[str, Any] | None:
    """The members after ``traceEvents`` if ``data`` (the file's end) closes the
    JSON, else None.

    The list's close is the earliest ``]`` after which the rest parses as
    ``, "key": value ... }`` to the very end; a ``]`` inside an event fails at
    once, since more events follow it.
    """
    s = data.decode("utf-8", "surrogateescape")
    if bare:
        return {} if _BARE_END.search(s) else None
    for m in _LIST_CLOSE.finditer(s):
        k = m.start() - 1
        while k >= 0 and s[k] in _WS:
            k -= 1
        if k >= 0 and s[k] not in "}[":  # the events list ends with an event or is empty
            continue
        members = _members_to_end(s, m.end() - 1)
        if members is not None:
            return members
    return None


def _members_to_end(s: str, i: int) -> dict[str, Any] | None:
    members: dict[str, Any] = {}
    try:
        while s[i] == ",":
            i = _ws(s, i + 1)
            if s[i] != '"':
                return None
            key, i = _DECODER.raw_decode(s, i)
            i = _ws(s, i)
            if s[i] != ":":
                return None
            members[key], i = _DECODER.raw_decode(s, _ws(s, i + 1))
            i = _ws(s, i)
    except (IndexError, RecursionError, json.JSONDecodeError):
        return None
    return members if s[i] == "}" and _ws(s, i + 1) == len(s) else None


# ---------------------------------------------------------------------- discover


@dataclass
class _Candidate:
    path: str
    order: int
    manifest_rank: int | None = None
    manifest_world: int | None = None
    run_dir: str | None = None


@dataclass
class _Placed:
    rank: int
    path: str
    order: int
    source: str
    trace_world: int | None  # what the trace's distributedInfo says
    world_size: int | None  # that, else the manifest's
    group: tuple[str, str]
    step: int | None


def discover(inputs: str | Path | list[str | Path],
             peek_all: Callable[[list[str]], list[Peek]] | None = None) -> RunSources:
    """The per-rank traces of a run folder or list of files, and everything wrong.

    ``peek_all`` peeks a list of files at once (default: ``peek`` each in
    turn); ``load_run`` passes one that reads each file once, in its worker
    processes, and keeps the figures it computes on the way.
    """
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    paths = [Path(p) for p in items]
    problems: list[Problem] = []
    candidates: list[_Candidate] = []
    manifests: list[tuple[str, int | None]] = []
    runs: list[_Candidate] = []
    loose: list[_Candidate] = []
    for p in paths:
        if p.is_dir():
            run_cands, loose_cands, found = _scan_folder(p, problems)
            runs += run_cands
            loose += loose_cands
            manifests += found
            if not run_cands and not loose_cands:
                problems.append(Problem("no traces", str(p), (
                    "no trace files (*.json, *.json.gz) in this folder or below it.")))
        elif p.exists():
            loose.append(_Candidate(str(p), 0))
        else:
            problems.append(Problem("unreadable", str(p), "no such file or folder."))
    # a run folder's own ranks win over stray traces that claim the same rank
    for c in runs + loose:
        c.order = len(candidates)
        candidates.append(c)
    root = _root(paths)

    placed: list[_Placed] = []
    # one trace file given alone is a run of one process: rank 0 when it names none
    lone = len(paths) == 1 and len(candidates) == 1 and not runs and paths[0].is_file()
    peeks = (peek_all or _peek_each)([c.path for c in candidates])
    for c, seen in zip(candidates, peeks, strict=True):
        found = _place(c, seen, problems, default_rank=0 if lone else None)
        if found is not None:
            placed.append(found)
    ranks, kept = _group(placed, problems)
    world = _world_size(kept, manifests, problems)
    _check_ranks(ranks, world, root, problems)
    return RunSources(ranks=ranks, world_size=world, problems=problems, root=root)


def _root(paths: list[Path]) -> str:
    if len(paths) == 1 and paths[0].is_dir():
        return str(paths[0])
    folders = [str(p if p.is_dir() else p.parent) for p in paths]
    if not folders:
        return ""
    try:
        return os.path.commonpath(folders)
    except ValueError:  # relative and absolute paths mixed
        return ""


def _scan_folder(folder: Path, problems: list[Problem]
                 ) -> tuple[list[_Candidate], list[_Candidate], list[tuple[str, int | None]]]:
    """Trace files under ``folder``: those a run manifest lists, then the rest."""
    files: list[Path] = []
    manifests: dict[Path, dict[str, Any]] = {}
    def unlisted(exc: OSError) -> None:
        problems.append(Problem("unreadable", str(exc.filename or folder), (
            f"cannot list this folder ({exc.strerror or exc}); traces in it are not "
            "looked at.")))

    for here, dirs, names in os.walk(folder, onerror=unlisted):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            low = name.lower()
            if name.startswith(".") or not (low.endswith(".json") or low.endswith(".json.gz")):
                continue
            path = Path(here) / name
            if name == LIVE_STATUS and LIVE_FEED in names:
                continue  # a torchlens run's live status (torchlens.watch), not a trace
            if name == MANIFEST:
                manifest = _read_manifest(path, problems)
                if manifest:
                    manifests[Path(here)] = manifest
                if manifest is not None:
                    continue
            files.append(path)
    files.sort(key=lambda p: p.parts)
    runs: list[_Candidate] = []
    claimed: set[Path] = set()
    found: list[tuple[str, int | None]] = []
    for run_dir, manifest in manifests.items():
        world = _as_int(manifest.get("world_size"))
        found.append((str(run_dir / MANIFEST), world))
        listed: dict[Path, int] = {}
        entries = manifest.get("ranks")
        for entry in entries if isinstance(entries, list) else []:
            rank = _as_int(entry.get("rank")) if isinstance(entry, dict) else None
            if rank is None:
                continue
            traces = entry.get("traces")
            for rel in traces if isinstance(traces, list) else []:
                listed[run_dir / str(rel)] = rank
        # traces on disk the manifest does not list (written after it, or it is
        # older) still belong to the rank folder they are in
        for path in files:
            if path.parent.parent == run_dir and _STEP_FILE.search(path.name):
                m = _RANK_FOLDER.fullmatch(path.parent.name)
                if m and path not in listed:
                    listed[path] = int(m.group(1))
        for path, rank in sorted(listed.items(), key=lambda kv: (kv[1], str(kv[0]))):
            claimed.add(path)
            if not path.exists():
                problems.append(Problem("unreadable", str(path), (
                    f"{run_dir / MANIFEST} lists it for rank {rank}, but it is not there.")))
                continue
            runs.append(_Candidate(str(path), 0, rank, world, str(run_dir)))
    loose = [_Candidate(str(p), 0) for p in files if p not in claimed]
    return runs, loose, found


def _read_manifest(path: Path, problems: list[Problem]) -> dict[str, Any] | None:
    """A torchlens run manifest; None when this ``manifest.json`` is something
    else, {} when it cannot be read (said in ``problems``)."""
    try:
        if path.stat().st_size > HEAD_CAP:
            return None
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        problems.append(Problem("unreadable", str(path), (
            f"cannot read the run folder's manifest ({exc.strerror or exc}); the "
            "traces are placed by their distributedInfo and names instead.")))
        return {}
    except (ValueError, RecursionError) as exc:
        problems.append(Problem("unreadable", str(path), (
            f"the run folder's manifest is not valid JSON ({exc}); the traces are "
            "placed by their distributedInfo and names instead.")))
        return {}
    if isinstance(doc, dict) and doc.get("format") == RUN_FORMAT:
        return doc
    return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def rank_from_name(path: str | Path) -> int | None:
    """The rank a file's name (or its ``rank<r>`` folder) gives, see the module doc."""
    path = Path(path)
    m = _RANK_WORD.search(path.name) or _RANK_SUFFIX.search(path.name)
    if m is None:
        m = _RANK_FOLDER.fullmatch(path.parent.name)
    return int(m.group(1)) if m else None


def safe_peek(path: str) -> Peek:
    """``peek``, with any unexpected error as an "unreadable" verdict."""
    try:
        return peek(path)
    except Exception as exc:  # noqa: BLE001 - one odd file must not stop the whole run
        return Peek(kind="unreadable", message=f"could not be read ({exc!r}).")


def _peek_each(paths: list[str]) -> list[Peek]:
    return [safe_peek(p) for p in paths]


def _place(c: _Candidate, result: Peek, problems: list[Problem],
           default_rank: int | None = None) -> _Placed | None:
    if result.kind is not None:
        problems.append(Problem(result.kind, c.path, result.message))
        return None
    info = result.members.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    trace_world = _as_int(info.get("world_size"))
    step_m = _STEP_FILE.search(Path(c.path).name)
    step = int(step_m.group(1)) if step_m else None
    if c.manifest_rank is not None:
        return _Placed(c.manifest_rank, c.path, c.order, "manifest", trace_world,
                       trace_world if trace_world is not None else c.manifest_world,
                       ("run", c.run_dir or ""), step)
    group = ("steps", str(Path(c.path).parent)) if step is not None else ("file", c.path)
    rank = _as_int(info.get("rank"))
    if rank is not None:
        return _Placed(rank, c.path, c.order, "distributedInfo", trace_world, trace_world,
                           group, step)
    rank = rank_from_name(c.path)
    if rank is not None:
        return _Placed(rank, c.path, c.order, "file name", trace_world, trace_world,
                           group, step)
    if default_rank is not None:
        return _Placed(default_rank, c.path, c.order, "single file", trace_world,
                       trace_world, group, step)
    problems.append(Problem("no rank", c.path, (
        "the trace has no distributedInfo.rank and its name gives none (rank3, "
        "rank-3, rank_3 or a _3 before the extension); rename it, e.g. to "
        "rank3.json, or pass the run's files in a torchlens run folder.")))
    return None


def _group(placed: list[_Placed], problems: list[Problem]
           ) -> tuple[list[RankFile], list[_Placed]]:
    """One RankFile per rank; later claims of a rank are duplicates."""
    by_rank: dict[int, list[_Placed]] = {}
    for p in sorted(placed, key=lambda p: p.order):
        by_rank.setdefault(p.rank, []).append(p)
    ranks: list[RankFile] = []
    kept: list[_Placed] = []
    for rank in sorted(by_rank):
        claims = by_rank[rank]
        first = claims[0]
        mine = [p for p in claims if p.group == first.group]
        for p in claims:
            if p.group != first.group:
                problems.append(Problem("duplicate rank", p.path, (
                    f"it claims rank {rank} (from its {p.source}), as {first.path} "
                    f"does (from its {first.source}); {first.path} is kept and this "
                    "file left out.")))
        mine.sort(key=lambda p: (p.step if p.step is not None else -1, p.path))
        kept += mine
        world = next((p.world_size for p in mine if p.world_size is not None), None)
        ranks.append(RankFile(rank, [p.path for p in mine], world, first.source))
    return ranks, kept


def _names(paths: list[str], limit: int = 3) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _world_size(kept: list[_Placed], manifests: list[tuple[str, int | None]],
                problems: list[Problem]) -> int | None:
    """The run's world size; each file that says another is named."""
    claims: dict[int, list[str]] = {}
    for path, world in manifests:
        if world is not None:
            claims.setdefault(world, []).append(path)
    in_manifests = set(claims)
    for p in kept:
        if p.trace_world is not None:
            claims.setdefault(p.trace_world, []).append(p.path)
    if not claims:
        return None
    if in_manifests:
        pool = {w: n for w, n in Counter(w for _, w in manifests).items() if w is not None}
    else:
        pool = {w: len(paths) for w, paths in claims.items()}
    top = max(pool.values())
    # a tie goes to what the earliest file says (dicts keep insertion order)
    world = next(w for w in claims if pool.get(w) == top)
    for other, paths in claims.items():
        if other == world:
            continue
        for path in paths:
            problems.append(Problem("world size", path, (
                f"it says world size {other}, but {_names(claims[world])} "
                f"{'says' if len(claims[world]) == 1 else 'say'} {world}; "
                "are these files from one run?")))
    return world


def _ranges(ranks: list[int]) -> str:
    parts: list[str] = []
    start = prev = None
    for r in ranks + [None]:
        if start is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = r
    return ", ".join(parts)


def _check_ranks(ranks: list[RankFile], world: int | None, root: str,
                 problems: list[Problem]) -> None:
    have = {r.rank for r in ranks}
    if world is not None:
        for r in ranks:
            if r.rank >= world:
                problems.append(Problem("world size", r.paths[0], (
                    f"it is rank {r.rank}, outside world size {world} (ranks 0-{world - 1}).")))
        missing = [r for r in range(world) if r not in have]
        if missing:
            word = "rank" if len(missing) == 1 else "ranks"
            problems.append(Problem("missing rank", root, (
                f"{word} {_ranges(missing)} of world size {world} "
                f"{'has' if len(missing) == 1 else 'have'} no usable trace "
                f"(found {len(have)}: {_ranges(sorted(have)) or 'none'}).")))
    elif have:
        missing = [r for r in range(max(have)) if r not in have]
        if missing:
            word = "rank" if len(missing) == 1 else "ranks"
            problems.append(Problem("missing rank", root, (
                f"{word} {_ranges(missing)} below rank {max(have)} "
                f"{'has' if len(missing) == 1 else 'have'} no usable trace; no trace "
                "says the world size.")))

"""Find the per-rank Kineto traces of one distributed run and name what is wrong.

``discover(inputs)`` takes a folder (searched recursively, hidden folders and
files skipped, for ``*.json`` and ``*.json.gz``, ``*.pt.trace.json`` among
them) or a list of files and folders, and returns every rank it could place
plus one ``Problem`` per thing wrong with the input. It never raises on a bad
file: a run with one damaged rank is still worth looking at, as long as the
report says which rank is missing and why. Files in the folder that are not
traces by name (``notes.txt``) and not a torchlens run folder's own files
are listed in ``ignored``: the report says what it did not read.

(Why only the top-level members are read: ``formats.kineto.peek``.)

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

import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchlens.formats.input_files import outside_link, world_size_refusal
from torchlens.formats.kineto.peek import Peek, safe_peek
from torchlens.formats.run_folder import files as run_files
from torchlens.formats.run_folder.files import LIVE_FEED, LIVE_STATUS, MANIFEST
from torchlens.formats.run_folder.manifest import Manifest, ManifestError, load_manifest
from torchlens.model.run_figures import Problem

_RANK_WORD = re.compile(r"(?<![a-z])rank[-_]?(\d+)", re.IGNORECASE)
_RANK_SUFFIX = re.compile(r"_(\d+)(?:\.pt\.trace)?\.json(?:\.gz)?$", re.IGNORECASE)
_RANK_FOLDER = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_STEP_FILE = re.compile(r"step(\d+)\.pt\.trace\.json(?:\.gz)?$", re.IGNORECASE)
#: a torchlens run folder's files that are not traces: read elsewhere, not "ignored"
_RUN_FOLDER_FILES = frozenset({
    run_files.STEPS, run_files.SUMMARIES, run_files.OOM_SNAPSHOT, run_files.LIVE_FEED,
    run_files.SECRET_FILE, run_files.LOG_FILE, run_files.RESULT_FILE})


@dataclass
class RankFile:
    """One rank's traces: one file, or a torchlens rank folder's steps in step order."""

    rank: int
    paths: list[str]
    world_size: int | None
    source: str  # "distributedInfo" | "file name" | "manifest" | "single file"


@dataclass
class RunSources:
    """The ranks found (sorted by rank), the run's world size, what was wrong,
    and the files in the folder that were not read (not traces by name)."""

    ranks: list[RankFile]
    world_size: int | None
    problems: list[Problem]
    root: str
    ignored: list[str] = field(default_factory=list)


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
    ignored: list[str] = []
    for p in paths:
        if p.is_dir():
            run_cands, loose_cands, found = _scan_folder(p, problems, ignored)
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
    return RunSources(ranks=ranks, world_size=world, problems=problems, root=root,
                      ignored=ignored)


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


def _scan_folder(folder: Path, problems: list[Problem], ignored: list[str]
                 ) -> tuple[list[_Candidate], list[_Candidate], list[tuple[str, int | None]]]:
    """Trace files under ``folder``: those a run manifest lists, then the rest;
    other files (hidden ones and a run folder's own aside) go to ``ignored``."""
    files: list[Path] = []
    manifests: dict[Path, Manifest] = {}

    def unlisted(exc: OSError) -> None:
        problems.append(Problem("unreadable", str(exc.filename or folder), (
            f"cannot list this folder ({exc.strerror or exc}); traces in it are not "
            "looked at.")))

    for here, dirs, names in os.walk(folder, onerror=unlisted):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            low = name.lower()
            if name.startswith("."):
                continue
            if not (low.endswith(".json") or low.endswith(".json.gz")):
                if name not in _RUN_FOLDER_FILES:
                    ignored.append(str(Path(here) / name))
                continue
            path = Path(here) / name
            if name == LIVE_STATUS and LIVE_FEED in names:
                continue  # a torchlens run's live status (torchlens.watch), not a trace
            if name == MANIFEST:
                try:
                    manifests[Path(here)] = load_manifest(str(path), within=here)
                    continue
                except ManifestError as exc:
                    if not exc.foreign:  # another program's manifest.json: looked at below
                        problems.append(Problem("unreadable", str(path), (
                            f"the run folder's manifest: {exc.why}; the traces are placed "
                            "by their distributedInfo and names instead.")))
                        continue
            files.append(path)
    files, refused = _inside_runs(files, set(manifests), problems)
    files.sort(key=lambda p: p.parts)
    runs: list[_Candidate] = []
    claimed: set[Path] = set()
    found: list[tuple[str, int | None]] = []
    for run_dir, manifest in manifests.items():
        world = manifest.world_size if manifest.world_size > 0 else None
        found.append((str(run_dir / MANIFEST), world))
        listed: dict[Path, int] = {}
        for entry in manifest.ranks:
            if entry.rank < 0:
                continue
            for rel in entry.traces:
                listed[run_dir / rel] = entry.rank
        # traces on disk the manifest does not list (written after it, or it is
        # older) still belong to the rank folder they are in
        for path in files:
            if path.parent.parent == run_dir and _STEP_FILE.search(path.name):
                m = _RANK_FOLDER.fullmatch(path.parent.name)
                if m and path not in listed:
                    listed[path] = int(m.group(1))
        for path, rank in sorted(listed.items(), key=lambda kv: (kv[1], str(kv[0]))):
            claimed.add(path)
            if path in refused:
                continue  # named once, by _inside_runs
            away = outside_link(str(path), str(run_dir))
            if away is not None:  # "../x" or an absolute path in the manifest, or a link
                problems.append(Problem("unreadable", str(path), (
                    f"{run_dir / MANIFEST} lists it for rank {rank}; refused: {away}.")))
                continue
            if not path.exists():
                problems.append(Problem("unreadable", str(path), (
                    f"{run_dir / MANIFEST} lists it for rank {rank}, but it is not there.")))
                continue
            runs.append(_Candidate(str(path), 0, rank, world, str(run_dir)))
    loose = [_Candidate(str(p), 0) for p in files if p not in claimed]
    return runs, loose, found


def _inside_runs(files: list[Path], run_dirs: set[Path], problems: list[Problem]
                 ) -> tuple[list[Path], set[Path]]:
    """``files`` less those in a torchlens run folder that lead outside it (a
    link to another place), and the set of those: each is named, never
    opened, so nothing of its target is read or shown. A folder of traces
    without a manifest may link to traces kept elsewhere (``_place`` then
    quotes nothing of a linked file)."""
    kept: list[Path] = []
    refused: set[Path] = set()
    for path in files:
        run_dir = next((d for d in path.parents if d in run_dirs), None)
        away = None if run_dir is None else outside_link(str(path), str(run_dir))
        if away is not None:
            problems.append(Problem("unreadable", str(path), f"refused: {away}; left out "
                                    "of the run."))
            refused.add(path)
            continue
        kept.append(path)
    return kept, refused


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


def _peek_each(paths: list[str]) -> list[Peek]:
    return [safe_peek(p) for p in paths]


def _place(c: _Candidate, result: Peek, problems: list[Problem],
           default_rank: int | None = None) -> _Placed | None:
    if result.kind is not None:
        message = result.message.rstrip(".")
        if _linked(c.path) and not message.startswith("refused"):
            # a verdict may quote the file's first bytes: never those of a link's target
            message = (f"not a usable trace ({result.kind}); it is a link to "
                       f"{os.path.realpath(c.path)}, so nothing of it is shown")
        # what was done, for the command line's one line per problem
        problems.append(Problem(result.kind, c.path, f"{message}; left out of the run."))
        return None
    info = result.members.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    trace_world = _as_int(info.get("world_size"))
    if trace_world is not None and (why := world_size_refusal(trace_world)) is not None:
        # checked before any list of that many ranks is made; the file is still read
        problems.append(Problem("world size", c.path, f"its distributedInfo's {why}; "
                                "its world size is not used."))
        trace_world = None
    step_m = _STEP_FILE.search(Path(c.path).name)
    step = int(step_m.group(1)) if step_m else None
    if c.manifest_rank is not None:
        return _Placed(c.manifest_rank, c.path, c.order, "manifest", trace_world,
                       trace_world if trace_world is not None else c.manifest_world,
                       ("run", c.run_dir or ""), step)
    group = ("steps", str(Path(c.path).parent)) if step is not None else ("file", c.path)
    rank = _as_int(info.get("rank"))
    if rank is not None and (why := world_size_refusal(rank + 1)) is not None:
        problems.append(Problem("no rank", c.path, (
            f"its distributedInfo.rank {rank} is not a rank of a believed world size "
            f"({why.split('; ', 1)[-1]}); left out of the run.")))
        return None
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
        "rank-3, rank_3 or a _3 before the extension), so it is left out; rename it, e.g. to "
        "rank3.json, or pass the run's files in a torchlens run folder.")))
    return None


def _linked(path: str) -> bool:
    """Whether ``path`` is reached through a link (of its own or of a folder above it)."""
    return os.path.realpath(path) != os.path.abspath(path)


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
                f"are these files from one run? World size {world} is used.")))
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


def _gaps(have: set[int], end: int) -> tuple[str, int]:
    """The ranks below ``end`` not in ``have``, as ``_ranges`` writes them, and how
    many: from the gaps between the ranks found, never a list of every rank
    (a declared world size is as large as its file says)."""
    parts: list[str] = []
    count = 0
    prev = -1
    for r in sorted(x for x in have if x < end) + [end]:
        if r > prev + 1:
            lo, hi = prev + 1, r - 1
            parts.append(f"{lo}" if lo == hi else f"{lo}-{hi}")
            count += hi - lo + 1
        prev = r
    return ", ".join(parts), count


def _check_ranks(ranks: list[RankFile], world: int | None, root: str,
                 problems: list[Problem]) -> None:
    have = {r.rank for r in ranks}
    if world is not None:
        for r in ranks:
            if r.rank >= world:
                problems.append(Problem("world size", r.paths[0], (
                    f"it is rank {r.rank}, outside world size {world} (ranks 0-{world - 1}); "
                    "it is analysed with the others.")))
        missing, count = _gaps(have, world)
        if count:
            word = "rank" if count == 1 else "ranks"
            problems.append(Problem("missing rank", root, (
                f"{word} {missing} of world size {world} "
                f"{'has' if count == 1 else 'have'} no usable trace "
                f"(found {len(have)}: {_ranges(sorted(have)) or 'none'}).")))
    elif have:
        missing, count = _gaps(have, max(have))
        if count:
            word = "rank" if count == 1 else "ranks"
            problems.append(Problem("missing rank", root, (
                f"{word} {missing} below rank {max(have)} "
                f"{'has' if count == 1 else 'have'} no usable trace; no trace "
                "says the world size.")))

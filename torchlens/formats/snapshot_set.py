"""A folder of per-rank allocator snapshots: which file is which rank.

The naming rule (first layout that matches; a folder holds one of them):

- ``rank<N>/*.pickle`` (or ``.pkl``): one snapshot in each rank's folder.
  ``%ddp_check --profile`` lays its OOM snapshots out this way
  (``RUN_DIR/rank<r>/oom.pickle``, ``formats.run_folder.files.OOM_SNAPSHOT``);
  a rank folder with several snapshots uses its ``oom.pickle`` when it has
  one, and is refused otherwise (say which to compare: keep one per rank).
- ``*.pickle`` / ``*.pkl`` files directly in the folder whose name holds
  ``rank`` and a number: ``rank3.pickle``, ``rank_3.pickle``,
  ``snapshot_rank-3.pickle``, ``train.rank3.oom.pkl``. Two files for one
  rank are refused.

A folder holding Kineto traces (``*.json``, ``*.json.gz``) or a run's
``manifest.json`` stays a run of traces (``frontends.runs``): ``snapshot_set``
returns None for it, so every folder read before keeps being read the same
way. ``snapshot_set(folder, in_run=True)`` reads a run folder's OOM
snapshots all the same (``torchlens.load_snapshots(RUN_DIR)``).

In a run folder (the ``rank<N>/`` layout, or a folder that holds a
``manifest.json``) every snapshot found is opened once through the guarded
open with the folder as its bound (``formats.input_files``: the file actually
opened, after every link, a ``rank<N>`` folder that is a link included, must
lie in the run folder or a ``TORCHLENS_LINK_TARGETS`` folder): a link out of
it is refused in one line (``RefusedFile``) before anything of it is read, as
the run folder's traces and step records are. A flat folder of
``rank3.pickle`` files without a manifest may gather them by links, as a
folder of traces may (docs/SECURITY.md).
"""

from __future__ import annotations

import os
import re

from torchlens.formats.input_files import open_guarded
from torchlens.model import InputError

SUFFIXES = (".pickle", ".pkl")
RANK_DIR = re.compile(r"^rank(\d+)$")
#: ``rank`` then an optional ``_`` / ``-`` then the number, not inside a longer word
RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[_-]?(\d+)(?![0-9])", re.IGNORECASE)
OOM = "oom.pickle"


def _is_trace(name: str) -> bool:
    return name.endswith((".json", ".json.gz")) and name not in ("live.json",)


def _snapshots(folder: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(folder) if n.lower().endswith(SUFFIXES)
                      and os.path.isfile(os.path.join(folder, n)))
    except OSError:
        return []


def holds_traces(folder: str) -> bool:
    """Whether the folder is a run of traces (a manifest, or a trace here or a level below)."""
    names = os.listdir(folder)
    if "manifest.json" in names or any(_is_trace(n) for n in names):
        return True
    return any(_is_trace(n) for d in names if os.path.isdir(os.path.join(folder, d))
               for n in os.listdir(os.path.join(folder, d)))


def snapshot_set(folder: str, *, in_run: bool = False) -> dict[int, str] | None:
    """rank -> snapshot path of a folder of per-rank snapshots (the module's rule);
    None when the folder is not one (a run of traces, unless ``in_run``; no rank
    snapshot). Raises InputError for two snapshots claiming one rank, and
    ``RefusedFile`` for a run folder's snapshot that leads out of it."""
    if not in_run and holds_traces(folder):
        return None
    found, in_rank_folders = _found(folder)
    if found and (in_rank_folders or os.path.isfile(os.path.join(folder, "manifest.json"))):
        for path in found.values():  # a run folder: no link out of it (module doc)
            open_guarded(path, within=folder).close()
    return found


def _found(folder: str) -> tuple[dict[int, str] | None, bool]:
    """The module's rule: rank -> path, and whether they are in ``rank<N>/`` folders."""
    found: dict[int, str] = {}
    for d in sorted(os.listdir(folder)):
        m = RANK_DIR.match(d)
        sub = os.path.join(folder, d)
        if not m or not os.path.isdir(sub):
            continue
        snaps = _snapshots(sub)
        if len(snaps) > 1 and OOM in snaps:
            snaps = [OOM]
        if len(snaps) > 1:
            raise InputError(f"{sub}: {len(snaps)} snapshots ({', '.join(snaps[:3])}) for rank "
                             f"{m.group(1)}: keep one per rank folder (or name it {OOM})")
        if snaps:
            found[int(m.group(1))] = os.path.join(sub, snaps[0])
    if found:
        return found, True
    for name in _snapshots(folder):
        stem = name.rsplit(".", 1)[0]
        m = RANK_IN_NAME.search(stem)
        if not m:
            continue
        rank = int(m.group(1))
        if rank in found:
            raise InputError(f"{folder}: two snapshots for rank {rank} "
                             f"({os.path.basename(found[rank])}, {name}): keep one per rank")
        found[rank] = os.path.join(folder, name)
    return found or None, False

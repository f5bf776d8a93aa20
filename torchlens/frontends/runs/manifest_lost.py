"""What a run's report can and cannot show when its ``manifest.json`` is damaged.

The manifest is no rank: without it every rank is still read (its traces are
placed by their ``distributedInfo`` and names, its step records are its own
``rank<r>/steps.jsonl``), but what only the collector wrote there is gone:
how the run ended and why. The problem ``discover`` named is said again in
those words (walk 25: the report said "the other ranks were analysed" and
the ending and the step chart vanished without a word).
"""

from __future__ import annotations

import os

from torchlens.formats.run_folder.files import MANIFEST
from torchlens.formats.run_folder.manifest import ManifestError, read_manifest
from torchlens.formats.run_folder.sources import Problem

#: what only the manifest holds, as the report would have said it
ONLY_IN_MANIFEST = ("how the run ended (its exit code, a failed rank or lost node, "
                    "restarts, memory creep and the collector's other notes)")


def damaged_manifest(root: str) -> str | None:
    """Why the folder's ``manifest.json`` cannot be used; None when it reads, is
    not there (a folder of traces) or is another program's."""
    if not root or not os.path.isfile(os.path.join(root, MANIFEST)):
        return None
    try:
        read_manifest(root)
    except ManifestError as exc:
        return None if exc.foreign else exc.why
    return None


def lost_words(why: str, chart: bool, verdict: bool) -> str:
    """The problem's message: what is wrong, what is not shown, what stands in."""
    drawn = ["every step over time"] if chart else []
    drawn += ["the slow rank"] if verdict else []
    kept = (f"; {' and '.join(drawn)} come from the ranks' steps.jsonl" if drawn
            else "; no rank's steps.jsonl, so every step over time is not shown either")
    return (f"{MANIFEST} could not be read: {why}; not shown: {ONLY_IN_MANIFEST}; the "
            f"traces are placed by their distributedInfo and names instead{kept}.")


def said_lost(problems: list[Problem], root: str, why: str, chart: bool,
              verdict: bool) -> list[Problem]:
    """``problems`` with the manifest's own in ``lost_words``."""
    path = os.path.join(root, MANIFEST)
    return [Problem(p.kind, p.path, lost_words(why, chart, verdict))
            if p.path == path and p.kind == "unreadable" else p for p in problems]

"""What a run's report says of its damaged files: a ``manifest.json`` that is
damaged or missing, and step records cut short.

The manifest is no rank: without it every rank is still read (its traces are
placed by their ``distributedInfo`` and names, its step records are its own
``rank<r>/steps.jsonl``), but what only the collector wrote there is gone:
how the run ended and why. The problem ``discover`` named is said again in
those words, so the report never says "the other ranks were analysed"
while the ending and the step chart are missing without a word.
"""

from __future__ import annotations

import os

from torchlens.formats.input_files import RefusedFile, open_guarded, read_lines
from torchlens.formats.run_folder.files import MANIFEST, STEPS, rank_dir
from torchlens.formats.run_folder.manifest import Manifest, ManifestError, read_manifest
from torchlens.formats.run_folder.records import damaged, ranks_with_steps
from torchlens.formats.run_folder.sources import Problem

#: what only the manifest holds, as the report would have said it
ONLY_IN_MANIFEST = ("how the run ended (its exit code, a failed rank or lost node, "
                    "restarts, memory creep and the collector's other notes)")

#: ``damaged_manifest``'s why for a folder of step records without a manifest
MISSING = "it is missing"


def damaged_manifest(root: str) -> str | None:
    """Why the folder's ``manifest.json`` cannot be used; None when it reads, is
    another program's, or is not there in a folder of traces alone. A folder
    with ranks' step records but no manifest is a run folder that lost it
    (a deleted manifest is said in the report, not passed over)."""
    if not root:
        return None
    if not os.path.isfile(os.path.join(root, MANIFEST)):
        return MISSING if ranks_with_steps(root) else None
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
    lost = (f"{MANIFEST} is missing: the run was cut off (the process that writes it at "
            "the end, torchlens run or a %ddp_check kernel, died first) or it was deleted"
            if why == MISSING else f"{MANIFEST} could not be read: {why}")
    return (f"{lost}; not shown: {ONLY_IN_MANIFEST}; the "
            f"traces are placed by their distributedInfo and names instead{kept}.")


def said_lost(problems: list[Problem], root: str, why: str, chart: bool,
              verdict: bool) -> list[Problem]:
    """``problems`` with the manifest's own in ``lost_words`` (added when the
    folder named none: a manifest that is missing)."""
    path = os.path.join(root, MANIFEST)
    words = lost_words(why, chart, verdict)
    if not any(p.path == path for p in problems):
        return [*problems, Problem("missing", path, words)]
    return [Problem(p.kind, p.path, words) if p.path == path and p.kind == "unreadable" else p
            for p in problems]


def damaged_steps(root: str, ranks: list[int], manifest: Manifest | None) -> list[Problem]:
    """A rank's step records that could not be read (a line cut short by a crash,
    or damaged), and those missing from a file cut short: the manifest says how
    many the collector got (a file cut to 22 of 60 lines is 38 records
    missing, not one bad line). Named here rather than left out silently. A
    file the guarded open refuses (a link out of the run folder, a FIFO) is
    named with why it was refused, not as cut short: its lines were never read."""
    got = {e.rank: e.steps for e in manifest.ranks} if manifest is not None else {}
    out = []
    for rank in ranks:
        path = os.path.join(rank_dir(root, rank), STEPS)
        why = _refused(path)
        if why is not None:
            out.append(Problem("unreadable", path, f"refused: {why}; rank {rank}'s step "
                               "records were not read, so its steps are not shown."))
            continue
        bad = damaged(root, rank)
        read = _lines(path) - bad
        expected = got.get(rank)
        # a damaged line is in the file: missing are those not there at all
        missing = expected - read - bad if expected is not None and expected > read + bad else 0
        if not (bad or missing):
            continue
        said = [f"{bad} line(s) could not be read (cut short or damaged)"] if bad else []
        if missing:
            said.append(f"{missing} of the {expected} the collector got are not in the file "
                        "(cut short?)")
        out.append(Problem("truncated", path, f"rank {rank}'s step records: {'; '.join(said)}; "
                           f"its steps are the {read} that could be read"))
    return out


def _refused(path: str) -> str | None:
    """Why the guarded open refuses the rank's step records; None when it opens
    them or they are not there (only the open is done: nothing is read)."""
    try:
        open_guarded(path, within=os.path.dirname(os.path.dirname(path)) or ".").close()
    except RefusedFile as exc:
        return exc.why
    except OSError:
        return None
    return None


def _lines(path: str) -> int:
    """The file's non-empty lines (a record each, or a damaged one), read as the
    step records are (``formats.input_files.read_lines``: an overlong line
    comes back as ``b""`` and counts as one)."""
    try:
        return sum(1 for line in read_lines(path, within=os.path.dirname(
            os.path.dirname(path)) or ".") if line.strip() or not line)
    except (OSError, ValueError):
        return 0

"""A run folder's verdict and the findings that lead its report, worked out once.

``folder_verdict`` reads what a run folder says about the whole run (its
manifest and each rank's step records, ``formats.run_folder``) and gives the
slow rank (``analysis.ranks.slow.slow_rank`` over the last steps every rank
finished: the one every view of the folder gives) and the findings that lead
the report, in order: what stopped the run (a lost node, a failed rank), the
slow-rank verdict and a memory creep (ordered by ``analysis.ranks.slow.creep_leads``,
as in the terminal and the checklist), the collector's other notes, and the files that
were not read. The front end (``torchlens.load(RUN_DIR)``) hands them to the
report as they are; ``analyze.analyze`` puts them first.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import msgspec

from torchlens.analysis.ranks.collector_notes import collector_notes
from torchlens.analysis.ranks.ddp_config import parameter_sync
from torchlens.analysis.ranks.job_wide import job_wide
from torchlens.analysis.ranks.recompiles import RunRecompiles, run_recompiles_finding
from torchlens.analysis.ranks.slow import WINDOW, SlowRank, creep_leads, slow_rank
from torchlens.analysis.ranks.stalls import STALL_WINDOW
from torchlens.analysis.ranks.steps import MemoryCreep
from torchlens.analysis.ranks.verdict import creep_finding
from torchlens.formats.run_folder.manifest import CreepEntry, Manifest
from torchlens.formats.run_folder.records import iter_steps
from torchlens.model.findings import (
    FAILED,
    IGNORED_FILES,
    INFO,
    JOB_WIDE,
    MEMORY_CREEP,
    NO_TRACES,
    PARAMETER_SYNC,
    SLOW_RANK,
    WARNING,
    Figure,
    Finding,
)
from torchlens.model.records import StepRecord

#: the title of the step records' slow-rank verdict (the ``%ddp_check`` checklist's)
SLOW_TITLE = "slow rank"
#: step numbers kept per rank past the window: GPU times may still be missing
#: for a rank's newest steps (``analysis.ranks.slow``)
SPARE_STEPS = 8


@dataclass
class FolderVerdict:
    """``slow``: the folder's slow rank (None without two ranks' step records);
    ``findings``: what leads the report, in the order it leads."""

    slow: SlowRank | None = None
    findings: list[Finding] = field(default_factory=list)


def last_common_steps(root: str, ranks: list[int]) -> list[list[StepRecord]]:
    """Each rank's records of the last steps every rank has (a few more than
    ``slow_rank``'s windows: its per-step rule's and the stall rule's), read twice rather than held: a long run has
    millions of records."""
    have = [{rec.step for rec in iter_steps(root, r)} for r in ranks]
    kept = max(WINDOW, STALL_WINDOW) + SPARE_STEPS
    common = set(sorted(set.intersection(*have))[-kept:]) if have else set()
    return [[rec for rec in iter_steps(root, r) if rec.step in common] for r in ranks]


def folder_slow_rank(root: str, ranks: list[int]) -> SlowRank | None:
    """A run folder's slow rank from its step records, the one every view gives
    (``slow_rank`` over the last steps every rank finished); None for a folder
    without two ranks' step records. ``ranks``: the manifest's (or, when it is
    damaged, those with a ``steps.jsonl``)."""
    if not ranks or not root:
        return None
    ranks = sorted(ranks)
    steps = last_common_steps(root, ranks)
    if sum(1 for s in steps if s) < 2:
        return None
    by_rank: list[list[StepRecord]] = [[] for _ in range(max(ranks) + 1)]
    for r, recs in zip(ranks, steps, strict=True):
        by_rank[r] = recs
    judged = slow_rank(by_rank)
    return judged if judged.steps else None


def verdict_findings(judged: SlowRank | None, manifest: Manifest | None,
                     last_steps: dict[int, int] | None = None,
                     starved: Finding | None = None,
                     drift: Finding | None = None) -> list[Finding]:
    """The slow-rank verdict (titled ``slow rank``, as in the ``%ddp_check``
    checklist), an input-bound job (``starved``: it leads "no slow rank")
    and the collector's memory creep, in the order they lead; ranks whose
    parameters differ (``drift``) before them all.
    ``last_steps``: each rank's last recorded step, to name the creep's steps."""
    if drift is not None:
        return [drift, *verdict_findings(judged, manifest, last_steps, starved)]
    said = [dataclasses.replace(judged.finding, title=SLOW_TITLE)] if judged else []
    if starved is not None:
        said = [*said, starved] if said and said[0].severity in (WARNING, FAILED) else [
            starved, *said]
    creep = creep_of(manifest, last_steps) if manifest is not None else None
    if creep is None:
        return said
    if not said:
        return [creep]
    if said[0].code in JOB_WIDE:  # a creep ends the run: it leads
        return [creep, *said]
    # a creep leads "no slow rank", a weak slow rank and a creeping slow rank
    # whose cause its leak can make, as in the terminal and the checklist
    first = (said[0].severity not in (WARNING, FAILED)
             or creep_leads(said[0], creep.ranks))
    return [creep, *said] if first else [*said, creep]


def creep_of(manifest: Manifest, last_steps: dict[int, int] | None = None) -> Finding | None:
    """The collector's first memory creep (``torchlens run``) as its finding.
    ``last_steps``: each rank's last recorded step; the creep rule leaves the
    newest out and fits the ``steps`` before it, which the finding names."""
    for c in manifest.memory_creep[:1]:
        last = (last_steps or {}).get(c.rank) if c.rank is not None else None
        window = ((c.first_step, c.last_step) if c.first_step is not None
                  and c.last_step is not None
                  else (last - c.steps, last - 1) if last is not None and c.steps else None)
        try:
            return creep_finding(_creep(c), [_creep(m) for m in manifest.memory_creep[1:]],
                                 window=window)
        except TypeError:  # a manifest from an older torchlens: its words alone
            return Finding(WARNING, c.words, code=MEMORY_CREEP) if c.words else None
    return None


def _creep(c: CreepEntry) -> MemoryCreep:
    """A manifest's creep as the analysis' record; TypeError when a figure is missing."""
    figures = {k: v for k, v in msgspec.structs.asdict(c).items() if v is not None}
    return MemoryCreep(**figures)


def _said_again(note: Finding, manifest: Manifest, said: list[Finding]) -> bool:
    """Whether ``note`` is the collector's copy of a verdict ``said`` gives
    already (its slow rank or its memory creep, worked out here again)."""
    if manifest.verdict_code is not None:
        return manifest.verdict_code in (SLOW_RANK, MEMORY_CREEP, PARAMETER_SYNC,
                                         *JOB_WIDE) and any(
            f.code == manifest.verdict_code for f in said)
    # a manifest written before the verdict's code was saved: its words
    saved = (manifest.slow_rank or {}).get("finding") or {}
    words = {str(f) for f in said if f.code == MEMORY_CREEP}
    if isinstance(saved, dict) and saved.get("sentence") and any(f.code == SLOW_RANK for f in said):
        advice = saved.get("advice")
        words.add(f"{saved['sentence']}; {advice}" if advice else str(saved["sentence"]))
    return manifest.verdict in words


def leading_findings(judged: SlowRank | None, manifest: Manifest | None,
                     ignored: list[str], root: str,
                     last_steps: dict[int, int] | None = None,
                     starved: Finding | None = None,
                     drift: Finding | None = None) -> list[Finding]:
    """The report's first findings: what stopped the run (the collector's
    verdict when it is not the slow rank's: a lost node, a failed rank)
    leads, then the slow-rank verdict and the memory creep, then the
    collector's other notes (less its copy of a verdict said already), then
    the files not read."""
    said = verdict_findings(judged, manifest, last_steps, starved, drift)
    notes = collector_notes(manifest) if manifest is not None else []
    first: list[Finding] = []
    if manifest is not None and manifest.verdict and notes:  # the first note is its verdict
        first = [] if _said_again(notes[0], manifest, said) else notes[:1]
        notes = notes[1:]
    return [*first, *said, *notes, *ignored_findings(ignored, root)]


def folder_verdict(root: str, manifest: Manifest | None, ranks: list[int],
                   ignored: list[str] | None = None,
                   last_steps: dict[int, int] | None = None) -> FolderVerdict:
    """The folder's slow rank and the findings that lead its report
    (``leading_findings``); ``ranks``: those with step records to judge;
    ``last_steps``: each rank's last recorded step (names a creep's steps)."""
    judged = folder_slow_rank(root, ranks)
    # the job-wide rules over the last steps every rank finished: input-bound,
    # else gradients synchronised too often or in too small buckets; and
    # parameters that differ across ranks
    steps = common_by_rank(root, ranks) if judged is not None else []
    starved = job_wide(steps) if steps else None
    drift = parameter_sync(steps) if steps else None
    return FolderVerdict(judged, leading_findings(judged, manifest, ignored or [], root,
                                                  last_steps, starved, drift))


def with_run_recompiles(verdict: FolderVerdict, seen: RunRecompiles) -> None:
    """``verdict``'s findings with the run's recompiles (``run_recompiles_finding``:
    every step record's, when the slow-rank verdict does not name one), right
    after the verdict they are about, before the notes."""
    said = run_recompiles_finding(seen, verdict.slow.finding if verdict.slow else None)
    if said is None:
        return
    at = next((i + 1 for i, f in enumerate(verdict.findings) if f.code == SLOW_RANK),
              len(verdict.findings))
    verdict.findings.insert(at, said)


def common_by_rank(root: str, ranks: list[int]) -> list[list[StepRecord]]:
    """``last_common_steps`` indexed by rank (an empty list for a rank not given),
    read once for the job-wide rules."""
    if not ranks or not root:
        return []
    ranks = sorted(ranks)
    by_rank: list[list[StepRecord]] = [[] for _ in range(max(ranks) + 1)]
    for r, recs in zip(ranks, last_common_steps(root, ranks), strict=True):
        by_rank[r] = recs
    return by_rank


def ignored_findings(ignored: list[str], root: str, shown: int = 3) -> list[Finding]:
    """The finding the report and ``torchlens analyze`` give for files not read
    (none when there are none): the first few, relative to the root."""
    if not ignored:
        return []
    names = [os.path.relpath(p, root) if root else p for p in ignored]
    listed = ", ".join(names[:shown]) + (f" and {len(names) - shown} more"
                                         if len(names) > shown else "")
    files = "file" if len(names) == 1 else "files"
    return [Finding(INFO, f"ignored {len(names)} {files} that "
                    f"{'is' if len(names) == 1 else 'are'} not a trace (only *.json and "
                    f"*.json.gz are read): {listed}", (Figure("ignored", len(names)),),
                    code=IGNORED_FILES)]


def no_traces_note(traced: bool, stepped: bool) -> list[Finding]:
    """A run folder with step records and no rank's trace (``torchlens run
    --no-profile``, or a run that ended before any profiled step): a note,
    not an input problem; nothing for any other folder."""
    if traced or not stepped:
        return []
    return [Finding(INFO, "no rank's trace in this folder (torchlens run --no-profile, or no "
                          "rank reached a profiled step): the figures come from the step "
                          "records alone", code=NO_TRACES)]

"""What ``torchlens run``'s collector wrote into a run folder's manifest, as sentences.

The collector saw every step of every rank (``rank<r>/steps.jsonl``), while
the traces cover only the profiled steps; so its verdict (the slow rank over
all steps), the lost nodes, restarts, dropped messages and where the run
stopped lead the report's findings (``torchlens.load(RUN_DIR)``). A manifest
written by ``%ddp_check`` gives no sentence.

The manifest keeps the verdict as words (``str(Finding)``) with its code
(``verdict_code``); when it says what stopped the run (a rank failed, a node
was lost: ``verdict._verdict``'s first cases) it is given back as that failed
finding, so the report tags it and leads with it.
"""

from __future__ import annotations

import re

from torchlens.analysis.ranks.silence import SILENT_RANK
from torchlens.formats.run_folder.manifest import SOURCE_RUN, CollectorEntry, Manifest
from torchlens.model.findings import (
    COLLECTIVE_MISMATCH,
    COLLECTOR_NOTE,
    FAILED,
    FAILED_RANK,
    INFO,
    LOST_NODE,
    UNEVEN_INPUTS,
    WARNING,
    Figure,
    Finding,
)

#: the titles of a failure verdict: the %ddp_check checklist's word for a
#: rank that raised or died, and the collector's for a node that went silent
CRASHED_TITLE, LOST_TITLE, LOST_RANK_TITLE = "crashed worker", "lost node", "lost rank"
#: the failures whose cause is known, by their own name
_TITLES = {UNEVEN_INPUTS: "uneven inputs", COLLECTIVE_MISMATCH: "collective mismatch"}
#: the advice ``verdict._verdict`` gives a failure, after the sentence's "; "
_ADVICE = re.compile(r"; ((?:the other ranks' data is kept; )?(?:look at|give every rank|issue the same|find what stopped) [^;]*)$")
#: ``verdict._verdict``'s failure sentences (an older manifest's verdict can be
#: the slow rank's even with a node lost, so the words decide, not the states)
_LOST = re.compile(r"^(?:node \S+|a node)(?: \(host [^)]*\))? was lost: ")
#: a rank lost while the other ranks of its node went on (killed or hung)
_RANK_LOST = re.compile(r"^ranks? [\d, ]+ was lost: ")
_CRASHED = re.compile(r"^rank \d+ (?:failed: |stopped when )")


def dropped_words(why: dict[str, int]) -> str:
    """``3 bad signature, 1 oversized``: the collector's drops by reason; a
    manifest without the reasons (an older one) read them all as bad signatures."""
    if not why:
        return "bad signature"
    return ", ".join(f"{n} {reason}" for reason, n in sorted(why.items(), key=lambda kv: -kv[1]))


def sampling_words(entry: CollectorEntry | None) -> str:
    """What the collector kept of what the ranks sent, as one sentence, when it
    did not keep everything ("" when it did, or for a manifest without it):
    the summaries it sampled by its stated rule, and any value a rank
    overwrote in the store before the collector read it."""
    if entry is None:
        return ""
    parts = []
    if entry.summaries_sampled or entry.summaries_overwritten or entry.summaries_skipped:
        said = (f"summaries of {entry.summaries_kept:,} profiled steps kept of "
                f"{entry.summaries_sent + entry.summaries_skipped:,}")
        if entry.summaries_sampled:
            said += (f": {entry.summaries_sampled:,} sampled out (once it fell "
                     f"{entry.summaries_behind_at} summaries behind a rank, whose store ring "
                     f"holds {entry.summaries_ring}, the collector kept every k-th summary of "
                     f"each rank, k doubling up to {entry.stride_max})")
        if entry.summaries_skipped:
            said += (f"{';' if entry.summaries_sampled else ':'} {entry.summaries_skipped:,} "
                     f"not sent by ranks whose ring of {entry.summaries_ring} summaries was "
                     "full of ones it had not read (the ranks still wrote those steps' trace files)")
        if entry.summaries_overwritten:
            said += (f"{';' if entry.summaries_sampled or entry.summaries_skipped else ':'} "
                     f"{entry.summaries_overwritten:,} overwritten in the store before it "
                     "read them")
        parts.append(said)
    if entry.step_records_shed:
        parts.append(f"{entry.step_records_shed:,} step records shed by ranks that held more "
                     "than they may while it had not read their ring (missing from the run "
                     "folder)")
    if entry.step_batches_overwritten:
        parts.append(f"{entry.step_batches_overwritten:,} of {entry.step_batches_sent:,} step "
                     "batches overwritten in the store before it read them (missing from the "
                     "run folder)")
    return "; ".join(parts)


def failure_finding(manifest: Manifest) -> Finding | None:
    """The collector's verdict as a failed finding when it says a rank failed
    or a node was lost (None otherwise, and for another writer's manifest).
    Its ``verdict_code`` says which; a manifest written before the code was
    saved is read by its words."""
    said = manifest.verdict
    if manifest.source != SOURCE_RUN or not said:
        return None
    if manifest.verdict_code is not None:
        # the first lost node is the verdict's (``verdict._verdict``)
        whole = bool(manifest.lost_nodes) and manifest.lost_nodes[0].whole_node
        lost = manifest.verdict_code == LOST_NODE and whole
        rank_lost = manifest.verdict_code == LOST_NODE and not whole
        crashed = manifest.verdict_code in (FAILED_RANK, UNEVEN_INPUTS, COLLECTIVE_MISMATCH)
    else:
        lost = bool(manifest.lost_nodes and _LOST.match(said))
        rank_lost = bool(manifest.lost_nodes and _RANK_LOST.match(said))
        crashed = bool(_CRASHED.match(said) and any(e.state == "failed" for e in manifest.ranks))
    if not (lost or rank_lost or crashed):
        return None
    m = _ADVICE.search(said)
    title = (LOST_TITLE if lost else LOST_RANK_TITLE if rank_lost
             else _TITLES.get(manifest.verdict_code or "", CRASHED_TITLE))
    ranks = {"ranks": list(manifest.verdict_ranks)} if manifest.verdict_ranks else {}
    return Finding(FAILED, said[:m.start()] if m else said, advice=m.group(1) if m else "",
                   title=title, details=ranks,
                   code=(manifest.verdict_code or FAILED_RANK) if crashed else LOST_NODE)


def collector_notes(manifest: Manifest) -> list[Finding]:
    """The collector's findings in the manifest (empty for another writer's):
    the verdict of a failed run first as its failed finding, then its notes
    (as information)."""
    if manifest.source != SOURCE_RUN:
        return []
    out: list[Finding] = []
    failure = failure_finding(manifest)
    if failure is not None:
        out.append(failure)
    elif manifest.verdict and manifest.verdict_code == SILENT_RANK:
        # only the collector saw a rank go silent (no step record says so): its
        # verdict is the run's problem, with its kind and ranks
        ranks = {"ranks": list(manifest.verdict_ranks)} if manifest.verdict_ranks else {}
        m = _ADVICE.search(manifest.verdict)
        out.append(Finding(WARNING, manifest.verdict[:m.start()] if m else manifest.verdict,
                           advice=m.group(1) if m else "", title="silent rank",
                           details=ranks, code=SILENT_RANK))
    elif manifest.verdict:
        # the collector's verdict in its words: its kind travels in the details
        out.append(Finding(INFO, f"torchlens run (every step of every rank): {manifest.verdict}",
                           details={"verdict_code": manifest.verdict_code},
                           code=COLLECTOR_NOTE))
    for node in manifest.lost_nodes:
        if node.words:
            out.append(Finding(INFO, f"lost {node.words}", code=LOST_NODE))
    if manifest.stopped:
        code = "" if "exit code" in manifest.stopped else f" (exit code {manifest.exit_code})"
        out.append(Finding(INFO, f"how the run ended: {manifest.stopped}{code}", code="run_ended"))
    for r in manifest.restarts:
        if r.words:  # analysis.ranks.restarts wrote them
            out.append(Finding(INFO, f"restart {r.number}: {r.words}", code="restart"))
    if manifest.dropped_messages:
        out.append(Finding(
            INFO, f"{manifest.dropped_messages} message(s) to the collector were dropped "
            f"({dropped_words(manifest.dropped_why)}): written by something other than "
            "this run's ranks (another run on the port, or forged)",
            (Figure("dropped", manifest.dropped_messages),), code="dropped_messages"))
    kept = sampling_words(manifest.collector)
    if kept:
        out.append(Finding(INFO, f"the collector kept {kept}", code="collector_sampling"))
    out += [Finding(INFO, str(n), code=COLLECTOR_NOTE) for n in manifest.notes]
    return out

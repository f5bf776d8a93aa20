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

from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest
from torchlens.model.findings import (
    COLLECTOR_NOTE,
    FAILED,
    FAILED_RANK,
    INFO,
    LOST_NODE,
    Figure,
    Finding,
)

#: the titles of a failure verdict: the %ddp_check checklist's word for a
#: rank that raised or died, and the collector's for a node that went silent
CRASHED_TITLE, LOST_TITLE, LOST_RANK_TITLE = "crashed worker", "lost node", "lost rank"
#: the advice ``verdict._verdict`` gives a failure, after the sentence's "; "
_ADVICE = re.compile(r"; ((?:the other ranks' data is kept; )?look at [^;]*)$")
#: ``verdict._verdict``'s failure sentences (an older manifest's verdict can be
#: the slow rank's even with a node lost, so the words decide, not the states)
_LOST = re.compile(r"^(?:node \S+|a node)(?: \(host [^)]*\))? was lost: ")
#: a rank lost while the other ranks of its node went on (killed or hung)
_RANK_LOST = re.compile(r"^ranks? [\d, ]+ was lost: ")
_CRASHED = re.compile(r"^rank \d+ (?:failed: |stopped when )")


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
        crashed = manifest.verdict_code == FAILED_RANK
    else:
        lost = bool(manifest.lost_nodes and _LOST.match(said))
        rank_lost = bool(manifest.lost_nodes and _RANK_LOST.match(said))
        crashed = bool(_CRASHED.match(said) and any(e.state == "failed" for e in manifest.ranks))
    if not (lost or rank_lost or crashed):
        return None
    m = _ADVICE.search(said)
    title = LOST_TITLE if lost else LOST_RANK_TITLE if rank_lost else CRASHED_TITLE
    ranks = {"ranks": list(manifest.verdict_ranks)} if manifest.verdict_ranks else {}
    return Finding(FAILED, said[:m.start()] if m else said, advice=m.group(1) if m else "",
                   title=title, details=ranks, code=FAILED_RANK if crashed else LOST_NODE)


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
            INFO, f"{manifest.dropped_messages} message(s) to the collector failed their "
            "signature and were dropped (another run on the port, or forged)",
            (Figure("dropped", manifest.dropped_messages),), code="dropped_messages"))
    out += [Finding(INFO, str(n), code=COLLECTOR_NOTE) for n in manifest.notes]
    return out

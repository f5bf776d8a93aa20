"""What ``torchlens run``'s collector wrote into a run folder's manifest, as sentences.

The collector saw every step of every rank (``rank<r>/steps.jsonl``), while
the traces cover only the profiled steps; so its verdict (the slow rank over
all steps), the lost nodes, restarts, dropped messages and where the run
stopped lead the report's findings (``torchlens.load(RUN_DIR)``). A manifest
written by ``%ddp_check`` gives no sentence.

The manifest keeps the verdict as words (``str(Finding)``); when it says what
stopped the run (a rank failed, a node was lost: ``verdict._verdict``'s first
cases) it is given back as that failed finding, so the report tags it and
leads with it instead of showing a plain sentence.
"""

from __future__ import annotations

import re
from typing import Any

from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest
from torchlens.model.findings import FAILED, Finding

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
    or a node was lost (None otherwise, and for another writer's manifest)."""
    said = manifest.verdict
    if manifest.source != SOURCE_RUN or not said:
        return None
    lost = bool(manifest.lost_nodes and _LOST.match(said))
    rank_lost = bool(manifest.lost_nodes and _RANK_LOST.match(said))
    if not (lost or rank_lost) and not (_CRASHED.match(said)
                                        and any(e.state == "failed" for e in manifest.ranks)):
        return None
    m = _ADVICE.search(said)
    title = LOST_TITLE if lost else LOST_RANK_TITLE if rank_lost else CRASHED_TITLE
    return Finding(FAILED, said[:m.start()] if m else said, advice=m.group(1) if m else "",
                   title=title)


def collector_notes(manifest: Manifest) -> list[str | dict[str, Any]]:
    """The collector's findings in the manifest (empty for another writer's):
    sentences, the verdict of a failed run first as its failed finding's dict."""
    if manifest.source != SOURCE_RUN:
        return []
    out: list[str | dict[str, Any]] = []
    failure = failure_finding(manifest)
    if failure is not None:
        out.append(failure.to_dict())
    elif manifest.verdict:
        out.append(f"torchlens run (every step of every rank): {manifest.verdict}")
    for node in manifest.lost_nodes:
        if node.get("words"):
            out.append(f"lost {node['words']}")
    if manifest.stopped:
        code = "" if "exit code" in manifest.stopped else f" (exit code {manifest.exit_code})"
        out.append(f"how the run ended: {manifest.stopped}{code}")
    for r in manifest.restarts:
        if r.get("words"):  # analysis.ranks.restarts wrote them
            out.append(f"restart {r.get('number')}: {r['words']}")
    if manifest.dropped_messages:
        out.append(f"{manifest.dropped_messages} message(s) to the collector failed their "
                   "signature and were dropped (another run on the port, or forged)")
    out += [str(n) for n in manifest.notes]
    return out

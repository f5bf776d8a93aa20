"""What ``torchlens run``'s collector wrote into a run folder's manifest, as sentences.

The collector saw every step of every rank (``rank<r>/steps.jsonl``), while
the traces cover only the profiled steps; so its verdict (the slow rank over
all steps), the lost nodes, restarts, dropped messages and where the run
stopped lead the report's findings (``torchlens.load(RUN_DIR)``). A manifest
written by ``%ddp_check`` gives no sentence.
"""

from __future__ import annotations

from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest


def collector_notes(manifest: Manifest) -> list[str]:
    """The collector's findings in the manifest (empty for another writer's)."""
    if manifest.source != SOURCE_RUN:
        return []
    out = []
    if manifest.verdict:
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

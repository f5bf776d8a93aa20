"""What ``torchlens run``'s collector wrote into a run folder's manifest, as sentences.

The collector saw every step of every rank (``rank<r>/steps.jsonl``), while
the traces cover only the profiled steps; so its verdict (the slow rank over
all steps), the lost nodes, restarts, dropped messages and where the run
stopped lead the report's findings. A manifest written by ``%ddp_check``, or
none, gives no sentence.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .run_folder import MANIFEST, RUN_FORMAT

SOURCE = "torchlens run"


def collector_notes(root: str) -> list[str]:
    """The collector's findings for the run folder ``root`` (empty when it has none)."""
    try:
        with open(os.path.join(root, MANIFEST), encoding="utf-8") as fh:
            doc: Any = json.load(fh)
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict) or doc.get("format") != RUN_FORMAT or doc.get("source") != SOURCE:
        return []
    out = []
    if doc.get("verdict"):
        out.append(f"torchlens run (every step of every rank): {doc['verdict']}")
    for node in doc.get("lost_nodes") or []:
        if isinstance(node, dict) and node.get("words"):
            out.append(f"lost {node['words']}")
    if doc.get("stopped"):
        out.append(f"the run {doc['stopped']} (exit code {doc.get('exit_code')})")
    restarts = doc.get("restarts") or []
    if restarts:
        out.append(f"the elastic agent restarted workers {len(restarts)} time(s)")
    if doc.get("dropped_messages"):
        out.append(f"{doc['dropped_messages']} message(s) to the collector failed their "
                   "signature and were dropped (another run on the port, or forged)")
    out += [str(n) for n in doc.get("notes") or []]
    return out

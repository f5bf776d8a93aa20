"""What ``torchlens run``'s collector wrote into a run folder's manifest, as sentences.

The collector saw every step of every rank (``rank<r>/steps.jsonl``), while
the traces cover only the profiled steps; so its verdict (the slow rank over
all steps), the lost nodes, restarts, dropped messages and where the run
stopped lead the report's findings. A manifest written by ``%ddp_check``, or
none, gives no sentence. ``collected_steps`` reads the step records back for
the report's chart of every step over time (``analysis.run_steps``).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any

from torchlens.formats.run_folder import MANIFEST, RUN_FORMAT
from torchlens.model.records import StepRecord

SOURCE = "torchlens run"


def _manifest(root: str) -> dict[str, Any] | None:
    """The manifest ``torchlens run`` wrote in ``root``; None for any other folder."""
    try:
        with open(os.path.join(root, MANIFEST), encoding="utf-8") as fh:
            doc: Any = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != RUN_FORMAT or doc.get("source") != SOURCE:
        return None
    return doc


def collector_notes(root: str) -> list[str]:
    """The collector's findings for the run folder ``root`` (empty when it has none)."""
    doc = _manifest(root)
    if doc is None:
        return []
    out = []
    if doc.get("verdict"):
        out.append(f"torchlens run (every step of every rank): {doc['verdict']}")
    for node in doc.get("lost_nodes") or []:
        if isinstance(node, dict) and node.get("words"):
            out.append(f"lost {node['words']}")
    if doc.get("stopped"):
        out.append(f"the run {doc['stopped']} (exit code {doc.get('exit_code')})")
    for r in doc.get("restarts") or []:
        if isinstance(r, dict) and r.get("words"):  # analysis.restarts wrote them
            out.append(f"restart {r.get('number')}: {r['words']}")
    if doc.get("dropped_messages"):
        out.append(f"{doc['dropped_messages']} message(s) to the collector failed their "
                   "signature and were dropped (another run on the port, or forged)")
    out += [str(n) for n in doc.get("notes") or []]
    return out


@dataclass
class CollectedSteps:
    """Every step record of every rank, as ``rank<r>/steps.jsonl`` holds them, cut to
    what a chart over time needs: per rank, columns ``restart``, ``step``, ``t0``, ``t1``."""

    ranks: dict[int, dict[str, list[Any]]]
    restarts: list[dict[str, Any]]  # the manifest's (``analysis.restarts.Restart``)
    started: float | None  # when the collector started (unix s)


def collected_steps(root: str) -> CollectedSteps | None:
    """The step records of the ``torchlens run`` folder ``root``; None for any other.

    A line that is not a step record (a cut last line) is skipped: the records
    before it still make the chart.
    """
    doc = _manifest(root)
    if doc is None:
        return None
    ranks: dict[int, dict[str, list[Any]]] = {}
    for entry in doc.get("ranks") or []:
        rank = entry.get("rank") if isinstance(entry, dict) else None
        if not isinstance(rank, int):
            continue
        cols: dict[str, list[Any]] = {"restart": [], "step": [], "t0": [], "t1": []}
        with contextlib.suppress(OSError), \
                open(os.path.join(root, f"rank{rank}", "steps.jsonl"), encoding="utf-8") as fh:
            for line in fh:
                try:
                    rec = StepRecord.from_json(line)
                except ValueError:
                    continue
                cols["restart"].append(rec.start)
                cols["step"].append(rec.step)
                cols["t0"].append(rec.t0)
                cols["t1"].append(rec.t1)
        ranks[rank] = cols
    started = doc.get("started")
    return CollectedSteps(ranks, [r for r in doc.get("restarts") or [] if isinstance(r, dict)],
                          float(started) if isinstance(started, (int, float)) else None)

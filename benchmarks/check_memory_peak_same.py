"""Check that the memory peak of every shared snapshot is the same before and after a
change (issue 24's speed work must not move a figure).

Run::

    # before the change (the other checkout on PYTHONPATH): record
    PYTHONPATH=../before python benchmarks/check_memory_peak_same.py --record peak-before.json
    # after: compare (exit 1 and the snapshots that differ when any)
    PYTHONPATH=. python benchmarks/check_memory_peak_same.py --compare peak-before.json

Per snapshot (``benchmarks/paths.py``'s ``snapshots/*.pickle``, ``--snapshots`` another
folder), through ``torchlens.load``: ``categories()`` and ``peak()`` of a fresh result
(the DataFrames as a user gets them first), then of the report: the peak, its trace entry and x, the trigger, the
unattributed bytes, every category and site row (bytes, blocks, categories, function),
the timeline's start/end/peak reserved and its series' sum, the top sites, the notes
and ``to_json()`` less the peak's ``missing`` lines and its ``by_stage`` rows (both
may grow with a new answer; every figure they hold is compared above). A snapshot that
fails to load records its one-line error, which must not change either.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import paths

SNAPSHOTS = paths.snapshots()


def figures(path: Path) -> dict[str, Any]:
    import torchlens

    try:
        # peak() and categories() first, as a user asks them (a loaded file's come
        # from its columns until the report is made), then the report
        fresh = torchlens.load(str(path))
        tables = [fresh.categories().to_dict("split"), fresh.peak().to_dict("split")]
        r = torchlens.load(str(path))
        a = r.analysis()
    except Exception as exc:  # noqa: BLE001 - the error line is the figure
        return {"error": f"{type(exc).__name__}: {exc}"}
    pk, tl = a.peak, a.timeline
    doc = r.to_json()
    doc["peak"] = {k: v for k, v in doc["peak"].items() if k not in ("missing", "by_stage")}

    def rows(groups: list[Any]) -> list[list[Any]]:
        return [[g.name, g.bytes, g.count, g.categories, g.function] for g in groups]

    t = pk.trigger
    return {"peak": pk.peak, "entry": pk.entry, "x": pk.x, "unattributed": pk.unattributed,
            "trigger": None if t is None else [t.size, t.site, t.category],
            "by_category": rows(pk.by_category), "by_site": rows(pk.by_site),
            "start": tl.start_allocated, "end": tl.end_allocated,
            "peak_reserved": tl.peak_reserved, "points": len(tl.allocated),
            "allocated_sum": sum(tl.allocated), "notes": a.notes,
            "sites": [[s.site, s.bytes, s.count, s.alive_bytes] for s in a.sites],
            "peak_and_categories_tables": json.loads(json.dumps(tables, default=str)),
            "to_json": json.loads(json.dumps(doc, default=str))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", metavar="JSON")
    mode.add_argument("--compare", metavar="JSON")
    ap.add_argument("--snapshots", default=str(SNAPSHOTS))
    args = ap.parse_args()
    now = {p.name: figures(p) for p in sorted(Path(args.snapshots).glob("*.pickle"))}
    if args.record:
        Path(args.record).write_text(json.dumps(now, indent=1, sort_keys=True))
        print(f"recorded {len(now)} snapshots to {args.record}")
        return 0
    before = json.loads(Path(args.compare).read_text())
    bad = 0
    for name in sorted(set(before) | set(now)):
        b, a = before.get(name), now.get(name)
        same = b == a
        bad += not same
        keys = [] if same or not (a and b) else [k for k in b if b.get(k) != a.get(k)]
        peak = (a or {}).get("peak", (a or {}).get("error"))
        print(f"{name}: peak {peak} {'same' if same else 'DIFFERS ' + ', '.join(keys)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""A ``MemoryAnalysis`` as one JSON document (``torchlens report X.pickle --json``,
``MemoryResult.to_json()``): the same figures the text view and the HTML draw, as
plain integers (bytes), floats (shares) and strings, so a script and a reader
of the report never see different numbers.
"""

from __future__ import annotations

from typing import Any

from torchlens.analysis.memory.analyze import MemoryAnalysis

#: what each key of the document holds (printed nowhere; kept next to the code)
KEYS = {
    "kind": '"gpumem"',
    "measured_on": "cuda (a live capture), cpu (the CPU stand-in) or snapshot (a file)",
    "scope": "what the figures span: the cell or the recorded window",
    "start_allocated / end_allocated / peak_allocated / peak_reserved": "bytes",
    "reserved_source": "where reserved memory comes from: snapshot, memory_stats or the "
                       "allocator model",
    "peak": "what was alive at the peak by category, site and stage; categories_from "
            "says who named the categories (PeakAnalysis.to_json)",
    "sites": "top allocation sites by bytes allocated in the scope (the text view's rows)",
    "fragmentation": "reserved, allocated, free cached bytes and their share, the largest "
                     "free block, torch's inactive_split bytes, segments",
    "leaks": "sites still holding memory at the end, left behind on several passes",
    "growth": "allocated at the end of each --repeat run and its change",
    "oom": "the out-of-memory diagnosis (its sentence and advice), or null",
    "notes": "what the figures rest on, one sentence each",
}


def memory_document(a: MemoryAnalysis, *, top: int = 15) -> dict[str, Any]:
    """The analysis as plain data; ``top`` rows of sites and leaks (as the text view)."""
    tl, f = a.timeline, a.frag
    unusable = None
    if a.unusable_for_largest is not None:
        size, share = a.unusable_for_largest
        unusable = {"largest_request": size, "share_of_free_too_small": share}
    d = a.diagnosis
    return {
        "kind": "gpumem", "measured_on": a.measured_on, "scope": a.scope,
        "start_allocated": tl.start_allocated, "end_allocated": tl.end_allocated,
        "peak_allocated": tl.peak_allocated, "peak_reserved": tl.peak_reserved,
        "reserved_source": a.reserved_source,
        "peak": a.peak.to_json() if a.peak is not None else None,
        "sites": [{"site": s.site, "function": s.function, "bytes": s.bytes,
                   "count": s.count, "largest": s.largest, "alive_bytes": s.alive_bytes}
                  for s in a.sites[:top]],
        "fragmentation": {
            "reserved": f.reserved, "allocated": f.allocated, "free_cached": f.free_cached,
            "free_share": f.free_share, "largest_free_block": f.largest_free_block,
            "inactive_split": f.inactive_split, "torch_inactive_split": f.torch_inactive_split,
            "segments": f.n_segments, "measured": a.segments_measured,
            "unusable_for_largest": unusable},
        "leaks": [{"site": r.site, "function": r.function, "bytes": r.bytes,
                   "count": r.count, "passes": r.passes} for r in a.possible_leaks[:top]],
        "growth": [{"run": g.run, "end_allocated": g.end_allocated, "growth": g.growth}
                   for g in a.growth],
        "steady_growth": a.steady_growth,
        "oom": None if d is None else {"cause": d.cause, "requested": d.requested,
                                       "site": d.site, "sentence": d.finding.sentence,
                                       "advice": d.finding.advice},
        "notes": list(a.notes),
    }

"""A ``MemoryAnalysis`` as one JSON document (``torchlens report X.pickle --json``,
``MemoryResult.to_json()``): the same figures the text view and the HTML draw, as
plain integers (bytes), floats (shares) and strings, so a script and a reader
of the report never see different numbers.
"""

from __future__ import annotations

import msgspec

from torchlens.analysis.memory.analyze import MemoryAnalysis
from torchlens.analysis.memory.peak import PeakDocument

#: what each key of the document holds (printed nowhere; kept next to the code)
KEYS = {
    "kind": '"gpumem"',
    "measured_on": "cuda (a live capture), cpu (the CPU stand-in) or snapshot (a file)",
    "scope": "what the figures span: the cell or the recorded window",
    "start_allocated / end_allocated / peak_allocated / peak_reserved": "bytes",
    "reserved_source": "where reserved memory comes from: snapshot, memory_stats or the "
                       "allocator model",
    "peak": "what was alive at the peak by category, site and stage; categories_from "
            "says who named the categories (PeakAnalysis.document)",
    "sites": "top allocation sites by bytes allocated in the scope (the text view's rows)",
    "fragmentation": "reserved, allocated, free cached bytes and their share, the largest "
                     "free block, torch's inactive_split bytes, segments",
    "leaks": "sites still holding memory at the end, left behind on several passes",
    "growth": "allocated at the end of each --repeat run and its change",
    "oom": "the out-of-memory diagnosis (its sentence and advice), or null",
    "notes": "what the figures rest on, one sentence each",
    "not_measured": "what the capture could not measure, one line each",
}


class SiteDocument(msgspec.Struct):
    """A top allocation site: bytes allocated over the scope, how many, the largest,
    and how many bytes were still allocated at the end."""

    site: str
    function: str
    bytes: int
    count: int
    largest: int
    alive_bytes: int


class UnusableDocument(msgspec.Struct):
    """The scope's largest request and the share of free cached memory too small for it."""

    largest_request: int
    share_of_free_too_small: float


class FragmentationDocument(msgspec.Struct):
    """Reserved, allocated and free cached bytes, the free share, the largest free
    block, inactive_split (the model's and torch's), segments, and whether the
    segments were measured or modelled."""

    reserved: int
    allocated: int
    free_cached: int
    free_share: float
    largest_free_block: int
    inactive_split: int
    torch_inactive_split: int | None
    segments: int
    measured: bool
    unusable_for_largest: UnusableDocument | None


class LeakDocument(msgspec.Struct):
    """A site that left memory behind on ``passes`` passes."""

    site: str
    function: str
    bytes: int
    count: int
    passes: int


class GrowthDocument(msgspec.Struct):
    """Allocated at the end of one ``--repeat`` run and its change."""

    run: int
    end_allocated: int
    growth: int


class OomDocument(msgspec.Struct):
    """The out-of-memory diagnosis: its cause, the request, the site, sentence and advice."""

    cause: str
    requested: int | None
    site: str | None
    sentence: str
    advice: str


class MemoryDocument(msgspec.Struct):
    """The memory analysis as one JSON document (``KEYS``); ``not_measured``: what the
    capture could not measure (the result adds it)."""

    kind: str
    measured_on: str
    scope: str
    start_allocated: int
    end_allocated: int
    peak_allocated: int
    peak_reserved: int
    reserved_source: str
    peak: PeakDocument | None
    sites: list[SiteDocument]
    fragmentation: FragmentationDocument
    leaks: list[LeakDocument]
    growth: list[GrowthDocument]
    steady_growth: int | None
    oom: OomDocument | None
    notes: list[str]
    not_measured: list[str] = msgspec.field(default_factory=list)


def memory_document(a: MemoryAnalysis, *, top: int = 15) -> MemoryDocument:
    """The analysis as plain figures; ``top`` rows of sites and leaks (as the text view)."""
    tl, f = a.timeline, a.frag
    unusable = None
    if a.unusable_for_largest is not None:
        size, share = a.unusable_for_largest
        unusable = UnusableDocument(size, share)
    d = a.diagnosis
    return MemoryDocument(
        kind="gpumem", measured_on=a.measured_on, scope=a.scope,
        start_allocated=tl.start_allocated, end_allocated=tl.end_allocated,
        peak_allocated=tl.peak_allocated, peak_reserved=tl.peak_reserved,
        reserved_source=a.reserved_source,
        peak=a.peak.document() if a.peak is not None else None,
        sites=[SiteDocument(s.site, s.function, s.bytes, s.count, s.largest, s.alive_bytes)
               for s in a.sites[:top]],
        fragmentation=FragmentationDocument(
            f.reserved, f.allocated, f.free_cached, f.free_share, f.largest_free_block,
            f.inactive_split, f.torch_inactive_split, f.n_segments, a.segments_measured,
            unusable),
        leaks=[LeakDocument(r.site, r.function, r.bytes, r.count, r.passes)
               for r in a.possible_leaks[:top]],
        growth=[GrowthDocument(g.run, g.end_allocated, g.growth) for g in a.growth],
        steady_growth=a.steady_growth,
        oom=None if d is None else OomDocument(d.cause, d.requested, d.site,
                                               d.finding.sentence, d.finding.advice),
        notes=list(a.notes))

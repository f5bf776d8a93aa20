"""What the ranks of a %ddp_check publish on the store besides heartbeats, as
the kernel reads it: step batches and profiled-step summaries while they run
(``StepReader``), and each rank's result and collective fingerprints at the
end (``read_ranks``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from torchlens.capture.channel import protocol
from torchlens.formats.run_folder.records import append_steps
from torchlens.model.collectives import Fingerprint, fingerprints_from
from torchlens.model.feed import RankFeed
from torchlens.model.messages import DdpHeartbeat, MemoryReading
from torchlens.model.rank_report import RankReport, report_from
from torchlens.model.records import StepRecord, StepSummary, records_from


class StepReader:
    """Each rank's step batches and summaries (--profile), read as they come
    and handed to the live view (``sink``); ``keep`` summaries kept per rank.
    ``run_dir``: each batch is also added to the rank's ``steps.jsonl`` there
    as it comes, so a kernel that dies mid-run leaves the steps its ranks made
    (the launcher writes the whole file again, and the manifest, at the end);
    a write that fails stops these writes (``spool_error`` says why), never the run."""

    def __init__(self, world_size: int, keep: int, sink: RankFeed | None,
                 run_dir: str | None = None) -> None:
        n = self.world_size = world_size
        self.keep, self.sink = keep, sink
        self.run_dir = run_dir
        self.spool_error = ""
        self.step_records: list[list[StepRecord]] = [[] for _ in range(n)]
        self.summaries: list[list[StepSummary]] = [[] for _ in range(n)]
        self.dropped_summaries = [0] * n
        self._read = [[0, 0] for _ in range(n)]  # step batches, summaries read per rank

    def read(self, tl: protocol.Channel) -> None:
        """New step batches and summaries of every rank, then delete their keys.

        One ``multi_get`` for the counters, one ``check`` and one
        ``multi_get`` for the new values; deleting what was read keeps the
        store (it lives in this process) flat. A forged value is left where it
        is (counted once) until the rank's own value overwrites it, unless a
        genuine later value of the same rank shows the rank is past it; only
        keys that exist are read, so a forged count cannot block the read.
        """
        n = self.world_size
        counts = [int(bytes(v)) for v in tl.store.multi_get(
            [protocol.steps_count_key(r) for r in range(n)]
            + [protocol.summary_count_key(r) for r in range(n)])]
        groups: list[tuple[int, int, list[str]]] = []
        for r in range(n):
            for kind, count in ((0, counts[r]), (1, counts[n + r])):
                name = protocol.steps_key if kind == 0 else protocol.summary_key
                keys = [name(r, i) for i in range(self._read[r][kind], count)]
                if keys:
                    groups.append((r, kind, keys))
        if not groups:
            return
        if not tl.store.check([k for _, _, keys in groups for k in keys]):
            groups = [(r, kind, tl.existing(keys)) for r, kind, keys in groups]
        values = iter(tl.multi_get([k for _, _, keys in groups for k in keys]))
        for rank, kind, keys in groups:
            got = [next(values) for _ in keys]
            last = max((i for i, v in enumerate(got) if v is not None), default=-1)
            for i, (key, data) in enumerate(zip(keys, got, strict=True)):
                if i > last:  # forged, and the rank has not written past it yet
                    break
                tl.delete(key)
                self._read[rank][kind] += 1
                if data is not None:
                    self._take(rank, kind, data)

    def _take(self, rank: int, kind: int, data: Any) -> None:
        """One genuine step batch (``kind`` 0) or summary (1) of ``rank``."""
        if kind == 0 and isinstance(data, list):
            records, _ = records_from(data)  # typed here, once; what is not a record is left
            self.step_records[rank].extend(records)
            if self.run_dir and not self.spool_error and records:
                try:
                    append_steps(self.run_dir, rank, records)
                except OSError as exc:  # a full disk: the records stay in memory
                    self.spool_error = f"{exc.strerror or exc}"
            if self.sink is not None:
                self.sink.push_steps(rank, records)
        elif kind == 1 and isinstance(data, dict):
            kept = self.summaries[rank]
            kept.append(data)
            if len(kept) > self.keep:
                del kept[0]
                self.dropped_summaries[rank] += 1
            if self.sink is not None:
                self.sink.push_summary(rank, data)


def read_ranks(tl: protocol.Channel, world_size: int
               ) -> tuple[list[RankReport | None], list[list[Fingerprint]]]:
    """Each rank's result, decoded here once (None: none, or a forged one), and
    the fingerprints of its collectives, each with the call's duration from
    the result."""
    ranks: list[RankReport | None] = []
    fingerprints: list[list[Fingerprint]] = []
    for rank in range(world_size):
        res = tl.get(protocol.result_key(rank)) if tl.store.check(
            [protocol.result_key(rank)]) else None
        res = res if isinstance(res, dict) else None  # a forged result: no report
        timed_calls = (res or {}).pop("collectives", None)
        timed_calls = timed_calls if isinstance(timed_calls, list) else []
        ranks.append(report_from(res))
        count = published_count(tl.store, rank, len(timed_calls))
        keys = tl.existing([protocol.fingerprint_key(rank, i) for i in range(count)])
        fps = fingerprints_from(tl.multi_get(keys))
        timed = {c.get("index"): c for c in timed_calls if isinstance(c, dict)}
        for fp in fps:
            fp.call_s = timed.get(fp.index, {}).get("call_s")
        fingerprints.append(fps)
    return ranks, fingerprints


def memory_peaks(ranks: list[RankReport | None],
                 heartbeats: list[DdpHeartbeat]) -> list[MemoryReading]:
    """Each rank's peak memory: its result's, raised by any heartbeat that saw more."""
    peaks = [msgspec.structs.replace(res.peak) if res is not None else MemoryReading()
             for res in ranks]
    for h in heartbeats:
        if 0 <= h.rank < len(peaks):
            peaks[h.rank].raise_to(h.memory())
    return peaks


def published_count(store: Any, rank: int, hint: int) -> int:
    """How many fingerprints ``rank`` published (keys 0..count-1, set in order).

    Existence is monotone in the index, so a doubling then bisecting search
    over ``check`` of one key costs O(log n) round trips instead of two per
    fingerprint; ``hint`` (the rank's own record count) usually makes it 2.
    """
    def has(i: int) -> bool:
        return bool(store.check([protocol.fingerprint_key(rank, i)]))

    lo = hint if hint and has(hint - 1) else 0  # every index < lo exists
    step = 1
    while has(lo + step - 1):  # gallop: then every index < lo + step exists
        lo += step
        step *= 2
    hi = lo + step - 1  # missing
    while lo < hi:
        mid = (lo + hi) // 2
        if has(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo

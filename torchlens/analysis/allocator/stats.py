"""The allocator's counters, named and shaped like ``torch.cuda.memory_stats()``.

Each stat is kept for the aggregate and for its pool (C++ ``StatType``
AGGREGATE / SMALL_POOL / LARGE_POOL) as ``[current, peak, allocated, freed]``
lists of plain ints, updated in place: the replay loop touches several per
event, so they avoid attribute lookups and objects.
"""

from __future__ import annotations

from typing import Any

STAT_NAMES = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
POOL_NAMES = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")


def new_stat() -> list[int]:
    return [0, 0, 0, 0]


def inc(stat: list[int], amount: int) -> None:
    c = stat[0] + amount
    stat[0] = c
    if c > stat[1]:
        stat[1] = c
    stat[2] += amount


def dec(stat: list[int], amount: int) -> None:
    stat[0] -= amount
    stat[3] += amount


class Stats:
    """All counters of one device allocator.

    ``arrays[name][pool_index]`` with pool_index 0 = all, 1 = small, 2 = large.
    """

    def __init__(self) -> None:
        self.arrays: dict[str, list[list[int]]] = {
            name: [new_stat(), new_stat(), new_stat()] for name in STAT_NAMES
        }
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.oversize_allocations = new_stat()
        self.oversize_segments = new_stat()

    def add(self, name: str, is_small: bool, amount: int) -> None:
        arr = self.arrays[name]
        inc(arr[0], amount)
        inc(arr[1 if is_small else 2], amount)

    def sub(self, name: str, is_small: bool, amount: int) -> None:
        arr = self.arrays[name]
        dec(arr[0], amount)
        dec(arr[1 if is_small else 2], amount)

    def current(self, name: str, pool: str = "all") -> int:
        return self.arrays[name][POOL_NAMES.index(pool)][0]

    def peak(self, name: str, pool: str = "all") -> int:
        return self.arrays[name][POOL_NAMES.index(pool)][1]

    def reset_peaks(self) -> None:
        for arr in self.arrays.values():
            for st in arr:
                st[1] = st[0]

    def as_dict(self, max_split_size: int) -> dict[str, Any]:
        """Flat dict with torch's memory_stats() keys (``allocation.all.current`` ...)."""
        out: dict[str, Any] = {}
        for name, arr in self.arrays.items():
            for pname, st in zip(POOL_NAMES, arr, strict=False):
                for fname, val in zip(FIELDS, st, strict=False):
                    out[f"{name}.{pname}.{fname}"] = val
        for fname, val in zip(FIELDS, self.oversize_allocations, strict=False):
            out[f"oversize_allocations.{fname}"] = val
        for fname, val in zip(FIELDS, self.oversize_segments, strict=False):
            out[f"oversize_segments.{fname}"] = val
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_sync_all_streams"] = self.num_sync_all_streams
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        out["max_split_size"] = max_split_size
        return dict(sorted(out.items()))

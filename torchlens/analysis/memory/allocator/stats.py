"""The allocator's counters, named and shaped like ``torch.cuda.memory_stats()``.

Each stat is kept for the aggregate and for its pool (C++ ``StatType``
AGGREGATE / SMALL_POOL / LARGE_POOL) as ``[current, peak, allocated, freed]``
lists of plain ints, updated in place: the replay loop touches several per
event, so they avoid attribute lookups and objects.
"""

from __future__ import annotations

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

    def as_dict(self, max_split_size: int) -> dict[str, int]:
        """Flat dict with torch's memory_stats() keys (``allocation.all.current`` ...)."""
        out: dict[str, int] = {}
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


def hot_tuples(stats: Stats, pi: int) -> tuple[list[int], ...]:
    """The (all, pool) stat pairs the per-event paths update, in a fixed order.

    allocation, allocated_bytes, active, active_bytes, requested_bytes: each as
    (aggregate, pool ``pi``). Unpacked by ``count_alloc`` / ``count_free_*``,
    which are unrolled because they run for every event of a replay.
    """
    a = stats.arrays
    names = (
        "allocation",
        "allocated_bytes",
        "active",
        "active_bytes",
        "requested_bytes",
    )
    return tuple(x for n in names for x in (a[n][0], a[n][pi]))


def count_alloc(t: tuple[list[int], ...], size: int, req: int) -> None:
    """Stats of C++ alloc_found_block: +1 allocation/active, +size bytes, +req requested.

    Unrolled: it runs once per allocation of a replay.
    """
    a0, a1, b0, b1, c0, c1, d0, d1, e0, e1 = t
    v = a0[0] + 1
    a0[0] = v
    if v > a0[1]:
        a0[1] = v
    a0[2] += 1
    v = a1[0] + 1
    a1[0] = v
    if v > a1[1]:
        a1[1] = v
    a1[2] += 1
    v = b0[0] + size
    b0[0] = v
    if v > b0[1]:
        b0[1] = v
    b0[2] += size
    v = b1[0] + size
    b1[0] = v
    if v > b1[1]:
        b1[1] = v
    b1[2] += size
    v = c0[0] + 1
    c0[0] = v
    if v > c0[1]:
        c0[1] = v
    c0[2] += 1
    v = c1[0] + 1
    c1[0] = v
    if v > c1[1]:
        c1[1] = v
    c1[2] += 1
    v = d0[0] + size
    d0[0] = v
    if v > d0[1]:
        d0[1] = v
    d0[2] += size
    v = d1[0] + size
    d1[0] = v
    if v > d1[1]:
        d1[1] = v
    d1[2] += size
    v = e0[0] + req
    e0[0] = v
    if v > e0[1]:
        e0[1] = v
    e0[2] += req
    v = e1[0] + req
    e1[0] = v
    if v > e1[1]:
        e1[1] = v
    e1[2] += req


def count_free_requested(t: tuple[list[int], ...], size: int) -> None:
    """Stats of C++ free: -1 allocation, -size allocated bytes."""
    a0, a1, b0, b1 = t[:4]
    a0[0] -= 1
    a0[3] += 1
    a1[0] -= 1
    a1[3] += 1
    b0[0] -= size
    b0[3] += size
    b1[0] -= size
    b1[3] += size


def count_free_completed(t: tuple[list[int], ...], size: int, req: int) -> None:
    """Stats of C++ free_block: -1 active, -size active bytes, -req requested."""
    c0, c1, d0, d1, e0, e1 = t[4:]
    c0[0] -= 1
    c0[3] += 1
    c1[0] -= 1
    c1[3] += 1
    d0[0] -= size
    d0[3] += size
    d1[0] -= size
    d1[3] += size
    e0[0] -= req
    e0[3] += req
    e1[0] -= req
    e1[3] += req

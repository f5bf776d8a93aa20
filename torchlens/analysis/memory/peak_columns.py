"""The peak of a loaded snapshot by category and by site, from its columns.

``peak.analyze_peak`` over the timeline of ``timeline.build_timeline``, computed on
``formats.snapshot_columns`` (one array per field, one list per distinct stack)
instead of a dict per trace entry: the replay's pairing in one pass (``sr_pair``
or its Python twin), the levels as a cumulative sum, each distinct stack's
category and site judged once, blocks grouped by (stack, category) before the
rows are made. Every rule is the dict path's (allocated falls at
``free_requested``, block rounding, the start level from the segments less the
trace's change, the lifetime split of optimizer and backward runs, blocks from
before the window, the rows' order and ties); ``tests/memory/test_peak_columns``
holds the two equal on every shared snapshot.

What it makes is the peak and its category and site rows (what ``result.peak()``
and ``result.categories()`` show); the rest of the report (stages, the stacked
timeline, missing lines) is the dict path's. None: a case it leaves to that path.
"""

from __future__ import annotations

import re

import numpy as np

from torchlens.analysis.frames import site_of
from torchlens.analysis.memory import categories as cat
from torchlens.analysis.memory.allocator import AllocatorConfig
from torchlens.analysis.memory.allocator.config import round_size
from torchlens.analysis.memory.peak import (
    BEFORE_NO_STACK,
    IN_WINDOW,
    SEGMENTS_ONLY,
    UNATTRIBUTED,
    GroupRow,
    PeakAnalysis,
    PeakBlock,
    no_history,
)
from torchlens.formats.locations import CellNames
from torchlens.formats.snapshot_columns import SnapshotColumns, native, python_reader

#: the sign of each pairing kind's change to allocated (``python_reader.pair``'s kinds)
_SIGN = np.array([0, 1, -1, -1, 0, 0, 0], np.int64)


def _device(cols: SnapshotColumns, device: int) -> int:
    """``history.device_view``'s choice for a file: the asked device when it has data,
    else the first that has."""
    counts = np.bincount(cols.e_device, minlength=cols.n_devices) if len(cols.e_device) \
        else np.zeros(cols.n_devices, np.int64)
    with_trace = [d for d in range(cols.n_devices) if counts[d]]
    with_segs = sorted(set(cols.s_device.tolist()))
    if device in with_trace or device in with_segs or not set(with_trace + with_segs) - {device}:
        return device
    return (with_trace or with_segs)[0]


def _rounded(size: np.ndarray, cfg: AllocatorConfig) -> np.ndarray:
    """``analyze._block_size`` of every size, each distinct size rounded once."""
    if not len(size):
        return size.astype(np.int64)
    uniq, inv = np.unique(size, return_inverse=True)
    return np.array([round_size(int(u), cfg) if u > 0 else 0 for u in uniq.tolist()],
                    np.int64)[inv]


class _Stacks:
    """Each distinct stack's category, site and function, judged once."""

    def __init__(self, cols: SnapshotColumns,
                 custom: list[tuple[str, re.Pattern[str]]] | None, cells: CellNames | None):
        self.custom, self.cells, self.cols = custom, cells, cols
        self.stack = cols.stack
        # each distinct frame's (file, function) read once for all stacks
        self._keys = [cat.frame_key(f) for f in cols.frames]
        self._cat: dict[int, str] = {}
        self._site: dict[int, tuple[str, str]] = {}

    def category(self, k: int) -> str:
        c = self._cat.get(k)
        if c is None:
            c = self._cat[k] = cat.categorize_key(
                tuple(map(self._keys.__getitem__, self.cols.stack_items[k])), self.custom)
        return c

    def before(self, k: int) -> str:
        """``peak._before``: a block from before the window with no stack says so."""
        return self.category(k) if self.cols.stack_items[k] else BEFORE_NO_STACK

    def site(self, k: int) -> tuple[str, str]:
        s = self._site.get(k)
        if s is None:
            s = self._site[k] = site_of(self.stack(k), self.cells)
        return s


def _lifetime(codes: np.ndarray, entries: np.ndarray, frees: np.ndarray,
              split: dict[int, tuple[int, int]]) -> np.ndarray:
    """``categories.by_lifetime`` over every allocation: a run is consecutive allocations
    of one optimizer or backward category; what it frees before the next allocation of
    another category is its temporary, what it keeps its state. ``split``: category code
    -> (kept code, temporary code). Returns each allocation's code after the split."""
    out = codes.copy()
    n = len(codes)
    if not n or not split:
        return out
    new_run = np.ones(n, bool)
    new_run[1:] = codes[1:] != codes[:-1]
    starts = np.flatnonzero(new_run)
    run_of = np.cumsum(new_run) - 1
    nxt = np.append(starts[1:], n)[run_of]  # the allocation after each one's run
    end = np.where(nxt < n, entries[np.minimum(nxt, n - 1)], np.iinfo(np.int64).max)
    temp = (frees >= 0) & (frees < end)
    for code, (kept, tmp) in split.items():
        m = codes == code
        out[m] = np.where(temp[m], tmp, kept)
    return out


def peak_from_columns(cols: SnapshotColumns, *, device: int = 0, alloc_conf: str = "",
                      custom: list[tuple[str, re.Pattern[str]]] | None = None,
                      cells: CellNames | None = None) -> PeakAnalysis | None:
    """The peak of a loaded snapshot with its category and site rows, as
    ``analyze.peak_part`` makes them for a file (``measured_on="snapshot"``)."""
    chosen = _device(cols, device)
    cfg = (AllocatorConfig.parse(alloc_conf) if alloc_conf
           else AllocatorConfig.from_settings(cols.allocator_settings))
    act, addr, size = cols.e_action, cols.e_addr, cols.e_size
    times, stack = cols.e_time, cols.e_stack
    mine = cols.e_device == chosen
    if not mine.all():  # else the columns as they are (no copies)
        act, addr, size, times, stack = (x[mine] for x in (act, addr, size, times, stack))
    blocks = np.flatnonzero(np.repeat(cols.s_device == chosen, cols.s_count))
    b_alive = blocks[cols.b_state[blocks] == 0]
    final_alloc = int(cols.b_size[b_alive].sum())
    n = len(act)
    if not n:
        return no_history(max(final_alloc, 0), SEGMENTS_ONLY)
    nz = times[times != 0]
    t0 = int(nz[0]) if len(nz) else 0
    if n > 1 and (not t0 or int(times.max()) == int(nz.min())):
        times, t0 = np.arange(n, dtype=np.int64), 0
    kind, partner, touched = (native.pair(act, addr, cols.b_addr[b_alive])
                              or python_reader.pair(act, addr, cols.b_addr[b_alive]))
    # the bytes each alloc and each free of a block from before the window counts
    rounded = np.zeros(n, np.int64)
    counted = np.flatnonzero((kind == 1) | (kind == 3))
    rounded[counted] = _rounded(size[counted], cfg)
    if int(rounded.max(initial=0)) >= (1 << 62) // n:
        return None  # levels past int64: the dict path's Python ints
    points = np.flatnonzero(kind > 0)
    k = kind[points]
    # an alloc adds its bytes, a free takes its alloc's (or, from before, its own)
    whose = np.where(k == 2, partner[points], points)
    d_alloc = _SIGN[k] * rounded[whose]
    unknown = points[k == 3]
    unknown_freed = int(rounded[unknown].sum())
    start = final_alloc - int(d_alloc.sum())
    if start < unknown_freed:
        start = unknown_freed  # segments and history disagree (the dict path's note)
    allocated = np.cumsum(d_alloc) + start
    peak = max(start, int(allocated.max(initial=0)), 0)
    hits = np.flatnonzero(allocated == peak)
    j = int(hits[0]) if len(hits) else None
    entry = int(points[j]) if j is not None else -1
    x = (int(times[entry]) or t0) - t0 if j is not None else 0

    st = _Stacks(cols, custom, cells)
    users = {name for name, _rx in custom or ()}
    allocs = np.flatnonzero(kind == 1)
    frees = np.full(n, -1, np.int64)
    freeing = np.flatnonzero(kind == 2)
    frees[partner[freeing]] = freeing
    a_free = frees[allocs]
    names: list[str] = []
    code_of: dict[str, int] = {}

    def code(name: str) -> int:
        c = code_of.get(name)
        if c is None:
            c = code_of[name] = len(names)
            names.append(name)
        return c

    lut = np.full(len(cols.stack_items), -1, np.int64)  # stack -> its category's code
    used = np.unique(stack[allocs])
    lut[used] = [code(st.category(s)) for s in used.tolist()]
    raw = lut[stack[allocs]]
    split = {code(c): (code(kept), code(temp)) for c, (kept, temp) in cat.LIFETIME.items()
             if c in code_of}
    final = _lifetime(raw, allocs, a_free, split)
    alive = (allocs <= entry) & ((a_free < 0) | (a_free > entry))
    # the blocks alive at the peak, in analyze_peak's order: (stack, category code,
    # from your regexes, size, its alloc's entry or -1, origin)
    in_win = np.flatnonzero(alive)
    b_stack = [stack[allocs[in_win]]]
    b_cat = [final[in_win]]
    b_user = [np.array([names[c] in users for c in raw[in_win].tolist()], bool)]
    b_size = [rounded[allocs[in_win]]]
    later = unknown[unknown > entry]
    if len(later):
        cats = [code(st.before(s)) for s in stack[later].tolist()]
        b_stack.append(stack[later])
        b_cat.append(np.array(cats, np.int64))
        b_user.append(np.array([names[c] in users for c in cats], bool))
        b_size.append(rounded[later])
    kept = b_alive[~touched]
    room = peak - sum(int(s.sum()) for s in b_size)
    if len(kept) and int(cols.b_size[kept].sum()) <= max(room, 0):
        cats = [code(st.before(s)) for s in cols.b_stack[kept].tolist()]
        b_stack.append(cols.b_stack[kept])
        b_cat.append(np.array(cats, np.int64))
        b_user.append(np.array([names[c] in users for c in cats], bool))
        b_size.append(cols.b_size[kept])
    sizes = np.concatenate(b_size).astype(np.int64)
    over = int(sizes.sum()) - peak
    unattributed = max(0, -over)
    units = _units(np.concatenate(b_stack).astype(np.int64),
                   np.concatenate(b_cat).astype(np.int64), np.concatenate(b_user), sizes)
    trigger = None
    if j is not None and kind[entry] == 1:
        s = int(stack[entry])
        c = names[int(final[np.searchsorted(allocs, entry)])]
        site, fn = st.site(s)
        trigger = PeakBlock(int(rounded[entry]), c, site, fn, cols.stack(s), IN_WINDOW, entry,
                            source=cat.FROM_USER if st.category(s) in users else cat.FROM_RULES)
    rules = [(name, rx.pattern) for name, rx in custom or ()]
    rules += [(c, why) for c, _t, why in cat.RULES]
    return PeakAnalysis(peak, entry if j is not None else None, x, trigger, [], unattributed,
                        _group(units, names, st, peak, unattributed, by_site=False),
                        _group(units, names, st, peak, unattributed, by_site=True),
                        rules=rules)


def _units(stack: np.ndarray, code: np.ndarray, user: np.ndarray,
           size: np.ndarray) -> list[tuple[int, int, bool, int, int, int, int, int]]:
    """Blocks alike in stack, category and source, as one unit each: (stack, category,
    from your regexes, bytes, blocks, the largest, where the first of the largest is,
    where the first is) in block order; a few hundred units for thousands of blocks."""
    if not len(size):
        return []
    sig = (stack * (1 << 20) + code) * 2 + user
    _u, inv = np.unique(sig, return_inverse=True)
    pos = np.arange(len(size))
    order = np.lexsort((pos, -size, inv))  # per unit: largest first, then earliest
    g = inv[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    s_sorted = size[order]
    total = np.add.reduceat(s_sorted, starts)
    count = np.diff(np.r_[starts, len(order)])
    first_big = order[starts]
    first = np.full(len(starts), len(size), np.int64)
    np.minimum.at(first, inv, pos)
    return [(int(stack[p]), int(code[p]), bool(user[p]), int(t), int(c), int(size[p]), int(p),
             int(f)) for p, t, c, f in zip(first_big.tolist(), total.tolist(), count.tolist(),
                                           first.tolist(), strict=True)]


def _group(units: list[tuple[int, int, bool, int, int, int, int, int]], names: list[str],
           st: _Stacks, peak: int, extra: int, *, by_site: bool) -> list[GroupRow]:
    """``peak._group`` over units: the same rows (bytes, blocks, the largest block's
    stack and function, the categories largest first, ties in block order)."""
    rows: dict[str, GroupRow] = {}
    biggest: dict[str, tuple[int, int]] = {}
    cats: dict[str, dict[str, list[int]]] = {}
    sources: dict[str, set[str]] = {}
    for s, c, user, total, count, big, big_at, first in sorted(units, key=lambda u: u[7]):
        name = names[c]
        site, fn = st.site(s)
        k = site if by_site else name
        r = rows.get(k)
        if r is None:
            r = rows[k] = GroupRow(k, 0, 0, 0.0, fn)
        r.bytes += total
        r.count += count
        best = biggest.get(k)
        if best is None or big > best[0] or big == best[0] and big_at < best[1]:
            biggest[k] = (big, big_at)
            r.frames, r.function = st.stack(s), fn
        got = cats.setdefault(k, {}).setdefault(name, [0, first])
        got[0] += total
        got[1] = min(got[1], first)
        sources.setdefault(k, set()).add(cat.FROM_USER if user else cat.FROM_RULES)
    if extra:
        rows[UNATTRIBUTED] = GroupRow(UNATTRIBUTED, extra, 0, 0.0)
    for k, r in rows.items():
        r.share = r.bytes / peak if peak else 0.0
        r.categories = ", ".join(n for n, _v in sorted(cats.get(k, {}).items(),
                                                        key=lambda x: (-x[1][0], x[1][1])))
        r.source = cat.source_label(sources[k]) if k in sources else ""
    return sorted(rows.values(), key=lambda r: (-r.bytes, r.name))

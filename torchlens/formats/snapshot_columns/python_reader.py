"""The columns of a snapshot the Python loader normalized (``model.snapshot``): the
same ``SnapshotColumns`` the compiled reader gives, and the replay's pairing as a
loop; where the reader is not built, and as the reference tests hold it to."""

from __future__ import annotations

from typing import Any

import numpy as np

from torchlens.formats.snapshot_columns.columns import ACTIONS, STATES, SnapshotColumns
from torchlens.model.snapshot import Frame, Snapshot

_ACTION = {a: k for k, a in enumerate(ACTIONS)}
_STATE = {s: k for k, s in enumerate(STATES)}


def from_snapshot(snap: Snapshot) -> SnapshotColumns:
    """``snap`` (``load_snapshot``'s) as columns; stacks numbered as the compiled reader
    numbers them: by first appearance, segments (each one's own, then its blocks')
    before the traces, one per distinct sequence of frames."""
    stacks: list[list[Frame]] = []
    ids: dict[tuple[int, ...], int] = {}
    frames_seen: dict[int, int] = {}
    distinct: list[Frame] = []
    items: list[list[int]] = []

    def stack(frames: list[Frame]) -> int:
        key = tuple(map(id, frames))
        k = ids.get(key)
        if k is None:
            k = ids[key] = len(stacks)
            stacks.append(frames)
            for f in frames:
                if id(f) not in frames_seen:
                    frames_seen[id(f)] = len(distinct)
                    distinct.append(f)
            items.append([frames_seen[id(f)] for f in frames])
        return k

    seg_rows, block_rows = [], []
    for s in snap.segments:
        seg_rows.append((s.address, s.total_size, s.device, len(block_rows),
                         len(s.blocks), stack(s.frames)))
        block_rows += [(b.address, b.size, _STATE[b.state], stack(b.frames))
                       for b in s.blocks]
    entries = [(d, _ACTION.get(e.action, -1), e.addr, e.size,
                int(e.time_us or 0), stack(e.frames))
               for d, t in enumerate(snap.device_traces) for e in t]

    def col(rows: list[tuple], k: int, dtype: Any) -> np.ndarray:
        return np.array([r[k] for r in rows], dtype=dtype)

    return SnapshotColumns(
        col(entries, 0, np.int32), col(entries, 1, np.int8), col(entries, 2, np.uint64),
        col(entries, 3, np.int64), col(entries, 4, np.int64), col(entries, 5, np.int32),
        col(seg_rows, 0, np.uint64), col(seg_rows, 1, np.int64), col(seg_rows, 2, np.int32),
        col(seg_rows, 3, np.int32), col(seg_rows, 4, np.int32), col(seg_rows, 5, np.int32),
        col(block_rows, 0, np.uint64), col(block_rows, 1, np.int64),
        col(block_rows, 2, np.int8), col(block_rows, 3, np.int32),
        n_devices=len(snap.device_traces), frames=distinct, stack_items=items,
        allocator_settings=dict(snap.allocator_settings),
        external_annotations=list(snap.external_annotations))


def pair(action: np.ndarray, addr: np.ndarray,
         blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per entry what it does to the allocated level (``read.c``'s ``sr_pair`` kinds:
    0 nothing, 1 alloc, 2 free of an alloc in the trace, 3 free of a block from before
    it, 4 free_completed after its free_requested, 5/6 segment added/removed) and for
    a kind-2 free its alloc's entry: ``timeline.build_timeline``'s walk; and whether an
    alloc or free names each address of ``blocks`` (``peak._kept_blocks``' test)."""
    n = len(action)
    kind, partner = np.zeros(n, np.int8), np.full(n, -1, np.int32)
    live: dict[int, int] = {}
    pending: set[int] = set()
    for i, (a, ad) in enumerate(zip(action.tolist(), addr.tolist(), strict=True)):
        if a in (3, 5):
            kind[i] = 5
        elif a in (4, 6):
            kind[i] = 6
        elif a == 0:
            live[ad], kind[i] = i, 1
        elif a in (2, 10) and ad in pending:
            pending.discard(ad)
            kind[i] = 4
        elif a in (1, 2, 10):
            if a == 1:
                pending.add(ad)
            j = live.pop(ad, -1)
            kind[i], partner[i] = (2, j) if j >= 0 else (3, -1)
    named = set(addr[np.isin(action, (0, 1, 2, 10))].tolist())
    return kind, partner, np.array([b in named for b in blocks.tolist()], bool)

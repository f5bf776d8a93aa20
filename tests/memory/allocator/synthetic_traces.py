"""Synthetic allocator traces shaped like training loops (for tests and benchmarks).

A test helper, not shipped in the package: ``benchmarks/bench_allocator.py``
imports it by putting this folder on ``sys.path``.

Real snapshots hold a few thousand to tens of thousands of entries; the replay
must handle a million. This generator produces a deterministic trace of
``alloc`` / ``free_requested`` / ``free_completed`` entries in torch's format:
weights that live for the whole run, then steps whose forward allocates
activations of mixed sizes (small temporaries, mid-size and large tensors)
that the backward frees in reverse order while allocating gradients.
Allocation ids stand in for addresses (a "simulate" replay invents real ones).
"""

from __future__ import annotations

import random

from torchlens.model.snapshot import TraceEntry

MB = 1024 * 1024


def _size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.55:
        return rng.randrange(4, 1 * MB, 4)  # small pool
    if r < 0.85:
        return rng.randrange(1 * MB, 10 * MB, 256)  # 20 MiB buffers
    return rng.randrange(10 * MB, 160 * MB, 4096)  # own segments


def training_trace(
    n_events: int, seed: int = 0, n_weights: int = 200
) -> list[TraceEntry]:
    """About ``n_events`` trace entries (exactly that many, cut at the end)."""
    rng = random.Random(seed)
    events: list[TraceEntry] = []
    next_id = 1 << 20

    def alloc(size: int) -> int:
        nonlocal next_id
        next_id += 512
        events.append(TraceEntry("alloc", next_id, size))
        return next_id

    def free(addr: int, size: int) -> None:
        events.append(TraceEntry("free_requested", addr, size))
        events.append(TraceEntry("free_completed", addr, size))

    for _ in range(n_weights):
        alloc(_size(rng))
    shapes = [_size(rng) for _ in range(300)]
    while len(events) < n_events:
        acts = []
        for s in shapes:
            if rng.random() < 0.1:
                s = _size(rng)  # shapes drift a little between steps
            acts.append((alloc(s), s))
            if rng.random() < 0.3:  # a temporary freed right away
                t = _size(rng) // 8 + 1
                free(alloc(t), t)
        grads = []
        for addr, s in reversed(acts):
            if rng.random() < 0.2:
                g = max(1, s // 2)
                grads.append((alloc(g), g))
            free(addr, s)
        for addr, g in grads:
            free(addr, g)
    return events[:n_events]

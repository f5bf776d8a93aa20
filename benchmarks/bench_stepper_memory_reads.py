"""Per-step cost of the rank stepper's CUDA memory reads, old and new, side by side.

Old: ``torch.cuda.memory_stats(device)`` (the allocator's nested dict,
flattened and sorted in Python), and ``memory_allocated`` + ``memory_reserved``
(each of which calls ``memory_stats``). New: ``cuda_device.counters``, one
``memory_stats_as_nested_dict(device)`` call, the three figures picked out.
Medians of repeated timeit runs on one GPU, after filling the allocator with
a few hundred blocks so its statistics are not trivial.

    .venv/bin/python benchmarks/bench_stepper_memory_reads.py

Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import statistics
import sys
import timeit
from collections.abc import Callable

import torch

from torchlens.capture.ranks import cuda_device
from torchlens.capture.ranks.stepper import memory_now


def _median_us(fn: Callable[[], object], number: int = 2000, repeat: int = 7) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> int:
    if not torch.cuda.is_available():
        print("bench_stepper_memory_reads: CUDA is absent here; nothing to time (run it on a GPU)")
        return 0
    device = torch.device("cuda", torch.cuda.current_device())
    keep = [torch.empty(n * 4096, device=device) for n in range(1, 300)]  # noqa: F841
    keys = ("allocated_bytes.all.current", "reserved_bytes.all.current",
            "inactive_split_bytes.all.current")

    def old_stats() -> object:
        st = torch.cuda.memory_stats(device)
        return [st.get(k) for k in keys]

    def old_pair() -> object:
        return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)

    new = cuda_device.counters(device)
    assert new is not None and [new["allocated"], new["reserved"], new["inactive_split"]] == \
        old_stats(), "the new read must give the old figures"
    rows = [
        ("old: memory_stats(device), 3 keys", _median_us(old_stats)),
        ("old: memory_allocated + memory_reserved", _median_us(old_pair)),
        ("new: memory_stats_as_nested_dict(device)", _median_us(lambda: cuda_device.counters(device))),
        ("new: the step's whole memory record (+RSS)", _median_us(lambda: memory_now(device))),
    ]
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}: per-step read, median")
    for name, us in rows:
        print(f"  {name:<46} {us:8.1f} µs")
    print(f"  saved per step: {rows[0][1] - rows[2][1]:.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A rank's CUDA boundary: which GPU its script uses, that GPU's allocator
counters, its largest free block and its UUID.

Every read names the device. torch.cuda's functions default to the calling
thread's current device, and that is per thread in the CUDA runtime
(``cudaGetDevice``): a thread the rank starts (the heartbeat, the summariser)
is on device 0 whatever ``set_device`` the training thread made, so a read
without a device on rank 1 reads GPU 0.

Nothing here initialises CUDA in a process that has not: each read first
asks ``torch.cuda.is_initialized()``. A rank whose job runs on the CPU on a
GPU host must not gain a CUDA context (hundreds of MB on GPU 0) because it
was profiled.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

CPU = torch.device("cpu")


def cuda_in_use() -> bool:
    """True once this process initialised CUDA (the script did, or torch for it)."""
    return bool(torch.cuda.is_initialized())


def script_device() -> torch.device:
    """The GPU this rank's script computes on; the CPU when it never touched CUDA.

    The training thread's current device (``set_device``, what torchrun
    scripts call), unless that device holds no allocation while another does:
    a script that only moves its model with ``.to(f"cuda:{local_rank}")``
    leaves the current device at 0. With per-rank ``CUDA_VISIBLE_DEVICES``
    every rank sees one GPU, ``cuda:0``, and that is the one it uses.
    """
    if not cuda_in_use():
        return CPU
    current = int(torch.cuda.current_device())
    held = {d: allocated(d) or 0 for d in range(int(torch.cuda.device_count()))}
    if not held.get(current) and any(held.values()):
        current = max(held, key=lambda d: held[d])
    return torch.device("cuda", current)


def counters(device: torch.device) -> dict[str, int | None] | None:
    """Allocated, reserved and inactive-split bytes of ``device``'s caching allocator.

    One ``memory_stats_as_nested_dict`` call: ``memory_stats`` flattens and
    sorts the same dict in Python, and ``memory_allocated`` /
    ``memory_reserved`` each call ``memory_stats`` (torch/cuda/memory.py).
    On an H200, torch 2.11: 12 us, against 135 us for ``memory_stats`` and
    260 us for the pair (benchmarks/bench_stepper_memory_reads.py).
    None when CUDA is not initialised (nothing was allocated there).
    """
    if device.type != "cuda" or not cuda_in_use():
        return None
    st = torch.cuda.memory_stats_as_nested_dict(device)
    if not st:
        return None
    # .get: another backend (cudaMallocAsync, a pluggable allocator) may leave some out
    return {name: (st.get(f"{name}_bytes") or {}).get("all", {}).get("current")
            for name in ("allocated", "reserved", "inactive_split")}


def allocated(device: torch.device | int) -> int | None:
    """Bytes allocated on ``device`` (None: CUDA not initialised)."""
    dev = device if isinstance(device, torch.device) else torch.device("cuda", device)
    got = counters(dev)
    return None if got is None else got["allocated"]


def _segments() -> list[dict[str, Any]]:
    """The allocator's segments, without its trace entries where torch can leave them out.

    ``memory_snapshot(include_traces=True)``, the default, symbolises every
    entry of the memory history when the user records one (H200, torch 2.11,
    20,000 recorded entries: 6.3 s, against 0.6 ms without); the segments are
    all the largest free block needs. Older torch has no ``include_traces``.
    """
    fn = torch.cuda.memory_snapshot
    try:
        takes = "include_traces" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    return fn(include_traces=False) if takes else fn()


def largest_free(device: torch.device) -> int | None:
    """Largest inactive block on ``device``; None where it cannot be measured.

    The snapshot holds every device's segments, each with its ``device``:
    only this rank's count. None when CUDA is not in use or the allocator
    cannot snapshot (``backend:cudaMallocAsync`` tracks no blocks).
    """
    if device.type != "cuda" or not cuda_in_use():
        return None
    index = device.index if device.index is not None else int(torch.cuda.current_device())
    try:
        segments = _segments()
    except Exception:  # noqa: BLE001 - an allocator that cannot snapshot: not measured
        return None
    sizes = [b["size"] for s in segments if s.get("device") == index
             for b in s.get("blocks", []) if b.get("state") == "inactive"]
    return max(sizes, default=0)


def device_uuid(device: torch.device) -> str | None:
    """The GPU's UUID (what tells two GPUs apart when every rank's is ``cuda:0``).

    None on the CPU, before CUDA is initialised, or where this torch's device
    properties have no ``uuid``.
    """
    if device.type != "cuda" or not cuda_in_use():
        return None
    try:
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    except (RuntimeError, AssertionError):
        return None
    return None if uuid is None else str(uuid)


def allocator_backend() -> str | None:
    """``native`` or ``cudaMallocAsync`` (PYTORCH_CUDA_ALLOC_CONF); None if unknown."""
    fn = getattr(torch.cuda, "get_allocator_backend", None)
    if fn is None or not cuda_in_use():
        return None
    try:
        return str(fn())
    except RuntimeError:
        return None


# -- CUDA events at phase boundaries (``phases.GpuPhaseTimer``) --------------------
def timing_event() -> Any:
    """A CUDA event that measures time. Created lazily by CUDA at its first
    ``record`` (torch/cuda/streams.py), so making one starts nothing."""
    return torch.cuda.Event(enable_timing=True)


def record(event: Any, device: torch.device) -> bool:
    """Record ``event`` on ``device``'s current stream; False (nothing recorded)
    while that stream is being captured into a CUDA graph, where an event
    record becomes a graph node and times nothing of this step.

    The stream is named by device: ``Event.record()`` alone takes the calling
    thread's current device, which is 0 in a script that only moved its model
    with ``.to(f"cuda:{local_rank}")``."""
    if torch.cuda.is_current_stream_capturing():
        return False
    event.record(torch.cuda.current_stream(device))
    return True


def completed(event: Any) -> bool:
    """Whether the GPU has done all work before ``event`` (``cudaEventQuery``;
    never waits)."""
    return bool(event.query())


def elapsed_s(start: Any, end: Any) -> float:
    """Seconds between two completed events (``Event.elapsed_time`` raises for
    an event not yet completed: callers ask ``completed`` first)."""
    return float(start.elapsed_time(end)) / 1e3

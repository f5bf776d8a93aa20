"""Allocator model (issue 3): replay speed, snapshot analysis vs torch, fidelity.

1. Replay speed: events per second replaying the largest shared snapshot's
   trace ("follow", from the rebuilt start state) and a synthetic 1M-event
   training trace ("simulate"; target: under 10 s). Wall and CPU time, best
   of ``--repeat`` runs in this process (the machine is shared: CPU time is
   the steadier figure).
2. Snapshot analysis: load + fragmentation summary of each shared snapshot in
   a fresh ``python`` process vs ``python -m torch.cuda._memory_viz stats FILE``
   on the same file (both sides pay interpreter start and imports; torch's
   side imports torch). Target: at least as fast. The in-process time of
   ``load_snapshot`` + ``summarize`` is shown too.
3. Fidelity: the replay table for every shared snapshot with a trace.

Run: ``python benchmarks/bench_allocator.py [--repeat 3] [--events 1000000]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import paths

from torchlens.analysis.memory.allocator import (
    AllocatorConfig,
    rebuild_initial_state,
    replay,
)
from torchlens.analysis.memory.allocator.fidelity import check_fidelity
from torchlens.analysis.memory.fragmentation import summarize
from torchlens.model.snapshot import load_snapshot

# the synthetic 1M-event trace generator is a test helper, not part of the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "memory" / "allocator"))
from synthetic_traces import training_trace  # noqa: E402

SNAPSHOTS = paths.snapshots()

_CHILD = (
    "import sys; from torchlens.model.snapshot import load_snapshot; "
    "from torchlens.analysis.memory.fragmentation import summarize; "
    "s = summarize(load_snapshot(sys.argv[1])); print(s.reserved, s.free_cached)"
)


def _timed(fn, repeat: int) -> tuple[float, float, object]:
    """Best wall and best CPU seconds of ``repeat`` calls, and the last result."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus), out


def _subprocess_best(cmd: list[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(
            cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        best = min(best, time.perf_counter() - t)
    return best


def replay_speed(repeat: int, n_events: int) -> list[str]:
    files = sorted(SNAPSHOTS.glob("*.pickle"), key=lambda p: p.stat().st_size)
    largest = files[-1]
    snap = load_snapshot(largest)
    trace = snap.device_traces[0]
    cfg = AllocatorConfig.from_settings(snap.allocator_settings)
    init = rebuild_initial_state(snap, trace, cfg)
    wall, cpu, _ = _timed(
        lambda: replay(trace, cfg, mode="follow", initial_segments=init.segments),
        repeat,
    )
    rows = [
        "| trace | events | wall s | CPU s | events/s (wall) |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| {largest.name} (follow, rebuilt start) | {len(trace):,} | {wall:.3f} | {cpu:.3f} "
        f"| {len(trace) / wall:,.0f} |",
    ]
    synth = training_trace(n_events)
    for record in (True, False):
        wall, cpu, res = _timed(
            lambda r=record: replay(synth, mode="simulate", record_history=r), repeat
        )
        label = "synthetic training loop (simulate" + (
            ", trace recorded)" if record else ", no trace)"
        )
        rows.append(
            f"| {label} | {res.n_events:,} | {wall:.2f} | {cpu:.2f} | {res.n_events / wall:,.0f} |"
        )
    return rows


def analysis_vs_torch(repeat: int) -> list[str]:
    rows = [
        "| snapshot | size | torchlens load+summary (in process) | torchlens (fresh process) "
        "| `_memory_viz stats` (fresh process) | speed-up |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for path in sorted(SNAPSHOTS.glob("*.pickle")):
        inproc, _, _ = _timed(lambda p=path: summarize(load_snapshot(p)), repeat)
        ours = _subprocess_best([sys.executable, "-c", _CHILD, str(path)], repeat)
        torch_side = _subprocess_best(
            [sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)], repeat
        )
        rows.append(
            f"| {path.name} | {path.stat().st_size / 1e6:.2f} MB | {inproc * 1000:.0f} ms "
            f"| {ours:.2f} s | {torch_side:.2f} s | {torch_side / ours:.1f}x |"
        )
    return rows


def fidelity_table() -> list[str]:
    rows = [
        "| snapshot | events | allocs at real address | segment_alloc sequence "
        "| reserved real / model | allocated real / model | inactive_split real / model "
        "| layout | start |",
        "| --- | ---: | ---: | --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(SNAPSHOTS.glob("*.pickle")):
        r = check_fidelity(load_snapshot(path), path.stem)
        if r is None:
            rows.append(f"| {path.name} | no trace | | | | | | | |")
            continue
        seq = (
            f"equal ({r.segment_allocs_model})"
            if r.segment_sequence_equal
            else (
                f"differs ({r.segment_allocs_real} real, {r.segment_allocs_model} model)"
            )
        )
        start = "empty" if r.from_empty else "mid-run, rebuilt"
        rows.append(
            f"| {path.name} | {r.n_events:,} | {r.allocs_matched:,}/{r.allocs_total:,} "
            f"({100 * r.address_match:.1f}%) | {seq} "
            f"| {r.reserved_real:,} / {r.reserved_model:,} "
            f"| {r.allocated_real:,} / {r.allocated_model:,} "
            f"| {r.inactive_split_real:,} / {r.inactive_split_model:,} "
            f"| {'equal' if r.layout_equal else 'differs'} | {start} |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    for title, rows in (
        ("Replay speed", replay_speed(args.repeat, args.events)),
        (
            "Load + fragmentation summary vs torch.cuda._memory_viz stats",
            analysis_vs_torch(args.repeat),
        ),
        ("Fidelity", fidelity_table()),
    ):
        print(f"\n### {title}\n")
        print("\n".join(rows))


if __name__ == "__main__":
    main()

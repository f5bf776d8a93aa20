"""Replaying the shared real snapshots' traces reproduces what the real allocator did."""

from __future__ import annotations

import pickle
from pathlib import Path

import msgspec
import pytest
from allocator_fixtures import SNAPSHOT_PARAMS, SNAPSHOTS, load_cached
from synthetic_traces import training_trace

from torchlens.analysis.memory.allocator import (
    AllocatorConfig,
    rebuild_initial_state,
    replay,
)
from torchlens.analysis.memory.allocator.fidelity import check_fidelity, segment_bytes
from torchlens.model.snapshot import load_snapshot

# name: (events, allocations, segment_allocs, reserved, allocated, inactive_split)
EXPECTED = {
    "ctx128_forward": (4657, 2058, 289, 19667091456, 19498420224, 168671232),
    "ctx128_forward_mixed": (5992, 2703, 461, 24245174272, 24018738176, 226436096),
    "ctx128_fullstep": (19342, 6771, 783, 61111009280, 54873829888, 174312960),
    "eor_nn_with_snapshot_actions": (5803, 1935, 7, 134217728, 48760832, 37222400),
    "ftcourse_older_format": (10307, 3505, 152, 6471811072, 2297283072, 1616002560),
}
NO_TRACE = {"expandable_segments_no_trace", "segments_only"}


def test_every_shared_snapshot_is_classified() -> None:
    names = {p.stem for p in SNAPSHOTS.glob("*.pickle")}
    assert names == set(EXPECTED) | NO_TRACE, (
        "a new shared snapshot needs a fidelity row"
    )


@pytest.mark.parametrize("path", SNAPSHOT_PARAMS)
def test_replay_matches_reality(path: Path) -> None:
    snap = load_cached(path)
    report = check_fidelity(snap, path.stem)
    if path.stem in NO_TRACE:
        assert report is None
        return
    assert report is not None
    n_events, n_allocs, n_segs, reserved, allocated, split = EXPECTED[path.stem]
    assert report.n_events == n_events
    # every allocation at the address the real allocator chose
    assert (report.allocs_matched, report.allocs_total) == (n_allocs, n_allocs)
    assert report.segment_sequence_equal and report.segment_allocs_model == n_segs
    # final bytes: the model equals the snapshot, and the snapshot's own fields agree
    assert (
        report.reserved_model,
        report.allocated_model,
        report.inactive_split_model,
    ) == (reserved, allocated, split)
    assert report.final_bytes_equal
    assert sum(s.total_size for s in snap.segments) == reserved
    assert sum(s.allocated_size for s in snap.segments) == allocated
    assert report.layout_equal  # every block's address, size and state
    # all shared traces start mid-run (weights were on the GPU before recording)
    assert not report.from_empty
    assert any("mid-run" in n for n in report.notes)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("cut", [0.25, 0.5, 0.75])
def test_rebuild_from_a_suffix_of_the_trace(name: str, cut: float) -> None:
    """Dropping the first part of a trace (as the ring buffer does) forces the rebuild
    to infer blocks from free entries; the replay must still match everything."""
    snap = load_cached(SNAPSHOTS / f"{name}.pickle")
    trace = snap.device_traces[0]
    k = int(len(trace) * cut)
    report = check_fidelity(msgspec.structs.replace(snap, device_traces=[trace[k:]]), name)
    assert report is not None
    assert report.allocs_matched == report.allocs_total
    assert (
        report.segment_sequence_equal
        and report.final_bytes_equal
        and report.layout_equal
    )


def test_rebuild_counts_exact_and_inferred_blocks() -> None:
    snap = load_cached(SNAPSHOTS / "ctx128_fullstep.pickle")
    trace = snap.device_traces[0]
    full = rebuild_initial_state(snap, trace)
    assert (full.n_segments, full.n_exact_blocks, full.n_inferred_blocks) == (
        227,
        324,
        0,
    )
    half = rebuild_initial_state(snap, trace[len(trace) // 2 :])
    assert half.n_inferred_blocks > 0 and not half.from_empty


def test_model_snapshot_is_a_loadable_torch_snapshot(tmp_path: Path) -> None:
    """The model's output in torch's format is a builtins-only pickle: it loads with
    the refusing unpickler and replays onto itself exactly (a trace from empty)."""
    res = replay(training_trace(20_000, seed=3), mode="simulate")
    path = tmp_path / "model.pickle"
    path.write_bytes(pickle.dumps(res.allocator.snapshot().to_torch()))
    snap = load_snapshot(path)
    report = check_fidelity(snap, "model")
    assert report is not None and report.from_empty
    assert report.allocs_matched == report.allocs_total == res.allocs_total
    assert report.segment_sequence_equal and report.layout_equal


def test_simulate_on_a_smaller_card_runs_out_of_memory() -> None:
    """What if: the same real trace on a device that holds less than it reserved."""
    snap = load_cached(SNAPSHOTS / "ctx128_forward.pickle")
    init = rebuild_initial_state(snap)
    cfg = AllocatorConfig.from_settings(snap.allocator_settings)
    start = segment_bytes(init.segments)[0]
    res = replay(
        snap.device_traces[0],
        cfg,
        mode="simulate",
        capacity=start + 512 * 2**20,
        initial_segments=init.segments,
    )
    assert res.ooms, (
        "a card 512 MiB above the starting reservation cannot hold this forward"
    )
    oom = res.first_oom
    assert oom is not None and oom.reserved + oom.device_free == start + 512 * 2**20
    assert res.allocator.memory_stats()["num_ooms"] == len(res.ooms)
    roomy = replay(
        snap.device_traces[0], cfg, mode="simulate", initial_segments=init.segments
    )
    assert not roomy.ooms


def test_simulate_with_expandable_segments_reserves_less() -> None:
    """What if: expandable segments on a real trace need no more reserved memory."""
    snap = load_cached(SNAPSHOTS / "ftcourse_older_format.pickle")
    trace = snap.device_traces[0]
    base = replay(trace, mode="simulate")
    exp = replay(
        trace, AllocatorConfig.parse("expandable_segments:True"), mode="simulate"
    )
    peak = "reserved_bytes.all.peak"
    assert exp.allocator.memory_stats()[peak] <= base.allocator.memory_stats()[peak]
    assert not base.ooms and not exp.ooms

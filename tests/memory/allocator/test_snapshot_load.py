"""Loading snapshots: every shared one loads, hostile and broken files are refused."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import msgspec
import pytest
from allocator_fixtures import SNAPSHOT_FILES, SNAPSHOT_PARAMS, SNAPSHOTS

from torchlens.model.errors import InputError
from torchlens.model.snapshot import (
    Frame,
    Segment,
    TraceEntry,
    load_snapshot,
    normalize_snapshot,
)


def test_shared_snapshots_present() -> None:
    assert len(SNAPSHOT_FILES) >= 7, f"shared snapshots missing in {SNAPSHOTS}"


@pytest.mark.parametrize("path", SNAPSHOT_PARAMS)
def test_every_shared_snapshot_loads_normalized(path: Path) -> None:
    snap = load_snapshot(path)
    assert isinstance(snap.device_traces, list)
    assert isinstance(snap.allocator_settings, dict)
    assert snap.segments, "every shared snapshot has segments"
    for seg in snap.segments:
        # every field is there, of its type (msgspec checks a struct against its fields)
        msgspec.convert(msgspec.to_builtins(seg), Segment)
        assert seg.segment_type in ("small", "large")
        assert sum(b.size for b in seg.blocks) == seg.total_size
        for b in seg.blocks:
            assert b.state in ("active_allocated", "active_pending_free", "inactive")
            assert b.requested_size <= b.size or b.state == "inactive"
    for trace in snap.device_traces:
        for e in trace:
            assert isinstance(e, TraceEntry) and all(isinstance(f, Frame) for f in e.frames)


def test_older_format_gets_defaults() -> None:
    """ftcourse_older_format has neither allocator_settings nor time_us."""
    snap = load_snapshot(SNAPSHOTS / "ftcourse_older_format.pickle")
    assert snap.allocator_settings == {}
    assert snap.external_annotations == []
    assert snap.device_traces[0][0].time_us is None  # unknown, not invented


def test_bytes_path_and_stream_give_the_same_dict() -> None:
    path = SNAPSHOTS / "segments_only.pickle"
    data = path.read_bytes()
    assert load_snapshot(data) == load_snapshot(path) == load_snapshot(io.BytesIO(data))


def _marker_pickles(marker: Path) -> dict[str, bytes]:
    cmd = f"touch {marker}".encode()
    proto0 = b"cos\nsystem\n(V" + cmd + b"\ntR."  # GLOBAL + REDUCE, protocol 0
    proto2 = (
        b"\x80\x02cposix\nsystem\nq\x00X"
        + len(cmd).to_bytes(4, "little")
        + cmd
        + b"\x85R."
    )  # GLOBAL posix.system, TUPLE1, REDUCE
    proto4 = (  # STACK_GLOBAL builtins.exec inside a dict that looks like a snapshot
        b"\x80\x04}\x8c\x08segments]\x8c\x08builtins\x8c\x04exec\x93\x8c"
        + bytes([len(b"import os; os.system('" + cmd + b"')")])
        + b"import os; os.system('"
        + cmd
        + b"')"
        + b"\x85R\x85s."
    )

    class Evil:
        def __reduce__(self):  # what an attacker's pickle.dumps produces
            return (os.system, (f"touch {marker}",))

    via_dumps = pickle.dumps(
        {"segments": [], "x": Evil()}, protocol=pickle.HIGHEST_PROTOCOL
    )
    return {"proto0": proto0, "proto2": proto2, "proto4": proto4, "dumps": via_dumps}


@pytest.mark.parametrize("kind", ["proto0", "proto2", "proto4", "dumps"])
def test_code_running_pickle_is_refused_and_nothing_runs(
    tmp_path: Path, kind: str
) -> None:
    marker = tmp_path / "pwned"
    data = _marker_pickles(marker)[kind]
    with pytest.raises(InputError) as err:
        load_snapshot(data)
    msg = str(err.value)
    assert "refused: the file tries to load" in msg
    assert "snapshots contain only builtins" in msg
    assert any(name in msg for name in ("os.system", "posix.system", "builtins.exec"))
    assert not marker.exists()


def test_stock_unpickler_would_have_run_it(tmp_path: Path) -> None:
    """Guards the test above: the hand-built bytes really are code-running pickles."""
    marker = tmp_path / "ran"
    pickle.loads(_marker_pickles(marker)["proto2"])  # noqa: S301 (deliberate, in a tmp dir)
    assert marker.exists()


def test_refusal_from_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "evil.pickle"
    path.write_bytes(_marker_pickles(tmp_path / "m")["proto0"])
    with pytest.raises(InputError, match=r"evil\.pickle: refused"):
        load_snapshot(path)


def test_truncated_snapshot(tmp_path: Path) -> None:
    data = (SNAPSHOTS / "segments_only.pickle").read_bytes()
    path = tmp_path / "cut.pickle"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated"):
        load_snapshot(path)


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (b"", "empty file"),
        (b"this is not a pickle at all", "not a memory snapshot"),
        (os.urandom(64) + b"\x00", "not a memory snapshot|truncated|refused"),
        (pickle.dumps([1, 2, 3]), "not a memory snapshot"),
        (pickle.dumps({"traceEvents": []}), "not a memory snapshot.*traceEvents"),
        (pickle.dumps({"segments": [{"size": 3}]}), "not a memory snapshot"),
        (pickle.dumps({"segments": "x"}), "not a list"),
    ],
)
def test_garbage_and_non_snapshots(data: bytes, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern):
        load_snapshot(data)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        load_snapshot(tmp_path / "nope.pickle")


def test_very_old_formats_normalize() -> None:
    """torch 1.x: a bare list of segments, blocks with allocated/active booleans."""
    old = [
        {
            "address": 4096,
            "total_size": 2097152,
            "stream": 0,
            "blocks": [
                {"size": 512, "allocated": True, "active": True},
                {"size": 1024, "allocated": False, "active": True},
                {"size": 2097152 - 1536, "allocated": False, "active": False},
            ],
        }
    ]
    snap = normalize_snapshot(old)
    seg = snap.segments[0]
    assert [b.state for b in seg.blocks] == [
        "active_allocated",
        "active_pending_free",
        "inactive",
    ]
    assert [b.address for b in seg.blocks] == [4096, 4608, 5632]
    assert seg.segment_type == "small"
    assert seg.allocated_size == 512 and seg.active_size == 1536
    assert snap.device_traces == [] and snap.allocator_settings == {}

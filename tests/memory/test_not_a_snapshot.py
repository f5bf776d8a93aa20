"""A pickle that is not an allocator snapshot is refused in one line.

``pickle.dump([1, 2, 3], f)`` is a pickle, not a snapshot: ``torchlens report
X.pickle`` exits 2 and ``torchlens.load`` raises ``InputError``, each naming the
file, what it held and what to give instead. A snapshot is the dict
``torch.cuda.memory._snapshot()`` returns (``segments``, ``device_traces``);
torch 1.x's bare list of segments is still read.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import torchlens
from torchlens.frontends.cli.main import main
from torchlens.model.errors import InputError

WHAT_TO_GIVE = "torch.cuda.memory._dump_snapshot"


@pytest.mark.parametrize("held, words", [
    ([1, 2, 3], "a list of 3 ints"),
    ([], "an empty list"),
    ([{"a": 1}, "x"], "a list of 2 items (dict, str)"),
    ({}, "an empty dict"),
    ({"traceEvents": []}, "a dict with keys ['traceEvents']"),
    ("hello", "a str"),
    (7, "an int"),
], ids=["ints", "empty-list", "mixed-list", "empty-dict", "trace-dict", "str", "int"])
def test_a_pickle_that_is_no_snapshot_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture, held, words) -> None:
    path = tmp_path / "notes.pickle"
    path.write_bytes(pickle.dumps(held))
    with pytest.raises(InputError) as exc:
        torchlens.load(str(path))
    said = str(exc.value)
    assert "\n" not in said
    assert said.startswith(f"{path}: not a memory snapshot: it holds {words}"), said
    assert WHAT_TO_GIVE in said, said

    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == f"torchlens: error: {said}"
    assert not (tmp_path / "r.html").exists()


def test_a_trace_only_snapshot_is_read(tmp_path: Path) -> None:
    """``device_traces`` with no ``segments`` (a snapshot of a process that
    freed everything, written by hand or an older tool) is a snapshot."""
    trace = [{"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "frames": []},
             {"action": "free_requested", "addr": 4096, "size": 512, "stream": 0,
              "frames": []}]
    path = tmp_path / "trace_only.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [trace]}))
    loaded = torchlens.load(str(path))
    assert loaded.snapshot().segments == [] and len(loaded.snapshot().device_traces[0]) == 2


def test_torch_1_bare_segment_list_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "old.pickle"
    path.write_bytes(pickle.dumps([{"address": 4096, "total_size": 2097152, "blocks": [
        {"size": 2097152, "allocated": True, "active": True}]}]))
    loaded = torchlens.load(str(path))
    assert loaded.snapshot().segments[0].allocated_size == 2097152

"""The compiled snapshot reader and the Python loader give the same tables.

The Python loader (``model.snapshot.load_snapshot``) is the reference. Every shared
snapshot and snapshots built here by hand (torch's recorder needs a GPU) go through
both: the columns must be equal, and ``result.categories()`` / ``result.peak()`` the
same DataFrames read from the columns, with ``TORCHLENS_NO_NATIVE=1`` and after the
full report. Files the reader does not take (older shapes, pickle protocols 0-1,
torch's categories, a torchlens export) are handed to the Python path; files that
name code (GLOBAL, REDUCE) are refused by both without running anything.
"""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpumem_fixtures import SNAPSHOT_FILES

from torchlens.formats.gpumem_record import RECORD_KEY
from torchlens.formats.snapshot_columns import native, python_reader
from torchlens.frontends.memory.api import load_gpumem
from torchlens.model import InputError
from torchlens.model.snapshot import load_snapshot

MiB = 1 << 20


def _columns_equal(a: Any, b: Any) -> None:
    assert a.stack_contents() == b.stack_contents()
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        elif not name.startswith("_"):  # (a cache of stacks made on use)
            assert x == y, name


def _tables(path: Path, monkeypatch: pytest.MonkeyPatch, *, native_on: bool,
            categories: dict[str, str] | None = None) -> tuple[Any, Any, bool]:
    with monkeypatch.context() as m:
        if native_on:
            m.delenv("TORCHLENS_NO_NATIVE", raising=False)
        else:
            m.setenv("TORCHLENS_NO_NATIVE", "1")
        r = load_gpumem(str(path), custom_categories=categories)
        return r.categories(), r.peak(), r._columns is not None


def _same_everywhere(path: Path, monkeypatch: pytest.MonkeyPatch,
                     categories: dict[str, str] | None = None) -> bool:
    """categories() and peak() equal: native columns, Python loader, full report.
    Returns whether the compiled reader took the file."""
    c_py, s_py, took_py = _tables(path, monkeypatch, native_on=False, categories=categories)
    assert not took_py
    c_n, s_n, took = _tables(path, monkeypatch, native_on=True, categories=categories)
    assert c_n.equals(c_py), (c_n, c_py)
    assert s_n.equals(s_py), (s_n, s_py)
    with monkeypatch.context() as m:
        m.delenv("TORCHLENS_NO_NATIVE", raising=False)
        r = load_gpumem(str(path), custom_categories=categories)
        r.analysis()  # the report made first: the tables come from it
        assert r.categories().equals(c_py) and r.peak().equals(s_py)
    return took


def test_reader_is_built_here():
    # Without it every equality below would compare the Python path to itself.
    assert native._LIB is not None, (
        "the snapshot reader was not built: is a C compiler (cc) installed? "
        "(pip install -e . compiles it through hatch_build.py)")


@pytest.mark.parametrize("path", SNAPSHOT_FILES, ids=lambda p: p.name)
def test_shared_snapshots_same_columns(path, monkeypatch):
    monkeypatch.delenv("TORCHLENS_NO_NATIVE", raising=False)
    data = path.read_bytes()
    cols = native.read(data, RECORD_KEY)
    assert cols is not None, native.status(data)
    _columns_equal(cols, python_reader.from_snapshot(load_snapshot(data)))
    got, want = (native.pair(cols.e_action, cols.e_addr, cols.b_addr),
                 python_reader.pair(cols.e_action, cols.e_addr, cols.b_addr))
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("path", SNAPSHOT_FILES, ids=lambda p: p.name)
def test_shared_snapshots_same_tables(path, monkeypatch):
    assert _same_everywhere(path, monkeypatch)


# --- snapshots made here --------------------------------------------------------------

def _frame(file: str, name: str, line: int) -> dict[str, Any]:
    return {"filename": file, "name": name, "line": line}


USER = _frame("/home/me/train.py", "step", 12)
FWD = [_frame("/x/site-packages/torch/nn/modules/module.py", "_call_impl", 1750), USER]
BWD = [_frame("/x/site-packages/torch/autograd/graph.py", "_engine_run_backward", 8), USER]
OPT = [_frame("/x/site-packages/torch/optim/adam.py", "_init_group", 90),
       _frame("/home/me/train.py", "opt_step", 30)]
DATA = [_frame("/x/site-packages/torch/utils/data/_utils/collate.py", "collate", 5), USER]


def _snapshot(*, times: bool = True, big_addr: bool = False) -> dict[str, Any]:
    """One device: a 20 MiB and a 2 MiB segment; a trace with forward, backward and
    optimizer runs (the lifetime split), a free of a block from before the window, a
    block the trace never touches (alive before and at the end), a free_requested /
    free_completed pair and a bare free_completed."""
    base = (1 << 63) + (1 << 40) if big_addr else 0x7F00_0000_0000
    small = base + 64 * MiB
    kept = {"address": base, "size": 4 * MiB, "requested_size": 4 * MiB,
            "state": "active_allocated", "frames": list(DATA)}
    def block(addr: int, size: int, state: str, frames: list[dict[str, Any]],
              requested: int | None = None) -> dict[str, Any]:
        return {"address": addr, "size": size, "requested_size": requested or size,
                "state": state, "frames": frames}

    act = "active_allocated"
    segs = [  # what the trace below leaves, and the block it never touches
        {"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 12 * MiB,
         "active_size": 12 * MiB, "requested_size": 12 * MiB, "stream": 0,
         "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
         "frames": [], "blocks": [
             kept, block(base + 4 * MiB, 6 * MiB, act, list(OPT)),
             block(base + 10 * MiB, 4 * MiB, "inactive", []),
             block(base + 14 * MiB, 2 * MiB, act, list(BWD)),
             block(base + 16 * MiB, 4 * MiB, "inactive", [])]},
        {"device": 0, "address": small, "total_size": 2 * MiB,
         "allocated_size": 3 * 512 * 1024, "active_size": 3 * 512 * 1024,
         "requested_size": 3 * 512 * 1024, "stream": 0, "segment_type": "small",
         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
         "blocks": [block(small, 512 * 1024, "inactive", [])] + [
             block(small + k * 512 * 1024, 512 * 1024, act, list(FWD), 512 * 1024 - 7)
             for k in (1, 2, 3)]},
    ]
    t = iter(range(1000, 10**6, 10))
    trace: list[dict[str, Any]] = []

    def add(action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}
        if times:
            e["time_us"] = next(t)
        trace.append(e)

    add("segment_alloc", small, 2 * MiB, [])
    for k in range(4):  # forward activations, two freed, two kept to the peak
        add("alloc", small + k * 512 * 1024, 512 * 1024 - 7, list(FWD))
    add("free_requested", base + 16 * MiB, 3 * MiB, list(FWD))  # from before the window
    add("free_completed", base + 16 * MiB, 3 * MiB, [])
    for k in range(2):  # backward: one scratch freed in the pass, one kept (gradient)
        add("alloc", base + (12 + 2 * k) * MiB, 2 * MiB, list(BWD))
    add("free_requested", base + 12 * MiB, 2 * MiB, list(BWD))
    add("alloc", base + 4 * MiB, 6 * MiB, list(OPT))  # optimizer state, kept
    add("alloc", base + 18 * MiB, MiB, list(OPT))  # optimizer temporary
    add("free_completed", base + 18 * MiB, MiB, [])  # a free with no request first
    add("free_requested", base + 10 * MiB, MiB, list(DATA))  # from before, freed later
    add("free_requested", small, 512 * 1024 - 7, list(FWD))
    add("free_completed", small, 512 * 1024 - 7, list(FWD))
    add("oom", 0, 0, [])
    add("mystery_action", 1, 2, [])
    return {"segments": segs, "device_traces": [trace],
            "allocator_settings": {"max_split_size": -1, "roundup_power2_divisions": [0]},
            "external_annotations": []}


def _write(tmp_path: Path, snap: Any, name: str = "snap.pickle", protocol: int = 4) -> Path:
    p = tmp_path / name
    p.write_bytes(pickle.dumps(snap, protocol=protocol))
    return p


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_made_snapshot_same_tables(tmp_path, monkeypatch, protocol):
    p = _write(tmp_path, _snapshot(), protocol=protocol)
    assert _same_everywhere(p, monkeypatch)
    cats = set(_tables(p, monkeypatch, native_on=True)[0]["category"])
    # the lifetime split and blocks from before the window are all named
    assert {"optimizer state", "optimizer temporary", "input", "activation"} <= cats


@pytest.mark.parametrize("variant", ["no times", "addresses past 2**63", "your categories",
                                     "two devices", "no device_traces", "only traces"])
def test_made_variants_same_tables(tmp_path, monkeypatch, variant):
    snap = _snapshot(times=variant != "no times", big_addr=variant == "addresses past 2**63")
    categories = {"mine": "train.py:opt_step"} if variant == "your categories" else None
    if variant == "two devices":
        other = copy.deepcopy(snap["segments"])
        for s in other:
            s["device"] = 1
        snap["segments"] += other
        snap["device_traces"] = [[], copy.deepcopy(snap["device_traces"][0])]
    if variant == "no device_traces":
        del snap["device_traces"]
    if variant == "only traces":
        del snap["segments"]
    p = _write(tmp_path, snap)
    assert _same_everywhere(p, monkeypatch, categories)
    if variant == "your categories":
        assert "mine" in set(_tables(p, monkeypatch, native_on=True,
                                     categories=categories)[0]["category"])


@pytest.mark.parametrize("variant", ["block without requested_size", "float time",
                                     "torch categories", "frame with another key",
                                     "protocol 0", "a list of segments", "torchlens export"])
def test_other_shapes_go_to_the_python_loader(tmp_path, monkeypatch, variant):
    snap: Any = _snapshot()
    protocol = 4
    if variant == "block without requested_size":
        del snap["segments"][0]["blocks"][1]["requested_size"]
    elif variant == "float time":
        snap["device_traces"][0][2]["time_us"] = 1234.5
    elif variant == "torch categories":
        snap["device_traces"][0][1]["torch_category"] = [(0, "activation")]
    elif variant == "frame with another key":
        snap["device_traces"][0][1]["frames"] = [dict(USER, column=3)]
    elif variant == "protocol 0":
        protocol = 0
    elif variant == "a list of segments":
        snap = snap["segments"]
    elif variant == "torchlens export":
        snap[RECORD_KEY] = {"damaged": True}
    p = _write(tmp_path, snap, protocol=protocol)
    monkeypatch.delenv("TORCHLENS_NO_NATIVE", raising=False)
    assert native.read(p.read_bytes(), RECORD_KEY) is None
    assert not _same_everywhere(p, monkeypatch)


class _Runs:
    """Pickles as a call of ``os.system``: loading it with pickle would run the command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, 4])
def test_code_in_the_pickle_is_refused_and_never_run(tmp_path, monkeypatch, protocol):
    marker = tmp_path / "ran"
    snap = _snapshot()
    snap["device_traces"][0][0]["frames"] = [_Runs(marker)]
    p = _write(tmp_path, snap, protocol=protocol)
    monkeypatch.delenv("TORCHLENS_NO_NATIVE", raising=False)
    status, why = native.status(p.read_bytes())
    assert status == "refused" and "GLOBAL" in why
    assert native.read(p.read_bytes(), RECORD_KEY) is None
    for no_native in ("", "1"):
        monkeypatch.setenv("TORCHLENS_NO_NATIVE", no_native)
        with pytest.raises(InputError, match="refused: the file tries to load .*system"):
            load_gpumem(str(p))
    assert not marker.exists()


def test_reduce_without_a_global_is_refused(tmp_path):
    # a REDUCE applied to an ordinary value: refused by its opcode, not run
    data = b"\x80\x04]\x94)R."
    assert native.status(data)[0] == "refused"
    p = tmp_path / "r.pickle"
    p.write_bytes(data)
    with pytest.raises(InputError, match="not a memory snapshot"):
        load_gpumem(str(p))


def test_truncated_and_empty_files_read_as_before(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHLENS_NO_NATIVE", raising=False)
    data = pickle.dumps(_snapshot(), protocol=4)
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(data[: len(data) // 2])
    assert native.status(cut.read_bytes())[0] == "truncated"
    with pytest.raises(InputError, match="truncated"):
        load_gpumem(str(cut))
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty file"):
        load_gpumem(str(empty))


def test_text_pickle_cannot_decode_fails_the_same_on_both_paths(tmp_path, monkeypatch):
    # an action whose bytes are not UTF-8: the reader compares no bytes it has not checked
    snap = _snapshot()
    snap["device_traces"][0][1]["action"] = "QQ"
    data = pickle.dumps(snap, protocol=4)
    assert data.count(b"QQ") == 1
    p = tmp_path / "bad_text.pickle"
    p.write_bytes(data.replace(b"QQ", b"\xff\xfe"))
    monkeypatch.delenv("TORCHLENS_NO_NATIVE", raising=False)
    assert native.status(p.read_bytes()) == ("shape", "a string not UTF-8")
    msgs = []
    for no_native in ("", "1"):
        monkeypatch.setenv("TORCHLENS_NO_NATIVE", no_native)
        with pytest.raises(InputError) as err:
            load_gpumem(str(p))
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1] and "cannot read it as a pickle" in msgs[0]


def test_damaged_settings_fail_the_same_on_both_paths(tmp_path, monkeypatch):
    snap = _snapshot()
    snap["allocator_settings"]["garbage_collection_threshold"] = 7.0
    p = _write(tmp_path, snap)
    msgs = []
    for no_native in ("", "1"):
        monkeypatch.setenv("TORCHLENS_NO_NATIVE", no_native)
        with pytest.raises(InputError) as err:
            load_gpumem(str(p))
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1] and "garbage_collection_threshold" in msgs[0]


def test_a_fast_loaded_result_is_a_whole_result(tmp_path, monkeypatch):
    """Anything beyond peak() and categories() makes the Profile from the same bytes,
    even when the file changed on disk after loading."""
    monkeypatch.delenv("TORCHLENS_NO_NATIVE", raising=False)
    p = _write(tmp_path, _snapshot())
    r = load_gpumem(str(p))
    assert r._columns is not None and r._profile is None
    cats = r.categories()
    p.write_bytes(b"not a pickle any more")
    assert r.profile.kind == "gpumem" and r.profile.title == "snap.pickle"
    assert r.analysis().peak.peak == int(cats["bytes"].sum())
    assert repr(r).startswith("torchlens gpumem: peak 16.0 MiB")

"""A loaded snapshot is read once per distinct frame and stack:
pickle shares one dict per distinct frame, so the checks and site lookups are keyed by it,
and must still name a damaged frame wherever it sits."""

from __future__ import annotations

import pickle

import msgspec
import pytest

import torchlens
from torchlens.analysis import frames as frames_mod
from torchlens.model import InputError
from torchlens.model.snapshot import load_snapshot

USER = {"filename": "/home/me/train.py", "name": "step", "line": 12}
TORCH = {"filename": "/x/site-packages/torch/nn/modules/module.py", "name": "_call_impl",
         "line": 1}


def _snapshot(n: int, last_frames: list | None = None) -> dict:
    stack = [TORCH, USER]  # one list of shared dicts, as torch's pickle shares them
    trace = []
    for i in range(n):
        trace.append({"action": "alloc", "addr": 4096 * (i + 1), "size": 512,
                      "time_us": 10 + i, "frames": list(stack)})
    if last_frames is not None:
        trace.append({"action": "alloc", "addr": 1, "size": 512, "time_us": 10 + n,
                      "frames": last_frames})
    seg = {"address": 0, "total_size": 2 << 20, "blocks": [  # what the trace left allocated
        {"address": e["addr"], "size": 512, "state": "active_allocated"} for e in trace]}
    return {"segments": [seg], "device_traces": [trace]}


def test_site_is_looked_up_once_per_distinct_stack(tmp_path, monkeypatch):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(500)))
    calls = []
    real = frames_mod.site_of
    monkeypatch.setattr(frames_mod, "site_of", lambda f, c=None: calls.append(1) or real(f, c))
    r = torchlens.load(str(path))
    sites = r.peak()
    assert sites.iloc[0]["site"] == "/home/me/train.py:12"
    assert sites.iloc[0]["bytes"] == r.analysis().peak.peak == 500 * 512
    assert len(calls) <= 2  # 500 allocations, one stack (once for the timeline, once more)


def test_a_damaged_frame_after_shared_ones_is_still_named(tmp_path):
    bad = [TORCH, {"filename": "/home/me/train.py", "name": 7, "line": 3}]
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(_snapshot(50, bad)))
    with pytest.raises(InputError, match=r"device_traces\[0\]\[50\]\.frames\[1\].*'name'"):
        load_snapshot(path)


def test_peak_and_categories_skip_the_rest_of_the_report(tmp_path, monkeypatch):
    """``peak()`` and ``categories()`` walk the trace once and compute no fragmentation,
    leaks or top sites; the report made afterwards reuses that walk and gives the same
    tables as a report made first."""
    from torchlens.analysis.memory import analyze as analyze_mod
    from torchlens.analysis.memory import leaks

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(40)))
    first = torchlens.load(str(path))
    first.analysis()
    walks, rest = [], []
    real_build = analyze_mod.build_timeline
    monkeypatch.setattr(analyze_mod, "build_timeline",
                        lambda *a, **k: walks.append(1) or real_build(*a, **k))
    real_surv = leaks.survivors
    monkeypatch.setattr(leaks, "survivors", lambda *a, **k: rest.append(1) or real_surv(*a, **k))
    r = torchlens.load(str(path))
    sites, cats = r.peak(), r.categories()
    assert (walks, rest) == ([1], [])
    assert sites.equals(first.peak()) and cats.equals(first.categories())
    assert r.analysis().peak.peak == 40 * 512 and (walks, rest) == ([1], [1])


@pytest.mark.parametrize(("key", "value", "said"), [
    ("size", True, "'size' is bool True"),
    ("size", 2**50 + 1, "'size' is int"),
    ("addr", -1, "'addr' is int -1, not an address"),
    ("stream", None, "'stream' is NoneType None"),
    ("time_us", float("nan"), "'time_us' is float nan"),
    ("time_us", 2**63, "'time_us' is int"),
    ("device_free", -5, "'device_free' is int -5"),
    ("action", 3, "'action' is int 3, not an action name"),
    ("frames", "x", "'frames' is str 'x', not a list of frames"),
])
def test_each_damaged_trace_value_is_named_at_its_entry(tmp_path, key, value, said):
    """The trace is checked a field of every entry at a time; a bad value anywhere still
    names its entry and field, as the per-entry check did."""
    snap = _snapshot(30)
    snap["device_traces"][0][17][key] = value
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(snap))
    with pytest.raises(InputError, match=r"device_traces\[0\]\[17\] field ") as err:
        load_snapshot(path)
    assert said in str(err.value)


@pytest.mark.parametrize(("key", "value"), [("line", True), ("filename", None), ("name", 1)])
def test_a_damaged_frame_shared_by_many_entries_is_named_at_its_first(tmp_path, key, value):
    snap = _snapshot(30)
    bad = dict(USER, **{key: value})
    for e in snap["device_traces"][0][9:]:
        e["frames"] = [TORCH, bad]
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(snap))
    # the segments come first in the file: its blocks hold no frames here
    with pytest.raises(InputError, match=rf"device_traces\[0\]\[9\]\.frames\[1\] field '{key}'"):
        load_snapshot(path)


def test_sound_edge_values_load_as_the_per_entry_path_gives_them(tmp_path):
    from torchlens.model.snapshot import _Checked, _normalize_trace_entry

    snap = _snapshot(5)
    t = snap["device_traces"][0]
    t[0].update(size=2**50, addr=2**64 - 1, time_us=1.5, device_free=0)
    del t[1]["frames"], t[2]["addr"], t[3]["time_us"]
    path = tmp_path / "edge.pickle"
    path.write_bytes(pickle.dumps(snap))
    got = load_snapshot(path).device_traces[0]
    want = [_normalize_trace_entry(e, "s", "x", _Checked()) for e in pickle.loads(
        path.read_bytes())["device_traces"][0]]
    assert got == want
    assert msgspec.to_builtins(got) == msgspec.to_builtins(want)


def test_loading_leaves_the_garbage_collector_as_it_found_it(tmp_path):
    """The collector is paused while a snapshot is unpickled, and back on
    afterwards, after a damaged file too; a program that had it off keeps it off."""
    import gc

    good, bad = tmp_path / "good.pickle", tmp_path / "bad.pickle"
    good.write_bytes(pickle.dumps(_snapshot(3)))
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [[print]]}))  # a global
    assert gc.isenabled()
    load_snapshot(good)
    with pytest.raises(InputError, match="refused"):
        load_snapshot(bad)
    assert gc.isenabled()
    gc.disable()
    try:
        load_snapshot(good)
        assert not gc.isenabled()
    finally:
        gc.enable()

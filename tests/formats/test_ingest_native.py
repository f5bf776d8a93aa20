"""The C scanner and the Python path of ingest give the same Trace.

The Python path is the reference (tests/formats/test_ingest.py checks it
against plain json). Here every shared trace, a fresh CPU trace and a set of
deliberately odd variants go through both, and the tables, labels and meta
must be equal; odd variants must be handed back to the Python path, never
read differently.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from torchlens.formats.kineto import ingest_bytes
from torchlens.formats.kineto import native as kineto_native
from torchlens.model import InputError

#: Every shared trace (the list test_ingest.py checks against plain json).
TRACE_FILES = sorted(p.name for p in (Path(__file__).resolve().parents[2].parent
                                      / "shared" / "testdata" / "traces").glob("*.json*"))


def _python_path(data: bytes, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as m:
        m.setenv("TORCHLENS_NO_NATIVE", "1")
        try:
            return ingest_bytes(data, "t")
        except InputError as err:
            return f"InputError: {err}"


def _both(data: bytes, monkeypatch: pytest.MonkeyPatch):
    try:
        native = ingest_bytes(data, "t")
    except InputError as err:
        native = f"InputError: {err}"
    return _python_path(data, monkeypatch), native


def _assert_same(expected, got) -> None:
    if isinstance(expected, str) or isinstance(got, str):
        assert expected == got
        return
    assert list(got.events.columns) == list(expected.events.columns)
    for name, want in expected.events.columns.items():
        have = got.events.columns[name]
        assert have.dtype == want.dtype, name
        assert np.array_equal(have, want, equal_nan=want.dtype.kind == "f"), name
    assert got.events.categories == expected.events.categories
    assert got.meta == expected.meta


def test_scanner_is_built_here():
    # Without it every equality below would compare the Python path to itself.
    assert kineto_native.available(), (
        "the C trace scanner was not built: is a C compiler (cc) installed? "
        "(pip install -e . compiles it through hatch_build.py)")


@pytest.mark.parametrize("name", TRACE_FILES)
def test_shared_traces_equal_on_both_paths(traces_dir, name, monkeypatch):
    data = gzip.decompress((traces_dir / name).read_bytes())
    took = kineto_native.native_columns(data) is not None
    # AMD writes hex stream ids ("0x0"): only the Python path parses those.
    assert took == (name != "amd_mi250_rocm.json.gz")
    _assert_same(*_both(data, monkeypatch))


def test_fresh_cpu_trace_equal_on_both_paths(tmp_path, monkeypatch):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
    with torch.profiler.profile(record_shapes=True, profile_memory=True,
                                with_flops=True) as prof:
        for _ in range(5):
            model(torch.randn(4, 16)).sum().backward()
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    data = path.read_bytes()
    assert kineto_native.native_columns(data) is not None
    expected, got = _both(data, monkeypatch)
    _assert_same(expected, got)
    assert "aten::linear" in got.events.categories["name"]
    assert (got.events.columns["input_dims"] >= 0).any()  # shapes were read
    assert (got.events.columns["mem_bytes"] != 0).any()  # [memory] events too


def _trace(*events: dict | bytes, **top) -> bytes:
    """A trace file; an event given as bytes goes in verbatim (odd spacing)."""
    body = b",\n".join(e if isinstance(e, bytes) else json.dumps(e).encode()
                        for e in events)
    head = json.dumps({"schemaVersion": 1, **top})[:-1].encode()
    return head + b', "traceEvents": [\n' + body + b"\n]}"


OK_EVENT = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2,
            "ts": 10.5, "dur": 3.0, "args": {"External id": 7}}

#: Each is valid JSON the scanner must either read exactly as the Python path
#: does or decline; ``True`` marks the ones it must take itself.
VARIANTS = {
    "escaped and unicode names": (True, [
        {**OK_EVENT, "name": 'say "hi" \\ done'},
        {**OK_EVENT, "name": "caf\u00e9"}, {**OK_EVENT, "name": "café"}]),
    "string pid and tid": (True, [
        OK_EVENT, {**OK_EVENT, "pid": "Spans", "tid": "PyTorch Profiler"},
        {**OK_EVENT, "pid": "12", "tid": None}]),
    "metadata first and interleaved": (True, [
        {"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "ts": 0,
         "args": {"name": "spans"}},
        OK_EVENT, {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "ts": 0,
                   "args": {"name": "main"}},
        {**OK_EVENT, "name": "aten::add", "pid": "Spans"}]),
    "process group id int then string": (True, [
        {**OK_EVENT, "args": {"Process Group ID": 0}},
        {**OK_EVENT, "args": {"Process Group ID": "0"}},
        {**OK_EVENT, "args": {"Process Group Name": "default_pg"}}]),
    "flows, instants and I": (True, [
        OK_EVENT, {"ph": "s", "id": 5, "pid": 1, "tid": 2, "ts": 11.0, "cat": "fwdbwd",
                   "name": "fwdbwd"},
        {"ph": "f", "id": 5, "pid": 1, "tid": 2, "ts": 12.0, "cat": "fwdbwd",
         "name": "fwdbwd", "bp": "e"},
        {"ph": "I", "pid": 1, "tid": 2, "ts": 13.0, "name": "[memory]",
         "args": {"Addr": 140000000000, "Bytes": -64}}]),
    "raw shapes with spacing": (True, [
        {**OK_EVENT, "args": {"Input Dims": [[2, 3], []]}},
        b'{"ph":"X","name":"aten::mm","pid":1,"tid":2,"ts":11,"dur":1,'
        b'"args":{"Input Dims":[[2,3],[]],"Input type":["float",""]}}']),
    "flops as int and float, both spellings": (True, [
        {**OK_EVENT, "args": {"flops": 10}}, {**OK_EVENT, "args": {"FLOPs": 2.5}},
        {**OK_EVENT, "args": {"flops": None, "FLOPs": 4}}]),
    "ts as string": (False, [OK_EVENT, {**OK_EVENT, "ts": "12.5"}]),
    "hex stream": (False, [{**OK_EVENT, "cat": "kernel", "args": {"stream": "0x7"}}]),
    "unknown phase": (False, [OK_EVENT, {**OK_EVENT, "ph": "B"}]),
    "float in an int field": (False, [{**OK_EVENT, "args": {"External id": 7.0}}]),
    "bool in a field": (False, [{**OK_EVENT, "args": {"correlation": True}}]),
    "object where a number goes": (False, [{**OK_EVENT, "dur": {"v": 1}}]),
    "id beyond int64": (False, [{**OK_EVENT, "args": {"Addr": 2**64 + 1}}]),
    "args null": (False, [{**OK_EVENT, "args": None}]),
    "event without ts": (False, [OK_EVENT, {"ph": "X", "name": "x", "pid": 1, "tid": 1}]),
    "only metadata": (False, [{"ph": "M", "name": "process_name", "pid": 1, "ts": 0}]),
}


@pytest.mark.parametrize("label", list(VARIANTS))
def test_odd_variants_equal_or_declined(label, monkeypatch):
    takes, events = VARIANTS[label]
    data = _trace(*events, deviceProperties=[{"id": 0}], distributedInfo={"rank": 0})
    assert (kineto_native.native_columns(data) is not None) == takes
    _assert_same(*_both(data, monkeypatch))


@pytest.mark.parametrize("data", [
    b'{"traceEvents": [' + json.dumps(OK_EVENT).encode(),  # cut short
    _trace(OK_EVENT) + b" trailing",
    b'{"traceEvents": [], "x": 1}',
    b'{"trace\\u0045vents": [' + json.dumps(OK_EVENT).encode() + b"]}",
    b"[" + json.dumps(OK_EVENT).encode() + b"]",  # Chrome's bare array
])
def test_malformed_or_other_shapes_go_to_the_python_path(data, monkeypatch):
    assert kineto_native.native_columns(data) is None
    _assert_same(*_both(data, monkeypatch))

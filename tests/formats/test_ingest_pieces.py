"""A trace read in pieces (``formats.kineto.pieces``) is the trace read whole.

Every shared trace, plain and gzip, is cut into pieces of a few KB (hundreds
of pieces: cuts between every kind of event, metadata events alone in a
piece) and must give the whole-file table, labels and meta exactly; files
this path cannot take (a cut inside a name, no ``traceEvents``) are handed
back to the whole-file reader, never read differently."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from test_ingest_native import TRACE_FILES, _assert_same

from torchlens.formats.kineto import ingest_bytes, load_trace
from torchlens.formats.kineto import native as kineto_native
from torchlens.formats.kineto import pieces as kineto_pieces
from torchlens.formats.kineto.reader import _trace


def _in_pieces(path: Path, piece_bytes: int):
    got = kineto_pieces.load_in_pieces(str(path), piece_bytes=piece_bytes)
    assert got is not None, f"{path.name}: the piece reader declined it"
    return _trace(*got, Counter(), str(path))


@pytest.mark.parametrize("name", TRACE_FILES)
@pytest.mark.parametrize("piece_bytes", [3000, 1 << 16])
def test_every_shared_trace_read_in_pieces_is_the_trace_read_whole(
        traces_dir: Path, tmp_path: Path, name: str, piece_bytes: int) -> None:
    path = traces_dir / name
    raw = path.read_bytes()
    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    if kineto_native.native_columns(plain.read_bytes()) is None:
        # the scanner declines it whole (the Python path reads it): in pieces too
        assert kineto_pieces.load_in_pieces(str(path), piece_bytes=piece_bytes) is None
        return
    whole = ingest_bytes(raw, str(path))
    _assert_same(whole, _in_pieces(path, piece_bytes))
    whole_plain = ingest_bytes(plain.read_bytes(), str(plain))
    _assert_same(whole_plain, _in_pieces(plain, piece_bytes))


def test_members_after_the_events_are_read(tmp_path: Path) -> None:
    doc = {"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "name": "a", "pid": 1, "tid": 2, "ts": 10, "dur": 5, "cat": "cpu_op"},
        {"ph": "X", "name": "b", "pid": 1, "tid": 2, "ts": 20, "dur": 5, "cat": "cpu_op"}],
        "traceName": "after.json", "deviceProperties": [{"id": 0, "name": "x]y"}],
        "displayTimeUnit": "ms"}
    path = tmp_path / "after.json"
    path.write_text(json.dumps(doc, indent=1))
    _assert_same(ingest_bytes(path.read_bytes(), str(path)), _in_pieces(path, 64))
    assert _in_pieces(path, 64).meta["traceName"] == "after.json"


def test_a_cut_inside_a_name_goes_back_to_the_whole_file_reader(tmp_path: Path,
                                                                 monkeypatch) -> None:
    events = [{"ph": "X", "name": "x" * 50 + "},{" + "y" * 50, "pid": 1, "tid": 2,
               "ts": 10 + i, "dur": 1, "cat": "cpu_op"} for i in range(40)]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert kineto_pieces.load_in_pieces(str(path), piece_bytes=300) is None
    monkeypatch.setattr(kineto_pieces, "STREAM_ABOVE", 0)
    monkeypatch.setattr(kineto_pieces, "PIECE_BYTES", 300)
    trace = load_trace(path)  # read whole: every name as written
    assert set(trace.events.text("name")) == {"x" * 50 + "},{" + "y" * 50}
    assert len(trace.events) == 40


def test_large_files_take_the_piece_path(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": f"op{i}", "pid": 1, "tid": 2, "ts": i, "dur": 1, "cat": "cpu_op"}
        for i in range(100)]}))
    called = []
    real = kineto_pieces.load_in_pieces
    monkeypatch.setattr("torchlens.formats.kineto.reader.load_in_pieces",
                        lambda *a, **k: called.append(a) or real(*a, **k))
    load_trace(path)
    assert not called  # small: read whole
    monkeypatch.setattr(kineto_pieces, "STREAM_ABOVE", 100)
    trace = load_trace(path)
    assert called and len(trace.events) == 100

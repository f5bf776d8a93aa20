"""Each kind of bad file a user may pass is one line naming the file
and the field, with exit status 2 (or, for an absurd duration, the event left out
and said), never a traceback."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import zipfile
from pathlib import Path

import pytest

from torchlens.formats.kineto import load_trace
from torchlens.frontends.cli.main import main
from torchlens.model import InputError, load_profile

DATA = Path(__file__).resolve().parents[1] / "data" / "cuda"


def _trace() -> dict:
    return json.loads(gzip.decompress((DATA / "cuda_torchprof.json.gz").read_bytes()))


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("torchlens: error: ")
    return err[0]


# ------------------------------------------------------------------------- 17
def test_an_absurd_kernel_duration_is_left_out_and_said_in_every_view(tmp_path, capsys):
    doc = _trace()
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["dur"] = 1e300
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.json").write_text(json.dumps(doc))
    assert main(["analyze", str(run), "--json", "--workers", "1"]) == 0
    json.loads(capsys.readouterr().out)  # valid JSON: no Infinity
    trace = load_trace(run / "rank0.json")
    (why, n), = trace.meta["dropped"].items()
    assert n == 1 and why.startswith('"dur" over 11 days') and kernel["name"][:20] in why
    assert trace.events["dur"].max() < 1e12
    out = tmp_path / "r.html"
    assert main(["report", str(run / "rank0.json"), "-o", str(out)]) == 0
    assert "1 events could not be read and were left out: &#34;dur&#34; over 11 days" in \
        out.read_text()


def test_a_trace_whose_every_time_is_absurd_is_one_line(tmp_path, capsys):
    path = tmp_path / "all.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, '
                    '"tid": 1, "ts": 1, "dur": 1e300}]}')
    with pytest.raises(InputError, match=r'all\.json: no event has a usable time \("dur"'):
        load_trace(path)
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    assert "all.json" in _one_error_line(capsys)


# ------------------------------------------------------------------------- 18
@pytest.mark.parametrize("where", ["args", "top", "array"])
def test_a_trace_nested_5000_deep_is_one_line(tmp_path, capsys, where):
    deep = "[" * 5000 + "]" * 5000
    text = {"args": '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, '
                    f'"tid": 1, "args": {{"x": {deep}}}}}]}}',
            "top": f'{{"traceEvents": [], "deviceProperties": {deep}}}',
            "array": deep}[where]
    path = tmp_path / "deep.json"
    path.write_text(text)
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    line = _one_error_line(capsys)
    assert "deep.json" in line and "nested deeper" in line


def test_a_trace_with_a_changed_byte_outside_utf8_is_one_line(tmp_path, capsys):
    data = bytearray(json.dumps(_trace()).encode())
    data[data.index(b'"name"') + 9] = 0xA5  # inside an event's name
    path = tmp_path / "flipped.json"
    path.write_bytes(bytes(data))
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    line = _one_error_line(capsys)
    assert "flipped.json: not UTF-8 text" in line


def test_an_id_beyond_64_bits_is_a_label_not_an_overflow(tmp_path):
    doc = _trace()
    x = next(e for e in doc["traceEvents"] if e.get("ph") == "X")
    x["pid"] = 10**30
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    trace = load_trace(path)
    assert str(10**30) in trace.meta["pid_labels"].values()


# ------------------------------------------------------------------------- 19
def _saved() -> bytes:
    return (DATA / "cuda_torchprof.tlprof").read_bytes()


@pytest.mark.parametrize("damage", ["cut", "manifest byte", "trace byte"])
def test_a_damaged_tlprof_is_one_line(tmp_path, capsys, damage):
    data = bytearray(_saved())
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = {i.filename: i for i in zf.infolist()}
    if damage == "cut":
        data = data[: len(data) // 2]
    else:
        member = info["manifest.json" if damage == "manifest byte" else "traces/0.npz"]
        # a tenth in: the deflate stream breaks (zlib.error); half way: a bad CRC
        at = member.header_offset + 30 + len(member.filename) + member.compress_size // 10
        data[at] ^= 0xFF
    path = tmp_path / "saved.tlprof"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"saved\.tlprof: (damaged|not a torchlens)"):
        load_profile(path)
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    line = _one_error_line(capsys)
    assert "saved.tlprof" in line and "Error" not in line


def test_a_tlprof_manifest_field_of_the_wrong_type_is_named(tmp_path):
    with zipfile.ZipFile(io.BytesIO(_saved())) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    manifest = json.loads(members["manifest.json"])
    manifest["traces"] = 5
    members["manifest.json"] = json.dumps(manifest).encode()
    path = tmp_path / "typed.tlprof"
    with zipfile.ZipFile(path, "w") as zf:
        for name, blob in members.items():
            zf.writestr(name, blob)
    with pytest.raises(InputError, match=r"typed\.tlprof: damaged .*field 'traces' is int 5"):
        load_profile(path)


# ------------------------------------------------------------------------- 20
def _snapshot() -> dict:
    return pickle.loads((DATA / "cuda_gpumem_side_stream.pickle").read_bytes())


@pytest.mark.parametrize(("field", "value", "said"), [
    ("time_us", "12x", "'time_us' is str '12x', not a time"),
    ("addr", "0x7f00", "'addr' is str '0x7f00', not an address"),
    ("size", 10**30, "'size' is int 1000000000000000000000000000000, not a size"),
])
@pytest.mark.parametrize("command", ["report", "simulate"])
def test_a_snapshot_entry_with_a_bad_number_names_entry_and_field(tmp_path, capsys, field,
                                                                  value, said, command):
    snap = _snapshot()
    snap["device_traces"][0][7][field] = value
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(snap))
    argv = [command, str(path)] + (["-o", str(tmp_path / "r.html")] if command == "report"
                                   else ["--capacity", "64MiB"])
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert "bad.pickle: damaged memory snapshot: device_traces[0][7] field " in line
    assert said in line and "take the snapshot again" in line


def test_a_block_size_of_10_to_the_30_is_named(tmp_path, capsys):
    snap = _snapshot()
    snap["segments"][1]["blocks"][0]["size"] = 10**30
    path = tmp_path / "huge.pickle"
    path.write_bytes(pickle.dumps(snap))
    assert main(["simulate", str(path)]) == 2
    assert "segments[1].blocks[0] field 'size'" in _one_error_line(capsys)


def test_a_snapshot_saved_in_a_tlprof_is_checked_as_a_snapshot_file_is(tmp_path, capsys):
    saved = Path(__file__).resolve().parents[1] / "data" / "v1" / "gpumem.tlprof"
    with zipfile.ZipFile(saved) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    snap = json.loads(members["snapshots/0.json"])
    snap["device_traces"][0][0]["frames"] = [-1]
    members["snapshots/0.json"] = json.dumps(snap).encode()
    path = tmp_path / "mem.tlprof"
    with zipfile.ZipFile(path, "w") as zf:
        for name, blob in members.items():
            zf.writestr(name, blob)
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    line = _one_error_line(capsys)
    assert "mem.tlprof (snapshots/0.json): damaged memory snapshot: " \
           "device_traces[0][0].frames[0] field 'frame' is int -1, not a dict" in line

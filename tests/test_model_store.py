"""The .tlprof file: round trip, compatibility and bad input."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from torchlens.model import (
    FORMAT_VERSION,
    FormatVersionError,
    InputError,
    OpDisplay,
    Profile,
    ProfilerOptions,
    Table,
    TorchprofPayload,
    Trace,
    load_profile,
)
from torchlens.model.snapshot import normalize_snapshot


def _profile() -> Profile:
    events = Table.from_records(
        [{"name": "aten::mm", "ts": 1.5, "dur": 2.0}, {"name": "<b>x</b>", "ts": 4.0}],
        text=["name"],
    )
    return Profile(
        kind="torchprof",
        title="t",
        environment={"torch": "2.13.0", "cpu_count": 2},
        payload=TorchprofPayload(display=OpDisplay(top=5),
                                 recorded=ProfilerOptions(schedule=(1, 1, 2)),
                                 timings={"stop_s": 0.5}),
        traces={"main": Trace(events, {"t0_us": 123.0, "dropped": {}})},
        tables={"mem": Table({"t": np.arange(3.0), "b": np.array([1, 2, 3])})},
        snapshots={"dev0": normalize_snapshot({"segments": [{"address": 1, "blocks": []}]})},
        unmeasured=["GPU kernels: no CUDA device"],
        attachments={"trace.json.gz": b"\x1f\x8b raw"},
    )


def test_round_trip_keeps_everything(tmp_path):
    p = _profile()
    loaded = load_profile(p.save(str(tmp_path / "a.tlprof")))
    assert loaded.kind == "torchprof" and loaded.payload == p.payload
    ev = loaded.trace.events
    assert list(ev.text("name")) == ["aten::mm", "<b>x</b>"]
    assert np.isnan(ev["dur"][1]) and ev["ts"][0] == 1.5
    assert loaded.trace.meta["t0_us"] == 123.0
    assert loaded.tables["mem"]["b"].tolist() == [1, 2, 3]
    assert loaded.snapshots["dev0"].segments[0].address == 1
    assert loaded.unmeasured == ["GPU kernels: no CUDA device"]
    assert loaded.attachments == {"trace.json.gz": b"\x1f\x8b raw"}


def test_newer_format_is_refused_with_advice(tmp_path):
    path = _profile().save(str(tmp_path / "a.tlprof"))
    with zipfile.ZipFile(path) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    manifest = json.loads(files["manifest.json"])
    manifest["format_version"] = FORMAT_VERSION + 1
    files["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for n, data in files.items():
            zf.writestr(n, data)
    with pytest.raises(FormatVersionError, match="Upgrade torchlens"):
        load_profile(path)


def test_older_manifest_missing_keys_loads(tmp_path):
    path = tmp_path / "old.tlprof"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("manifest.json", json.dumps({"format": "torchlens-profile",
                                                 "format_version": 1, "kind": "trace"}))
    p = load_profile(path)
    assert p.kind == "trace" and p.traces == {} and p.unmeasured == []


@pytest.mark.parametrize("content", [b"", b"not a zip", b"PK\x03\x04broken"])
def test_bad_files_give_clear_errors(tmp_path, content):
    path = tmp_path / "bad.tlprof"
    path.write_bytes(content)
    with pytest.raises(InputError, match="bad.tlprof"):
        load_profile(path)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_profile(tmp_path / "nope.tlprof")

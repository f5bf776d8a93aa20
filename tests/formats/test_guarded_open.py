"""Every file torchlens reads goes through one guarded open (``formats.input_files``):
a file handed over cannot fill memory, stall a read, make torchlens show another
file's bytes or allocate for a count it merely declares. Each refusal is one
line naming the file, what was wrong, the bound and how to raise it; a damaged
field or line is named and skipped, the rest is read."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import resource
import shutil
import signal
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import torchlens
from torchlens.formats.input_files import read_capped
from torchlens.formats.kineto import load_trace
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    Manifest,
    ManifestError,
    RankEntry,
    load_manifest,
    write_manifest,
)
from torchlens.formats.run_folder.records import damaged, read_steps, write_steps
from torchlens.formats.run_folder.sources import discover
from torchlens.frontends.cli.main import main
from torchlens.model import InputError
from torchlens.model.records import StepRecord

DATA = Path(__file__).resolve().parents[1] / "data" / "cuda"
TRACE = DATA / "cuda_torchprof.json.gz"


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("torchlens: error: ")
    assert "Traceback" not in err[0]
    return err[0]


class _StillReading(BaseException):
    """Raised by the alarm: a BaseException, so no reader's ``except`` takes it."""


@contextlib.contextmanager
def _at_most(seconds: int, extra_memory: int = 2 << 30) -> Iterator[None]:
    """Fail rather than read forever or fill the machine: an alarm after
    ``seconds`` and an address-space limit ``extra_memory`` above what the
    process maps now (the old readers blocked on a FIFO and allocated 7.5 GB)."""
    def late(*_: object) -> None:
        raise _StillReading(f"still reading after {seconds} s")

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as fh:
        used = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmSize:"))
    limit = used + extra_memory
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------ 1. a gzip bomb
def _bomb(path: Path, inflated: int) -> Path:
    """A gzip file of a few KB whose JSON is ``inflated`` bytes (blanks in a trace)."""
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [')
        blank = b" " * (1 << 20)
        for _ in range(inflated >> 20):
            fh.write(blank)
        fh.write(b"]}")
    return path


def test_a_gzip_bomb_is_refused_at_the_cap_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCHLENS_MAX_INFLATED", "4M")
    path = _bomb(tmp_path / "rank0.json.gz", 64 << 20)
    assert path.stat().st_size < 256 << 10
    t0 = time.monotonic()
    with _at_most(30):
        assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
        line = _one_error_line(capsys)
        with pytest.raises(InputError) as exc:
            torchlens.load(path)
        with pytest.raises(InputError) as direct:
            load_trace(path)
    assert time.monotonic() - t0 < 10  # stopped at the cap, not after inflating it all
    for said in (line, str(exc.value), str(direct.value)):
        assert "rank0.json.gz" in said and "refused" in said
        assert "larger than 4.0 MiB" in said  # which cap
        assert "TORCHLENS_MAX_INFLATED=" in said  # how to raise it
        assert "\n" not in said
    # the same bound when the file is one of a folder's: named, the rest still read
    run = tmp_path / "run"
    run.mkdir()
    shutil.move(str(path), run / path.name)
    shutil.copy(TRACE, run / "rank1.json.gz")
    with _at_most(60):
        res = torchlens.load(run)
    bad = [p for p in res.problems if p.path.endswith("rank0.json.gz")]
    assert len(bad) == 1 and "refused" in bad[0].message  # the cap or the ratio bound
    assert res.ranks == [1]


def test_raising_the_cap_reads_the_file(tmp_path, monkeypatch):
    path = _bomb(tmp_path / "t.json.gz", 8 << 20)
    monkeypatch.setenv("TORCHLENS_MAX_INFLATED", "4M")
    with pytest.raises(InputError, match="larger than 4.0 MiB"):
        load_trace(path)
    monkeypatch.setenv("TORCHLENS_MAX_INFLATED", "16M")
    with pytest.raises(InputError, match="the trace has no events"):  # read, then judged
        load_trace(path)


# ------------------------------------------------- 2. regular files only
def test_a_fifo_named_as_a_trace_is_refused_not_read_forever(tmp_path, capsys):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    with _at_most(20):
        assert main(["report", str(fifo), "-o", str(tmp_path / "r.html")]) == 2
        line = _one_error_line(capsys)
        with pytest.raises(InputError, match="FIFO"):
            load_trace(fifo)
        with pytest.raises(InputError, match="FIFO"):
            torchlens.load(fifo)
    assert "trace.json" in line and "a FIFO (named pipe), not a regular file" in line


def test_a_device_named_as_a_file_is_refused(tmp_path, capsys):
    with _at_most(20):
        with pytest.raises(InputError, match="/dev/zero: refused: a character device"):
            torchlens.load("/dev/zero")
        with pytest.raises(InputError, match="a character device"):
            load_trace("/dev/zero")
        link = tmp_path / "snap.pickle"
        link.symlink_to("/dev/zero")
        assert main(["report", str(link), "-o", str(tmp_path / "r.html")]) == 2
    assert "a character device, not a regular file" in _one_error_line(capsys)


# ------------------------------------------ 3. a link out of a run folder
SECRET = b"SECRET-7f3a not a trace, the user's private file"


def _run_folder(tmp_path: Path, link_target: Path) -> Path:
    """A torchlens run folder whose rank 0 trace is a link to ``link_target``."""
    run = tmp_path / "run"
    for r in (0, 1):
        (run / f"rank{r}").mkdir(parents=True)
    (run / "rank0" / "step00001.pt.trace.json").symlink_to(link_target)
    shutil.copy(TRACE, run / "rank1" / "step00001.pt.trace.json.gz")
    write_manifest(str(run), Manifest(source=SOURCE_RUN, world_size=2, ranks=[
        RankEntry(rank=0, traces=["rank0/step00001.pt.trace.json"]),
        RankEntry(rank=1, traces=["rank1/step00001.pt.trace.json.gz"])]))
    return run


def test_a_link_out_of_a_run_folder_is_refused_and_its_target_never_shown(tmp_path, capsys):
    secret = tmp_path / "private.txt"
    secret.write_bytes(SECRET)
    run = _run_folder(tmp_path, secret)
    out = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text()
    assert "SECRET" not in page
    res = torchlens.load(run)
    said = [p for p in res.problems if p.path.endswith("rank0/step00001.pt.trace.json")]
    assert len(said) == 1
    assert said[0].message.startswith("refused: a link to ") and \
        "outside the run folder" in said[0].message
    assert "TORCHLENS_LINK_TARGETS=" in said[0].message  # how to allow such a link
    assert "SECRET" not in said[0].message
    assert res.ranks == [1]
    assert main(["analyze", str(run), "--json", "--workers", "1"]) == 0
    assert "SECRET" not in capsys.readouterr().out


def test_a_manifest_path_out_of_the_folder_is_refused(tmp_path):
    secret = tmp_path / "private.json"
    secret.write_bytes(SECRET)
    run = tmp_path / "run"
    (run / "rank0").mkdir(parents=True)
    write_manifest(str(run), Manifest(source=SOURCE_RUN, world_size=1, ranks=[
        RankEntry(rank=0, traces=["../private.json"])]))
    found = discover(str(run))
    assert not found.ranks
    assert any("refused" in p.message and "private.json" in p.path for p in found.problems)
    assert not any("SECRET" in p.message for p in found.problems)


def test_a_run_folder_may_link_into_an_allowed_store(tmp_path, monkeypatch):
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(TRACE, store / "t.json.gz")
    run = tmp_path / "run"
    (run / "rank0").mkdir(parents=True)
    (run / "rank0" / "step00001.pt.trace.json.gz").symlink_to(store / "t.json.gz")
    write_manifest(str(run), Manifest(source=SOURCE_RUN, world_size=1, ranks=[
        RankEntry(rank=0, traces=["rank0/step00001.pt.trace.json.gz"])]))
    monkeypatch.setenv("TORCHLENS_LINK_TARGETS", "")
    assert not discover(str(run)).ranks
    monkeypatch.setenv("TORCHLENS_LINK_TARGETS", str(store))
    assert [r.rank for r in discover(str(run)).ranks] == [0]


# ------------------------------------------- 4. a declared world size
def test_a_manifest_world_size_of_a_trillion_is_refused_before_allocating(tmp_path):
    run = _run_folder(tmp_path, tmp_path / "missing.json")
    doc = json.loads((run / "manifest.json").read_text())
    doc["world_size"] = 10**12
    (run / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError) as exc:
        load_manifest(str(run / "manifest.json"))
    assert "world_size 1000000000000 is above the largest believed (1,048,576)" in str(exc.value)
    assert "TORCHLENS_MAX_WORLD_SIZE=1000000000000" in str(exc.value)
    with _at_most(60):
        found = discover(str(run))
    assert [r.rank for r in found.ranks] == [1]  # placed by its folder instead
    assert any("TORCHLENS_MAX_WORLD_SIZE" in p.message for p in found.problems)


def test_a_trace_world_size_of_a_trillion_is_named_and_not_used(tmp_path):
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    doc["distributedInfo"] = {"rank": 3, "world_size": 10**12}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    with _at_most(60):
        found = discover(str(tmp_path))
    assert [(r.rank, r.world_size) for r in found.ranks] == [(3, None)]
    said = [p for p in found.problems if p.kind == "world size"]
    assert len(said) == 1 and "TORCHLENS_MAX_WORLD_SIZE" in said[0].message
    assert any("ranks 0-2 below rank 3" in p.message for p in found.problems)


def test_a_trace_rank_of_a_trillion_is_named_and_left_out(tmp_path):
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    doc["distributedInfo"] = {"rank": 10**12}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    with _at_most(60):
        found = discover(str(tmp_path))
    assert not found.ranks
    assert any(p.kind == "no rank" and "1000000000000" in p.message for p in found.problems)


# --------------------------- 5. no traceback for any value of any field
def test_a_saved_result_with_created_at_1e400_renders_and_names_it(tmp_path, capsys):
    src = tmp_path / "a.tlprof"
    shutil.copy(DATA / "cuda_torchprof.tlprof", src)
    bad = tmp_path / "bad.tlprof"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "manifest.json":
                doc = json.loads(data)
                doc["created_at"] = "@@"
                data = json.dumps(doc).replace('"@@"', "1e400").encode()
            zout.writestr(item, data)
    out = tmp_path / "r.html"
    assert main(["report", str(bad), "-o", str(out)]) == 0
    page = out.read_text()
    assert "created_at (float inf) is not a usable value and was left out" in page


@pytest.mark.parametrize("field", ["created_at", "wall_time_s"])
@pytest.mark.parametrize("value", ["1e400", "-1e400", "NaN", "1" + "0" * 400, "-5"])
def test_no_number_in_a_saved_result_is_a_traceback(tmp_path, capsys, field, value):
    bad = tmp_path / "bad.tlprof"
    with zipfile.ZipFile(DATA / "cuda_torchprof.tlprof") as zin, \
            zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "manifest.json":
                doc = json.loads(data)
                doc[field] = "@@"
                data = json.dumps(doc).replace('"@@"', value).encode()
            zout.writestr(item, data)
    assert main(["report", str(bad), "-o", str(tmp_path / "r.html")]) == 0
    assert f"{field} (" in (tmp_path / "r.html").read_text()


def test_a_deeply_nested_step_line_is_skipped_and_counted(tmp_path):
    run = str(tmp_path)
    write_steps(run, 0, [StepRecord(step=i, t0=float(i), t1=i + 0.5) for i in range(3)])
    path = tmp_path / "rank0" / "steps.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    deep = b'{"step": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    path.write_bytes(lines[0] + deep + b"".join(lines[1:]))
    steps = read_steps(run, 0)
    assert [s.step for s in steps] == [0, 1, 2]
    assert damaged(run, 0) == 1


def test_an_endless_step_line_is_skipped_without_holding_it(tmp_path, monkeypatch):
    monkeypatch.setattr("torchlens.formats.input_files.MAX_LINE_BYTES", 1 << 16)
    run = str(tmp_path)
    write_steps(run, 0, [StepRecord(step=i, t0=float(i), t1=i + 0.5) for i in range(2)])
    path = tmp_path / "rank0" / "steps.jsonl"
    with open(path, "ab") as fh:
        fh.write(b'{"step": "' + b"x" * (1 << 20) + b'"}\n')
        fh.write(StepRecord(step=2, t0=2.0, t1=2.5).to_json().encode() + b"\n")
    assert [s.step for s in read_steps(run, 0)] == [0, 1, 2]
    assert damaged(run, 0) == 1


# ------------------------------------------------------ the guarded open itself
def test_read_capped_refuses_a_larger_file_and_a_link_when_private(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(InputError, match=r"big\.json: refused: larger than 1.0 KiB"):
        read_capped(big, 1024)
    link = tmp_path / "link.json"
    link.symlink_to(big)
    assert read_capped(link, 4096) == b"x" * 2048
    with pytest.raises(InputError, match="a link"):
        read_capped(link, 4096, private=True)


def test_a_saved_result_that_inflates_past_the_cap_is_refused(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bomb.tlprof"
    with zipfile.ZipFile(DATA / "cuda_torchprof.tlprof") as zin, \
            zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item, zin.read(item.filename))
        zout.writestr("attachments/zeros", b"\0" * (32 << 20))
    assert bad.stat().st_size < 1 << 20
    monkeypatch.setenv("TORCHLENS_MAX_INFLATED", "8M")
    assert main(["report", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    line = _one_error_line(capsys)
    assert "bomb.tlprof: refused: its members inflate to" in line
    assert "more than 8.0 MiB" in line and "TORCHLENS_MAX_INFLATED=" in line
    monkeypatch.setenv("TORCHLENS_MAX_INFLATED", "64M")
    assert main(["report", str(bad), "-o", str(tmp_path / "r.html")]) == 0


def _tlprof_bomb(path: Path, inflated: int) -> Path:
    """A real saved result whose manifest lists one more attachment: ``inflated``
    zero bytes that deflate to a few hundred KB (the loader reads every one listed)."""
    with zipfile.ZipFile(DATA / "cuda_torchprof.tlprof") as zin, \
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout:
        manifest = json.loads(zin.read("manifest.json"))
        n = len(manifest.get("attachments", []))
        manifest["attachments"] = [*manifest.get("attachments", []), "zeros"]
        for item in zin.infolist():
            if item.filename != "manifest.json":
                zout.writestr(item, zin.read(item.filename))
        zout.writestr("manifest.json", json.dumps(manifest))
        with zout.open(f"attachments/{n}", "w") as fh:
            for _ in range(inflated >> 20):
                fh.write(bytes(1 << 20))
    return path


def test_a_saved_result_loaded_directly_is_bounded_like_the_command_line(tmp_path,
                                                                          monkeypatch):
    """``torchlens.model.load_profile`` and ``Profile.load`` (no command line, no
    ``torchlens.load``) refuse a ``.tlprof`` whose members inflate past the cap
    before reading any, and a FIFO named as one instead of waiting on it."""
    from torchlens.model import Profile, load_profile

    bad = _tlprof_bomb(tmp_path / "bomb.tlprof", 64 << 20)
    assert bad.stat().st_size < 1 << 20
    monkeypatch.setenv("TORCHLENS_MAX_INFLATED", "8M")
    for load in (load_profile, Profile.load):
        with _at_most(20, extra_memory=1 << 30), pytest.raises(InputError) as refused:
            load(bad)
        line = str(refused.value)
        assert line.startswith(f"{bad}: refused: its members inflate to ") and "\n" not in line
        assert "more than 8.0 MiB" in line and "TORCHLENS_MAX_INFLATED=" in line
    monkeypatch.setenv("TORCHLENS_MAX_INFLATED", "128M")
    assert len(load_profile(bad).attachments["zeros"]) == 64 << 20  # within the cap: read
    fifo = tmp_path / "result.tlprof"
    os.mkfifo(fifo)
    with _at_most(20), pytest.raises(InputError, match="a FIFO .named pipe., not a regular"):
        load_profile(fifo)


def test_the_live_feed_skips_a_nested_line_and_refuses_a_fifo(tmp_path):
    from torchlens.capture.ranks.feed import FileFeed

    (tmp_path / "live.jsonl").write_bytes(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    feed = FileFeed(str(tmp_path))
    assert feed.read() == [] and feed.bad == 1
    fifo = tmp_path / "f"
    fifo.mkdir()
    os.mkfifo(fifo / "live.jsonl")
    with _at_most(20):
        assert FileFeed(str(fifo)).read() == []


def test_a_gzip_bomb_is_refused_by_its_ratio_under_the_default_cap(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.delenv("TORCHLENS_MAX_INFLATED", raising=False)
    monkeypatch.delenv("TORCHLENS_MAX_RATIO", raising=False)
    path = _bomb(tmp_path / "t.json.gz", 256 << 20)
    t0 = time.monotonic()
    with _at_most(30):
        assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    assert time.monotonic() - t0 < 10
    line = _one_error_line(capsys)
    assert "t.json.gz: refused: it inflates more than 100 times its size" in line
    assert "TORCHLENS_MAX_RATIO=1000" in line
    monkeypatch.setenv("TORCHLENS_MAX_RATIO", "0")  # no bound: read, then judged
    with pytest.raises(InputError, match="the trace has no events"):
        load_trace(path)


def test_analyze_refuses_a_bomb_near_the_floor_not_after_ratio_times_the_file(
        tmp_path: Path) -> None:
    """A 4 MB gzip of 1 GiB of zeros in a folder ``analyze`` reads: refused once
    100 x the first MiB read came out, not after 100 x the whole 4 MB file."""
    import re
    import zlib

    from torchlens.formats.kineto.peek import read_json

    path = tmp_path / "rank0.pt.trace.json.gz"
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    zeros = bytes(8 << 20)
    with open(path, "wb") as fh:
        for _ in range(128):
            fh.write(comp.compress(zeros))
        fh.write(comp.flush())
    assert path.stat().st_size > 3 << 20
    data, verdict = read_json(path)
    assert data is None and "compression bomb" in verdict.message, verdict
    inflated = re.search(r"\(([\d.]+) MiB from", verdict.message)
    assert inflated is not None and float(inflated.group(1)) < 128, verdict.message

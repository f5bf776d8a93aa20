"""Finding a run's per-rank traces (``formats.run_folder.sources.discover``) and naming
everything wrong with the input, as a user of ``torchlens report RUN_DIR`` reads it."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from torchlens.capture.ddp.launcher import DdpOptions, write_run_folder
from torchlens.capture.ddp.options import DdpJob, ProfileSpec
from torchlens.formats.kineto.peek import peek
from torchlens.formats.run_folder.manifest import (
    SOURCE_DDP_CHECK,
    VERSION,
    Manifest,
    read_manifest,
)
from torchlens.formats.run_folder.sources import RankFile, discover, rank_from_name

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ helpers


def _event(i: int) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1,
            "ts": 1000 + 10 * i, "dur": 5.0,
            "args": {"External id": i, "Input Dims": [[8, 64], [64, 64]],
                     "Input type": ["float", "float"]}}


def trace_bytes(rank: int | None = None, world: int | None = None, *, events: int = 3,
                info_at: str = "head", info: dict | None = None) -> bytes:
    """A minimal Kineto trace laid out as torch writes it: small members, the events,
    then ``traceName``; ``info_at="tail"`` puts distributedInfo after the events as
    other writers do."""
    if info is None and rank is not None:
        info = {"backend": "gloo", "rank": rank}
        if world is not None:
            info["world_size"] = world
    head = {"schemaVersion": 1, "deviceProperties": []}
    tail = {"traceName": "t.pt.trace.json"}
    if info is not None:
        (head if info_at == "head" else tail)["distributedInfo"] = info
    body = ",\n  ".join(json.dumps(_event(i)) for i in range(events))
    return ("{\n" + "".join(f'  "{k}": {json.dumps(v)},\n' for k, v in head.items())
            + '  "traceEvents": [\n  ' + body + "\n  ]"
            + "".join(f',\n  "{k}": {json.dumps(v)}' for k, v in tail.items())
            + "\n}\n").encode()


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def kinds(result) -> list[tuple[str, str]]:
    return [(p.kind, Path(p.path).name) for p in result.problems]


def the(result, kind: str):
    found = [p for p in result.problems if p.kind == kind]
    assert len(found) == 1, result.problems
    return found[0]


# ------------------------------------------------------ real traces, both layouts


def test_shared_sampled_ranks(traces_dir, tmp_path):
    """HTA's two sampled ranks of a 128-rank job: both placed by distributedInfo,
    and the 126 ranks not there are named as one range."""
    for r in (0, 1):
        (tmp_path / f"sampled_rank-{r}.json.gz").symlink_to(
            traces_dir / f"sampled_rank-{r}.json.gz")
    run = discover(tmp_path)
    assert [(r.rank, r.source, r.world_size) for r in run.ranks] == [
        (0, "distributedInfo", 128), (1, "distributedInfo", 128)]
    assert [Path(r.paths[0]).name for r in run.ranks] == [
        "sampled_rank-0.json.gz", "sampled_rank-1.json.gz"]
    assert run.world_size == 128 and run.root == str(tmp_path)
    missing = the(run, "missing rank")
    assert missing.path == str(tmp_path)
    assert "ranks 2-127 of world size 128" in missing.message
    assert kinds(run) == [("missing rank", tmp_path.name)]


_RANK_SCRIPT = """
import os, sys, torch, torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import profile, ProfilerActivity

def rank_main(rank, run_dir, world):
    dist.init_process_group("gloo", init_method="file://" + os.path.join(run_dir, "store"),
                            rank=rank, world_size=world)
    model = torch.nn.Linear(16, 16)
    os.makedirs(os.path.join(run_dir, f"rank{rank}"), exist_ok=True)
    for step in (3, 12):  # as the stepper names them: rank<r>/step<NNNNN>.pt.trace.json
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            x = model(torch.randn(4, 16))
            dist.all_reduce(x)
        prof.export_chrome_trace(
            os.path.join(run_dir, f"rank{rank}", f"step{step:05d}.pt.trace.json"))
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.start_processes(rank_main, args=(sys.argv[1], 2), nprocs=2, start_method="fork")
    os.remove(os.path.join(sys.argv[1], "store"))
"""


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory) -> Path:
    """A torchlens run folder of 2 gloo ranks x 2 profiled steps, the traces
    exported by this machine's torch.profiler and the manifest by torchlens."""
    run_dir = tmp_path_factory.mktemp("run")
    script = run_dir.parent / "ranks.py"
    script.write_text(_RANK_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    write_run_folder(str(run_dir), DdpJob(kind="function", backend="gloo"),
                     DdpOptions(world_size=2, profile=ProfileSpec(every=5)), [None, None],
                     [[], []])
    return run_dir


def test_torch_run_folder(torch_run):
    run = discover(torch_run)
    assert run.problems == []
    assert run.world_size == 2
    assert run.ranks == [
        RankFile(r, [str(torch_run / f"rank{r}" / f"step{s:05d}.pt.trace.json")
                     for s in (3, 12)], 2, "manifest")
        for r in (0, 1)]


def test_ddp_check_writes_the_typed_manifest(torch_run):
    """%ddp_check --profile's folder carries the one Manifest type (as torchlens run's
    does, tests/ranks/test_watch_feed.py), version 2, with its source."""
    manifest = read_manifest(str(torch_run))
    assert isinstance(manifest, Manifest)
    assert (manifest.version, manifest.source, manifest.backend) == (
        VERSION, SOURCE_DDP_CHECK, "gloo")
    # every --profile figure but the folder, as a real run writes them
    assert msgspec.to_builtins(manifest.profile) == {"every": 5, "budget": 0.03, "window_s": 1.0,
                                "max_steps": None, "keep": 50} and manifest.run_id is None
    # one machine: every rank on node 0, as torchlens run writes it (was null)
    assert [e.node for e in manifest.ranks] == [0, 0]
    assert [e.traces for e in manifest.ranks] == [
        [f"rank{r}/step{s:05d}.pt.trace.json" for s in (3, 12)] for r in (0, 1)]


def test_torch_writes_distributed_info_in_the_head(torch_run):
    """torch's export puts distributedInfo before traceEvents, so the peek finds the
    rank in the first KB; the rank and world size are the process group's."""
    for r in (0, 1):
        path = torch_run / f"rank{r}" / "step00003.pt.trace.json"
        data = path.read_bytes()
        assert 0 < data.index(b'"distributedInfo"') < data.index(b'"traceEvents"') < 4096
        info = peek(path).members["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (r, 2, "gloo")


def test_torch_traces_by_distributed_info_without_the_manifest(torch_run, tmp_path):
    """Traces copied out of the run folder under names that say nothing: their
    distributedInfo still places them."""
    files = []
    for r in (1, 0):
        files.append(tmp_path / f"copy{r}.json")
        files[-1].write_bytes((torch_run / f"rank{r}" / "step00012.pt.trace.json").read_bytes())
    run = discover(files)
    assert [(r.rank, r.paths, r.source, r.world_size) for r in run.ranks] == [
        (0, [str(files[1])], "distributedInfo", 2), (1, [str(files[0])], "distributedInfo", 2)]
    assert run.problems == [] and run.root == str(tmp_path)


# --------------------------------------------------------- torchlens run folders


def _run_folder(root: Path, world: int, steps: dict[int, list[int]], gz: bool = False,
                manifest: bool = True) -> dict[int, list[Path]]:
    written: dict[int, list[Path]] = {}
    for rank, numbers in steps.items():
        for s in numbers:
            written.setdefault(rank, []).append(
                write(root / f"rank{rank}" / f"step{s}.pt.trace.json",
                      trace_bytes(rank, world), gz))
    if manifest:
        (root / "manifest.json").write_text(json.dumps({
            "format": "torchlens-run", "version": 1, "world_size": world,
            "ranks": [{"rank": r, "traces": sorted(str(p.relative_to(root)) for p in ps)}
                      for r, ps in written.items()]}))
    return written


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_run_folder_groups_steps_in_step_order(tmp_path, gz):
    # step10 sorts before step2 as text; the steps must come in step order
    files = _run_folder(tmp_path, 2, {0: [10, 2, 100], 1: [2]}, gz=gz)
    run = discover(tmp_path)
    assert run.problems == [] and run.world_size == 2
    assert [(r.rank, [Path(p).name.split(".")[0] for p in r.paths], r.source)
            for r in run.ranks] == [(0, ["step2", "step10", "step100"], "manifest"),
                                    (1, ["step2"], "manifest")]
    assert run.ranks[0].paths[0] == str(files[0][1])


def test_run_folder_without_manifest_is_placed_by_folder(tmp_path):
    """A run cut off before its manifest was written: rank<r>/ folders still say
    the rank (the traces here have no distributedInfo), steps are not duplicates."""
    for rank in (0, 1):
        for s in (1, 2):
            write(tmp_path / f"rank{rank}" / f"step{s:05d}.pt.trace.json", trace_bytes())
    run = discover(tmp_path)
    assert [(r.rank, len(r.paths), r.source) for r in run.ranks] == [
        (0, 2, "file name"), (1, 2, "file name")]
    assert run.problems == [] and run.world_size is None


def test_a_running_folders_live_feed_is_not_a_trace(tmp_path):
    """``torchlens run``'s live status (``live.json`` beside ``live.jsonl``) is
    skipped, with or without the manifest; a lone ``live.json`` is looked at."""
    for rank in (0, 1):
        write(tmp_path / f"rank{rank}" / "step00001.pt.trace.json", trace_bytes())
    (tmp_path / "live.json").write_text('{"format": "torchlens-live", "version": 1}')
    (tmp_path / "live.jsonl").write_text('{"seq": 0}\n')
    run = discover(tmp_path)
    assert run.problems == [] and [r.rank for r in run.ranks] == [0, 1]
    (tmp_path / "live.jsonl").unlink()
    assert [p.kind for p in discover(tmp_path).problems] == ["not a trace"]


def test_run_folder_bad_step_and_missing_rank(tmp_path):
    """One step cut short, one listed trace gone, one rank with nothing: each named,
    the good steps kept."""
    files = _run_folder(tmp_path, 3, {0: [1, 2], 1: [1], 2: [1]})
    files[0][1].write_bytes(files[0][1].read_bytes()[:300])
    files[1][0].unlink()
    files[2][0].write_text('{"segments": [], "device_traces": []}')
    run = discover(tmp_path)
    assert [(r.rank, [Path(p).name for p in r.paths]) for r in run.ranks] == [
        (0, ["step1.pt.trace.json"])]
    assert kinds(run) == [("unreadable", "step1.pt.trace.json"),
                          ("truncated", "step2.pt.trace.json"),
                          ("not a trace", "step1.pt.trace.json"),
                          ("missing rank", tmp_path.name)]
    assert "manifest.json lists it for rank 1, but it is not there" in run.problems[0].message
    assert run.problems[1].path == str(files[0][1])
    assert "allocator memory snapshot" in run.problems[2].message
    assert "ranks 1-2 of world size 3 have no usable trace" in run.problems[3].message


def test_stray_trace_in_a_run_folder_is_the_duplicate(tmp_path):
    _run_folder(tmp_path, 2, {0: [1], 1: [1]})
    stray = write(tmp_path / "a_copy.json", trace_bytes(0, 2))  # sorts before rank0/
    run = discover(tmp_path)
    dup = the(run, "duplicate rank")
    assert dup.path == str(stray)
    assert str(tmp_path / "rank0" / "step1.pt.trace.json") in dup.message
    assert run.ranks[0].paths == [str(tmp_path / "rank0" / "step1.pt.trace.json")]


def test_manifest_and_trace_disagree_on_world_size(tmp_path):
    files = _run_folder(tmp_path, 2, {0: [1], 1: [1]})
    files[1][0].write_bytes(trace_bytes(1, 4))
    run = discover(tmp_path)
    assert run.world_size == 2
    problem = the(run, "world size")
    assert problem.path == str(files[1][0])
    assert "says world size 4" in problem.message and "manifest.json" in problem.message


def test_broken_manifest_is_named_and_the_traces_still_placed(tmp_path):
    _run_folder(tmp_path, 2, {0: [1], 1: [1]})
    (tmp_path / "manifest.json").write_text('{"format": "torchlens-run", "ranks": [')
    run = discover(tmp_path)
    assert [(r.rank, r.source) for r in run.ranks] == [
        (0, "distributedInfo"), (1, "distributedInfo")]
    assert kinds(run) == [("unreadable", "manifest.json")]


# ------------------------------------------------------------- bad input, each


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_not_a_trace(tmp_path, gz):
    write(tmp_path / "rank0.json", trace_bytes(0, 2), gz)
    write(tmp_path / "rank1.json", trace_bytes(1, 2), gz)
    write(tmp_path / "config.json", b'{"lr": 0.1, "model": "resnet"}', gz)
    write(tmp_path / "notes.json", b"these are my notes, not JSON", gz)
    write(tmp_path / "timeline.json", b"[[-1, 1, 37888, 7], [-1, 1, 512, 7]]", gz)
    write(tmp_path / "empty.json", b"", gz)
    run = discover(tmp_path)
    assert [r.rank for r in run.ranks] == [0, 1] and run.world_size == 2
    ext = ".json.gz" if gz else ".json"
    assert kinds(run) == [("not a trace", "config" + ext), ("not a trace", "empty" + ext),
                          ("not a trace", "notes" + ext), ("not a trace", "timeline" + ext)]
    config, empty, notes, timeline = (p.message for p in run.problems)
    assert "without a traceEvents list (top-level keys: lr, model)" in config
    assert "empty" in empty
    assert "not JSON" in notes
    assert "JSON list of rows" in timeline


@pytest.mark.parametrize("where", ["events", "head", "after events"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip-of-cut-json"])
def test_truncated_json(tmp_path, where, gz):
    whole = trace_bytes(1, 2, events=2000)
    cut = {"events": len(whole) // 2, "head": 40,
           "after events": whole.index(b'"traceName"') + 5}[where]
    write(tmp_path / "rank0.json", trace_bytes(0, 2), gz)
    bad = write(tmp_path / "rank1.json", whole[:cut], gz)
    run = discover(tmp_path)
    problem = run.problems[0]
    assert (problem.kind, problem.path) == ("truncated", str(bad))
    assert "cut short" in problem.message
    assert [r.rank for r in run.ranks] == [0]
    assert kinds(run)[1:] == [("missing rank", tmp_path.name)]


def test_truncated_gzip_stream(tmp_path):
    data = gzip.compress(trace_bytes(1, 2, events=5000))
    write(tmp_path / "rank0.json.gz", gzip.compress(trace_bytes(0, 2)))
    bad = write(tmp_path / "rank1.json.gz", data[: len(data) * 2 // 3])
    run = discover(tmp_path)
    problem = run.problems[0]
    assert (problem.kind, problem.path) == ("truncated", str(bad))
    assert "gzip stream stops early" in problem.message
    # where it stops: the compressed bytes there were (the whole cut file)
    assert f"after {bad.stat().st_size} compressed bytes" in problem.message


def test_damaged_gzip_is_unreadable(tmp_path):
    data = bytearray(gzip.compress(trace_bytes(0, 1, events=500)))
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
    bad = write(tmp_path / "rank0.json.gz", bytes(data))
    run = discover(tmp_path)
    assert kinds(run)[0] == ("unreadable", "rank0.json.gz")
    assert run.problems[0].path == str(bad) and "damaged gzip" in run.problems[0].message


def test_duplicate_rank_keeps_the_first_in_path_order(tmp_path):
    first = write(tmp_path / "a" / "trace.json", trace_bytes(0, 2))
    second = write(tmp_path / "b" / "trace.json", trace_bytes(0, 2))
    write(tmp_path / "b" / "other.json", trace_bytes(1, 2))
    run = discover(tmp_path)
    assert [(r.rank, r.paths) for r in run.ranks][0] == (0, [str(first)])
    dup = the(run, "duplicate rank")
    assert dup.path == str(second)
    assert f"as {first} does" in dup.message and f"{first} is kept" in dup.message
    assert "rank 0" in dup.message


def test_world_sizes_that_differ(tmp_path):
    write(tmp_path / "r0.json", trace_bytes(0, 4))
    write(tmp_path / "r1.json", trace_bytes(1, 4))
    odd = write(tmp_path / "r2.json", trace_bytes(2, 8))
    run = discover(tmp_path)
    assert run.world_size == 4 and [r.rank for r in run.ranks] == [0, 1, 2]
    problem = the(run, "world size")
    assert problem.path == str(odd)
    assert "says world size 8" in problem.message
    assert "r0.json" in problem.message and "r1.json" in problem.message
    assert "rank 3 of world size 4 has no usable trace" in the(run, "missing rank").message


def test_rank_beyond_the_world_size(tmp_path):
    write(tmp_path / "r0.json", trace_bytes(0, 2))
    write(tmp_path / "r1.json", trace_bytes(1, 2))
    far = write(tmp_path / "r5.json", trace_bytes(5, 2))
    run = discover(tmp_path)
    problem = the(run, "world size")
    assert problem.path == str(far) and "rank 5, outside world size 2" in problem.message


def test_missing_ranks_without_a_world_size(tmp_path):
    for r in (0, 2, 5):
        write(tmp_path / f"rank{r}.json", trace_bytes())
    run = discover(tmp_path)
    assert [(r.rank, r.source) for r in run.ranks] == [
        (0, "file name"), (2, "file name"), (5, "file name")]
    assert run.world_size is None
    assert "ranks 1, 3-4 below rank 5" in the(run, "missing rank").message


def test_no_rank(tmp_path):
    write(tmp_path / "rank0.json", trace_bytes(0, 2))
    write(tmp_path / "rank1.json", trace_bytes(1, 2))
    nameless = write(tmp_path / "host_4242.1712345678.pt.trace.json", trace_bytes())
    run = discover(tmp_path)
    problem = the(run, "no rank")
    assert problem.path == str(nameless) and "distributedInfo.rank" in problem.message
    assert [r.rank for r in run.ranks] == [0, 1]


def test_hostile_input_never_raises(tmp_path):
    """Deep nesting, a manifest of the wrong shapes, checkpoints copies: named or
    skipped, never a traceback. The typed manifest names its wrong field (the
    traces are then placed as without a manifest)."""
    write(tmp_path / "deep.json", b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    (tmp_path / "manifest.json").write_text(
        '{"format": "torchlens-run", "ranks": 5, "world_size": "two"}')
    write(tmp_path / "rank0" / "step1.pt.trace.json", trace_bytes(0, 1))
    write(tmp_path / ".ipynb_checkpoints" / "rank0-checkpoint.json", trace_bytes(0, 1))
    run = discover(tmp_path)
    assert [(r.rank, r.source, r.world_size) for r in run.ranks] == [
        (0, "distributedInfo", 1)]
    assert kinds(run) == [("unreadable", "manifest.json"), ("not a trace", "deep.json")]
    assert "Expected `array`, got `int` - at `$.ranks`" in run.problems[0].message
    assert "nested too deeply" in run.problems[1].message


def test_nothing_there(tmp_path):
    assert kinds(discover(tmp_path)) == [("no traces", tmp_path.name)]
    gone = tmp_path / "nope"
    assert kinds(discover(gone)) == [("unreadable", "nope")]


# -------------------------------------------------------------- lists, layouts


def test_list_of_files_keeps_the_given_order(tmp_path):
    """The first file given wins a duplicate; a missing one is named; mixed gz."""
    later = write(tmp_path / "x" / "a.json", trace_bytes(0, 3))
    given_first = write(tmp_path / "y" / "b.json", trace_bytes(0, 3), gz=True)
    one = write(tmp_path / "y" / "c.json", trace_bytes(1, 3))
    gone = tmp_path / "y" / "gone.json"
    run = discover([str(given_first), one, later, gone])
    assert [(r.rank, r.paths) for r in run.ranks] == [(0, [str(given_first)]),
                                                      (1, [str(one)])]
    assert kinds(run) == [("unreadable", "gone.json"), ("duplicate rank", "a.json"),
                          ("missing rank", tmp_path.name)]
    assert run.root == str(tmp_path)
    assert "rank 2 of world size 3" in run.problems[2].message


@pytest.mark.parametrize("name, rank", [
    ("rank3.json", 3), ("RANK7.JSON", 7), ("sampled_rank-0.json.gz", 0),
    ("trace_rank_12.pt.trace.json", 12), ("a100_ddp_resnet_rank0_nccl.json.gz", 0),
    ("worker_5.pt.trace.json", 5), ("trace_4.json.gz", 4),
    ("host_12345.1699999999.pt.trace.json", None), ("frank3.json", None),
    ("rank2/step00001.pt.trace.json", 2), ("run/step00001.pt.trace.json", None),
])
def test_rank_from_name(name, rank):
    assert rank_from_name(name) == rank


def test_distributed_info_after_the_events(tmp_path):
    """Writers that put distributedInfo after traceEvents: the tail gives it."""
    path = write(tmp_path / "t.json", trace_bytes(6, 8, info_at="tail", events=5000), gz=True)
    info = peek(path).members["distributedInfo"]
    assert (info["rank"], info["world_size"]) == (6, 8)


def test_distributed_info_larger_than_the_window(tmp_path):
    """Thousands of process groups make distributedInfo longer than 64 KB; the
    head window grows until the member closes."""
    pgs = [{"pg_name": str(i), "pg_size": 4096, "ranks": list(range(0, 4096, 64))}
           for i in range(200)]
    info = {"backend": "nccl", "rank": 77, "world_size": 4096, "pg_config": pgs}
    for gz, at in ((False, "head"), (True, "head"), (False, "tail")):
        path = write(tmp_path / f"{at}{gz}.json", trace_bytes(info=info, info_at=at), gz)
        assert len(json.dumps(info)) > 64 * 1024
        got = peek(path).members["distributedInfo"]
        assert (got["rank"], len(got["pg_config"])) == (77, 200)


def test_chrome_bare_array_trace(tmp_path):
    events = json.dumps([_event(i) for i in range(3)]).encode()
    write(tmp_path / "rank0.json", events)
    cut = write(tmp_path / "rank1.json", events[:-30])
    run = discover(tmp_path)
    assert [(r.rank, r.source) for r in run.ranks] == [(0, "file name")]
    assert (run.problems[0].kind, run.problems[0].path) == ("truncated", str(cut))


# ------------------------------------------------------------------ speed


def test_peek_is_cheap_on_a_large_trace(tmp_path, traces_dir):
    """Benchmark-like: a 50 MB plain trace is placed by reading two 64 KB windows
    (printed, not asserted: timings vary by machine). A gzip file is inflated once,
    never parsed."""
    one = json.dumps(_event(1)).encode()
    n = 50 * 1024 * 1024 // (len(one) + 2)
    head = trace_bytes(3, 4, events=0).split(b'"traceEvents": [')[0] + b'"traceEvents": [\n'
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:
        fh.write(head)
        fh.write(b",\n".join([one] * n))
        fh.write(b'\n],\n  "traceName": "big"\n}\n')
    size = os.path.getsize(path)
    t0 = time.perf_counter()
    run = discover(path)
    plain_s = time.perf_counter() - t0
    assert [(r.rank, r.world_size) for r in run.ranks] == [(3, 4)]
    largest = max(traces_dir.glob("*.json.gz"), key=lambda p: p.stat().st_size)
    t0 = time.perf_counter()
    result = peek(largest)
    gz_s = time.perf_counter() - t0
    assert result.kind is None and "distributedInfo" in result.members
    print(f"\npeek+discover {size / 2**20:.0f} MB plain trace: {plain_s * 1000:.1f} ms; "
          f"peek {largest.name} ({largest.stat().st_size / 2**20:.1f} MB gzip): "
          f"{gz_s * 1000:.1f} ms")

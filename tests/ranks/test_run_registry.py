"""The registry of running ``torchlens run`` jobs that the JupyterLab sidebar lists.

Entries and live.json files are real files in a temporary registry; stale
entries use the pid of a process that really ended, and this process's pid
with another start time (a reused pid).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest, write_manifest
from torchlens.frontends.ranks import registry as reg

from .live_doc import four_rank_view, live_document, slow_rank_view, write_live


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "registry" / "runs"
    monkeypatch.setenv(reg.ENV_DIR, str(folder))
    return folder


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _entry(registry: Path, run_id: str, **kw: object) -> Path:
    """An entry written by hand (another process's), mode 0600."""
    registry.mkdir(parents=True, exist_ok=True, mode=0o700)
    body = {"format": "torchlens-run-entry", "version": 1, "run_id": run_id,
            "run_dir": str(registry.parent / run_id), "collector": "127.0.0.1:1",
            "pid": os.getpid(), "pid_start": None, "host": socket.gethostname(),
            "command": ["torchrun", "train.py"], "started": time.time(), **kw}
    path = registry / f"{run_id}.json"
    path.write_text(json.dumps(body))
    path.chmod(0o600)
    return path


def test_register_lists_the_run_and_unregister_removes_it(registry: Path,
                                                          tmp_path: Path) -> None:
    run_dir = tmp_path / "exp1"
    run_dir.mkdir()
    path = reg.register("8c1f0e27a4b9d3e1", str(run_dir), "127.0.0.1:41233",
                        ["torchrun", "--nproc-per-node", "2", "train.py"])
    assert path == str(registry / "8c1f0e27a4b9d3e1.json")
    assert _mode(registry) == 0o700 and _mode(Path(path)) == 0o600
    assert os.listdir(registry) == ["8c1f0e27a4b9d3e1.json"]  # no temporary file left
    (run,) = reg.live_runs()
    assert run["run_id"] == "8c1f0e27a4b9d3e1" and run["run_dir"] == str(run_dir)
    assert run["command"] == ["torchrun", "--nproc-per-node", "2", "train.py"]
    assert run["pid"] == os.getpid() and run["collector"] == "127.0.0.1:41233"
    assert run["state"] == "starting" and run["live"] is None  # no live.json yet

    write_live(run_dir, live_document(four_rank_view(), "8c1f0e27a4b9d3e1"))
    (run,) = reg.live_runs()
    assert run["state"] == "running"
    live = run["live"]
    # rank 3 on the same node said goodbye (it raised): the node was reachable, rank 2 lost
    assert live["verdict"].startswith("rank 2 was lost: it stopped sending at step 9 (no "
                                      "goodbye, and node 1 (host gpu-b)'s other ranks went on")
    assert live["world_size"] == 4 and live["ended"] is False
    assert [r["state"] for r in live["ranks"]] == ["running", "running", "lost", "failed"]
    assert [r["host"] for r in live["ranks"]] == ["gpu-a", "gpu-a", "gpu-b", "gpu-b"]
    assert live["ranks"][0]["allocated"] == 3 << 30 and live["ranks"][0]["source"] == "cuda"
    assert live["ranks"][1]["rss"] == 101 << 20 and live["ranks"][1]["allocated"] is None
    assert live["ranks"][3]["error"] == "RuntimeError: boom"
    assert live["ranks"][2]["steps"] == 12 and live["ranks"][1]["data_ms"] == pytest.approx(0.4)

    reg.unregister(path)
    assert reg.live_runs() == [] and os.listdir(registry) == []
    reg.unregister(path)  # twice, or with nothing registered: no error
    reg.unregister(None)


def test_registry_dir_is_made_private(registry: Path) -> None:
    registry.mkdir(parents=True, mode=0o755)
    registry.chmod(0o755)
    assert reg.register("a1", "/tmp/x", "h:1", ["true"]) is not None
    assert _mode(registry) == 0o700


def test_default_registry_is_in_the_home_directory(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.delenv(reg.ENV_DIR, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert reg.registry_dir() == str(tmp_path / ".cache" / "torchlens" / "runs")


def test_a_registry_that_cannot_be_written_does_not_stop_the_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(reg.ENV_DIR, str(blocker / "runs"))  # under a regular file
    assert reg.register("a1", "/tmp/x", "h:1", ["true"]) is None
    assert reg.live_runs() == []


def test_stale_entries_are_ignored_and_deleted(registry: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = _entry(registry, "gone", pid=int(done.stdout))  # that process has ended
    # this pid, but another start time: the pid was reused by another program
    reused = _entry(registry, "reused", pid_start=time.time() - 3600)
    alive = _entry(registry, "alive", pid_start=reg.process_start(os.getpid()))
    assert [r["run_id"] for r in reg.live_runs()] == ["alive"]
    assert not gone.exists() and not reused.exists() and alive.exists()


def test_other_hosts_entries_are_skipped_not_deleted(registry: Path) -> None:
    # a home directory shared by several machines: their pids mean nothing here
    other = _entry(registry, "far", host="another-host", pid=2**22 + 7)
    assert reg.live_runs() == [] and other.exists()


def test_garbled_entries_are_skipped_then_cleaned(registry: Path) -> None:
    registry.mkdir(parents=True, mode=0o700)
    garbled = registry / "half.json"
    garbled.write_text('{"format": "torchlens-run-entry", "run_id"')
    wrong = _entry(registry, "nopid", pid="12")
    (registry / ".b1.99.tmp").write_text("{")  # one being written: never read
    assert reg.live_runs() == []
    assert garbled.exists() and wrong.exists()  # young: perhaps still being replaced
    old = time.time() - 2 * reg.GARBLED_AFTER_S
    for p in (garbled, wrong):
        os.utime(p, (old, old))
    assert reg.live_runs() == []
    assert not garbled.exists() and not wrong.exists()
    assert (registry / ".b1.99.tmp").exists()


@pytest.mark.parametrize("content", [
    "", '{"format": "torchlens-live", "ranks": [{"rank": 0', "[1, 2]", "not json",
    '{"format": "something-else", "ranks": []}', '{"format": "torchlens-live"}',
    "\xff\xfe garbage",
])
def test_missing_partial_or_garbled_live_json_is_starting(
        registry: Path, content: str) -> None:
    entry = _entry(registry, "r1")
    run_dir = Path(json.loads(entry.read_text())["run_dir"])
    run_dir.mkdir()
    (run_run := run_dir / "live.json").write_text(content, errors="surrogateescape")
    (run,) = reg.live_runs()
    assert run["state"] == "starting" and run["live"] is None
    run_run.unlink()
    assert reg.live_runs()[0]["state"] == "starting"
    # a run folder that does not exist at all
    run_dir.rmdir()
    assert reg.live_runs()[0]["state"] == "starting"


def test_live_json_that_is_a_link_a_fifo_or_huge_is_not_read(
        registry: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = _entry(registry, "r1")
    run_dir = Path(json.loads(entry.read_text())["run_dir"])
    run_dir.mkdir()
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps(live_document(four_rank_view(), "r1")))
    live = run_dir / "live.json"
    live.symlink_to(real)
    assert reg.live_runs()[0]["state"] == "starting"
    live.unlink()
    os.mkfifo(live)  # nobody writes it: reading must not block the server
    result: list = []
    reader = threading.Thread(target=lambda: result.append(reg.live_runs()), daemon=True)
    reader.start()
    reader.join(10)
    assert result and result[0][0]["state"] == "starting"
    live.unlink()
    write_live(run_dir, live_document(four_rank_view(), "r1"))
    monkeypatch.setattr(reg, "MAX_LIVE_BYTES", 100)
    assert reg.live_runs()[0]["state"] == "starting"


def test_values_are_type_checked_and_cut(registry: Path) -> None:
    entry = _entry(registry, "r1")
    run_dir = Path(json.loads(entry.read_text())["run_dir"])
    run_dir.mkdir()
    doc = live_document(four_rank_view(), "r1")
    doc["verdict"] = {"html": "<b>x</b>"}
    doc["ranks"][0].update(steps="12", step_ms=True, host=["gpu-a"], state="<img src=x>")
    doc["ranks"][1]["error"] = "e" * 10_000
    doc["ranks"].append("not a row")
    doc["ranks"].append({"rank": "3"})
    write_live(run_dir, doc)
    live = reg.live_runs()[0]["live"]
    assert live["verdict"] == ""
    row = live["ranks"][0]
    assert row["steps"] is None and row["step_ms"] is None and row["host"] is None
    assert row["state"] == "<img src=x>"  # text stays text: the sidebar inserts it as such
    assert len(live["ranks"][1]["error"]) == reg.MAX_TEXT
    assert len(live["ranks"]) == 4
    assert set(row) == set(reg.RANK_NUMBERS) | set(reg.RANK_TEXTS)
    # NaN and infinity never reach the endpoint's JSON
    write_live(run_dir, json.dumps(doc).replace('"data_ms": 0.2', '"data_ms": NaN'))
    assert reg.live_runs()[0]["live"]["ranks"][0]["data_ms"] is None


def test_live_json_of_another_run_is_not_shown(registry: Path) -> None:
    entry = _entry(registry, "r1")
    run_dir = Path(json.loads(entry.read_text())["run_dir"])
    run_dir.mkdir()
    write_live(run_dir, live_document(four_rank_view(), "an-earlier-run"))
    assert reg.live_runs()[0]["state"] == "starting"


def test_entries_of_another_user_or_a_link_are_not_read(registry: Path,
                                                         tmp_path: Path) -> None:
    registry.mkdir(parents=True, mode=0o700)
    target = _entry(tmp_path / "elsewhere", "linked")
    (registry / "linked.json").symlink_to(target)
    assert reg.live_runs() == []
    if os.getuid() != 0:
        return  # only root can give a file to another user
    theirs = _entry(registry, "theirs")
    run_dir = Path(json.loads(theirs.read_text())["run_dir"])
    run_dir.mkdir()
    live = write_live(run_dir, live_document(four_rank_view(), "theirs"))
    os.chown(live, 65534, 65534)
    assert reg.live_runs()[0]["state"] == "starting"  # their live.json is not read
    os.chown(theirs, 65534, 65534)
    assert reg.live_runs() == []
    os.chown(registry, 65534, 65534)
    theirs.unlink()
    _entry(registry, "mine")
    assert reg.live_runs() == []  # nor a registry that is not ours
    assert reg.register("r2", str(run_dir), "h:1", ["true"]) is None


def test_recent_runs_keeps_an_ended_run_a_while(registry: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "exp"
    run_dir.mkdir()
    path = reg.register("r9", str(run_dir), "127.0.0.1:1", ["torchrun", "train.py"])
    write_live(run_dir, live_document(four_rank_view(), "r9"))
    recent = reg.RecentRuns(keep_s=60)
    now = time.time()
    assert [r["state"] for r in recent.runs(now)] == ["running"]
    write_live(run_dir, live_document(four_rank_view(ended=True), "r9", ended=True))
    write_manifest(str(run_dir), Manifest(source=SOURCE_RUN, world_size=4,
                                          stopped="interrupted after 12 steps"))
    reg.unregister(path)
    assert reg.live_runs() == []
    (ended,) = recent.runs(now + 1)
    assert ended["state"] == "ended" and ended["live"]["ended"] is True
    assert ended["stopped"] == "interrupted after 12 steps"
    assert [r["state"] for r in ended["live"]["ranks"]] == ["finished", "finished", "lost",
                                                          "failed"]
    assert recent.runs(now + 30)[0]["run_id"] == "r9"
    assert recent.runs(now + 62) == []
    # a server that never saw it running does not list it
    assert reg.RecentRuns().runs() == []


def test_a_big_job_shows_its_ranks_in_trouble_first_within_the_cap() -> None:
    # 200 ranks: rank 150 failed, rank 77 is slow; the sidebar has room for MAX_RANKS
    from torchlens.analysis.ranks.verdict import run_view
    from torchlens.model.records import StepRecord

    def rec(i: int, data: float, backward: float) -> StepRecord:
        return StepRecord.from_dict({"step": i, "t0": i * 0.1, "t1": i * 0.1 + 0.05,
                                     "phases": {"data": data, "forward": 0.002,
                                                "backward": backward, "optimizer": 0.001,
                                                "collective": 0.0},
                                     "mem": {"rss": 100 << 20, "source": "rss"}})

    steps = [[rec(i, 0.04 if r == 77 else 0.0002, 0.001 if r == 77 else 0.041)
              for i in range(12)] for r in range(200)]
    ranks = [{"rank": r, "node": r // 8, "host": f"h{r // 8}", "silent_s": 0.5, "bye": None,
              "heartbeat": {"steps_done": 12}, "steps_sent": 12, "shared_run_dir": True}
             for r in range(200)]
    ranks[150]["bye"] = {"reason": "exception", "error": "RuntimeError: boom"}
    view = run_view({"world_size": 200, "ranks": ranks, "steps": steps,
                     "summaries": [[] for _ in ranks], "dropped": 0, "restarts": [],
                     "lost_after_s": 10.0})
    live = reg.live_status(live_document(view, "r1"))
    assert live is not None and live["world_size"] == 200
    shown = [r["rank"] for r in live["ranks"]]
    assert len(shown) == reg.MAX_RANKS and shown == sorted(shown)
    assert 150 in shown and 77 in shown


def test_a_finished_run_is_listed_with_its_verdict_then_deleted(registry: Path,
                                                                tmp_path: Path) -> None:
    # a job that starts and ends between two polls of the sidebar: the entry,
    # marked ended, is what lists it, whether or not a reader saw it running
    run_dir = tmp_path / "short"
    run_dir.mkdir()
    path = reg.register("short1", str(run_dir), "127.0.0.1:1", ["torchrun", "train.py"])
    write_live(run_dir, live_document(slow_rank_view(ended=True), "short1", ended=True))
    write_manifest(str(run_dir), Manifest(source=SOURCE_RUN, world_size=4, run_id="short1",
                                          stopped="all 4 ranks finished",
                                          verdict_code="slow_rank", verdict_ranks=[1]))
    reg.finish(path, now=1000.0)
    assert _mode(Path(path)) == 0o600 and sorted(os.listdir(registry)) == ["short1.json"]
    assert reg.live_runs(now=1001.0) == []
    (run,) = reg.finished_runs(now=1001.0)
    assert run["state"] == "ended" and run["ended"] == 1000.0
    assert run["stopped"] == "all 4 ranks finished"
    live = run["live"]
    assert live["verdict_code"] == "slow_rank" and live["verdict_ranks"] == [1]
    assert live["verdict"].startswith("rank 1 is the slow rank")
    # listed KEEP_FINISHED_S, then the entry goes
    assert reg.finished_runs(now=1000.0 + reg.KEEP_FINISHED_S - 1)
    assert reg.finished_runs(now=1000.0 + reg.KEEP_FINISHED_S + 1) == []
    assert not Path(path).exists()
    reg.finish(path)  # gone, or nothing registered: no error
    reg.finish(None)


def test_finished_runs_newest_first_at_most_max(registry: Path) -> None:
    for i in range(reg.MAX_FINISHED + 2):
        _entry(registry, f"r{i}", pid=2**22 + 7, ended=1000.0 + i)
    far = _entry(registry, "far", host="another-host", pid=2**22 + 7, ended=1100.0)
    ids = [r["run_id"] for r in reg.finished_runs(now=1100.0)]
    assert ids == [f"r{i}" for i in range(reg.MAX_FINISHED + 1, 1, -1)]
    assert reg.live_runs(now=1100.0) == []  # an ended entry is not stale: its pid is gone
    assert len(list(registry.glob("r*.json"))) == reg.MAX_FINISHED + 2 and far.exists()


def test_verdict_ranks_are_type_checked(registry: Path) -> None:
    entry = _entry(registry, "r1")
    run_dir = Path(json.loads(entry.read_text())["run_dir"])
    run_dir.mkdir()
    doc = live_document(slow_rank_view(), "r1")
    assert doc["verdict_ranks"] == [1]
    doc["verdict_ranks"] = [1, "2", True, 3.5, None, 4]
    write_live(run_dir, doc)
    assert reg.live_runs()[0]["live"]["verdict_ranks"] == [1, 4]
    doc["verdict_ranks"] = "1"
    write_live(run_dir, doc)
    assert reg.live_runs()[0]["live"]["verdict_ranks"] == []


def test_recent_runs_lists_a_finished_run_once(registry: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "exp"
    run_dir.mkdir()
    path = reg.register("r9", str(run_dir), "127.0.0.1:1", ["torchrun", "train.py"])
    write_live(run_dir, live_document(slow_rank_view(), "r9"))
    seen, fresh = reg.RecentRuns(), reg.RecentRuns()
    now = time.time()
    assert [r["state"] for r in seen.runs(now)] == ["running"]
    write_live(run_dir, live_document(slow_rank_view(ended=True), "r9", ended=True))
    reg.finish(path, now=now + 1)
    # the server that saw it running and one that never did both list it, once
    for recent in (seen, fresh):
        (run,) = recent.runs(now + 2)
        assert run["run_id"] == "r9" and run["state"] == "ended" and run["ended"] == now + 1
        assert run["live"]["verdict_ranks"] == [1]
    assert seen.runs(now + 1 + reg.KEEP_FINISHED_S + 1) == []

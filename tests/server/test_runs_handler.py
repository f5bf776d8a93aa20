"""``GET torchlens/runs``: the ``torchlens run`` jobs of this machine, behind the server's auth.

Runs under pytest-jupyter's server (base_url ``/a%40b/``) with a temporary
registry; the live.json comes from a real ``RunView`` (tests/ranks/live_doc.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

# tests/ is on sys.path (pytest puts tests/conftest.py's folder there): tests/ranks/live_doc.py
from ranks.live_doc import four_rank_view, live_document, slow_rank_view, write_live
from tornado.httpclient import HTTPClientError

from torchlens.frontends.ranks import registry as reg


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "registry"
    monkeypatch.setenv(reg.ENV_DIR, str(folder))
    return folder


@pytest.mark.parametrize("auth", ["", "token nope"])
async def test_runs_refuses_without_token(jp_fetch: Any, monitor: Any, registry: Path,
                                          auth: str) -> None:
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("torchlens", "runs", headers={"Authorization": auth})
    assert err.value.code == 403


async def test_runs_empty_then_a_running_job(jp_fetch: Any, monitor: Any, registry: Path,
                                             tmp_path: Path) -> None:
    reply = json.loads((await jp_fetch("torchlens", "runs")).body)
    assert reply["runs"] == [] and reply["registry"] == str(registry)
    assert isinstance(reply["t"], float)

    run_dir = tmp_path / "exp1"
    run_dir.mkdir()
    entry = reg.register("8c1f0e27a4b9d3e1", str(run_dir), "127.0.0.1:41233",
                         ["torchrun", "--nproc-per-node", "2", "train.py"])
    (run,) = json.loads((await jp_fetch("torchlens", "runs")).body)["runs"]
    assert run["state"] == "starting" and run["live"] is None

    write_live(run_dir, live_document(four_rank_view(), "8c1f0e27a4b9d3e1"))
    (run,) = json.loads((await jp_fetch("torchlens", "runs")).body)["runs"]
    assert set(run) == {"run_id", "run_dir", "collector", "pid", "command", "started", "state",
                        "live", "stopped", "ended"}
    assert run["run_id"] == "8c1f0e27a4b9d3e1" and run["run_dir"] == str(run_dir)
    assert run["pid"] == os.getpid() and run["state"] == "running"
    live = run["live"]
    assert set(live) == {"t", "age_s", "run_id", "world_size", "verdict", "verdict_code",
                         "verdict_ranks", "ended", "restarts", "dropped", "ranks"}
    # rank 3 on the same node said goodbye (it raised): the node was reachable, rank 2 lost
    assert live["verdict_code"] == "lost_node"
    assert live["verdict"].startswith("rank 2 was lost: it stopped sending at step 9 (no "
                                      "goodbye, and node 1 (host gpu-b)'s other ranks went on")
    assert [(r["rank"], r["node"], r["host"], r["state"]) for r in live["ranks"]] == [
        (0, 0, "gpu-a", "running"), (1, 0, "gpu-a", "running"),
        (2, 1, "gpu-b", "lost"), (3, 1, "gpu-b", "failed")]
    assert all(set(r) == set(reg.RANK_NUMBERS) | set(reg.RANK_TEXTS) for r in live["ranks"])

    # the run ends: listed as ended for a while (this server saw it running)
    write_live(run_dir, live_document(four_rank_view(), "8c1f0e27a4b9d3e1", ended=True))
    reg.unregister(entry)
    (run,) = json.loads((await jp_fetch("torchlens", "runs")).body)["runs"]
    assert run["state"] == "ended" and run["live"]["ended"] is True


async def test_runs_garbled_registry_is_not_an_error(jp_fetch: Any, monitor: Any,
                                                     registry: Path) -> None:
    registry.mkdir(mode=0o700)
    (registry / "x.json").write_text("{not json")
    (registry / "y.json").mkdir()
    reply = json.loads((await jp_fetch("torchlens", "runs")).body)
    assert reply["runs"] == []


async def test_a_job_shorter_than_a_poll_is_listed_once_ended(
        jp_fetch: Any, monitor: Any, registry: Path, tmp_path: Path) -> None:
    # it starts and ends between two requests: the first answer after it is its
    # finished entry, with its verdict's code and the ranks it names
    assert json.loads((await jp_fetch("torchlens", "runs")).body)["runs"] == []
    run_dir = tmp_path / "short"
    run_dir.mkdir()
    entry = reg.register("5e5e5e5e5e5e5e5e", str(run_dir), "127.0.0.1:41233",
                         ["torchrun", "--nproc-per-node", "4", "train.py"])
    write_live(run_dir, live_document(slow_rank_view(ended=True), "5e5e5e5e5e5e5e5e",
                                      ended=True))
    reg.finish(entry)
    (run,) = json.loads((await jp_fetch("torchlens", "runs")).body)["runs"]
    assert run["run_id"] == "5e5e5e5e5e5e5e5e" and run["state"] == "ended"
    assert isinstance(run["ended"], float)
    live = run["live"]
    assert live["verdict_code"] == "slow_rank" and live["verdict_ranks"] == [1]
    assert live["verdict"].startswith("rank 1 is the slow rank")

"""A run's rank files read on a Dask cluster (``torchlens analyze --dask``,
``load_run(executor=...)``): the traces that outgrow one machine read where
the cluster runs, only their figures sent back, and the result identical to
the single-machine path. Tested on a local cluster of two worker processes,
bound to this machine only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchlens.frontends.runs.api import load_run

distributed = pytest.importorskip("distributed", reason="Dask's distributed (the test extra)")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None,
                                  silence_logs=50) as local:
        with distributed.Client(local) as client:
            yield local, client


def test_a_run_read_on_the_cluster_is_the_run_read_here(cluster, two_ranks) -> None:
    local, client = cluster
    here = load_run(str(two_ranks), workers=1, tables_only=True)
    with distributed.get_task_stream(client) as tasks:
        there = load_run(str(two_ranks), tables_only=True, executor=client.get_executor())
    assert there.to_json() == here.to_json()
    assert [str(f) for f in there.findings()] == [str(f) for f in here.findings()]
    # each file was read on a worker, in a process of its own
    ran = [t for t in tasks.data if str(t.get("key", "")).startswith("file_job")]
    assert len(ran) == 2, tasks.data
    assert {t["worker"] for t in ran} <= set(client.scheduler_info()["workers"])


def test_analyze_dask_prints_what_analyze_prints(cluster, two_ranks) -> None:
    local, _ = cluster
    cmd = [sys.executable, "-m", "torchlens", "analyze", str(two_ranks), "--json"]
    here = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    there = subprocess.run([*cmd, "--dask", local.scheduler_address], capture_output=True,
                           text=True, timeout=120)
    assert here.returncode == there.returncode == 0, there.stderr[-2000:]
    assert json.loads(there.stdout) == json.loads(here.stdout)


def test_a_scheduler_that_does_not_answer_is_said_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "torchlens", "analyze", "x",
                           "--dask", "tcp://127.0.0.1:9"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "no Dask scheduler answered there" in done.stderr, done.stderr

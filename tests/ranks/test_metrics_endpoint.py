"""``torchlens run --metrics``'s endpoint: the token, the address, a port in use."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from torchlens.frontends.ranks.metrics_endpoint import (
    MetricsEndpoint,
    parse_address,
    serve,
)
from torchlens.model import InputError
from torchlens.model.records import StepRecord

from .helpers import REPO, env


def _rec(step: int, step_s: float) -> StepRecord:
    return StepRecord.from_dict({"step": step, "t0": step, "t1": step + step_s,
                                 "phases": {"data": 0.001, "forward": 0.002}})


class _Collector:
    """The little of ``capture.ranks.collector.Collector`` the endpoint reads."""

    def __init__(self) -> None:
        self.slots = [SimpleNamespace(rank=r, slot=r, counts=[0, 0], steps=[], seen=0.0,
                                      hello={"rank": r, "node": 0, "host": "h0"})
                      for r in range(2)]
        self.listeners: list = []

    def send(self, rank: int, n: int) -> None:
        s = self.slots[rank]
        batch = [_rec(s.counts[0] + i, 0.03) for i in range(n)]
        s.steps = (s.steps + batch)[-64:]
        s.counts[0] += n
        for fn in self.listeners:  # as the collector hands each batch it keeps on
            fn(s, 0, batch)

    def all_slots(self) -> list:
        return self.slots

    def snapshot(self) -> dict:
        import time
        return {"world_size": 2, "steps": [s.steps for s in self.slots],
                "summaries": [[], []], "dropped": 0, "lost_after_s": 10.0,
                "ranks": [{**s.hello, "silent_s": time.monotonic() - s.seen, "bye": None,
                           "heartbeat": {}, "steps_sent": s.counts[0], "incarnation": 0,
                           "shared_run_dir": True} for s in self.slots]}


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_scrape_needs_the_token_and_counts_steps_of_every_poll(tmp_path: Path) -> None:
    run_dir = tmp_path / "exp1"
    run_dir.mkdir()
    endpoint = MetricsEndpoint("127.0.0.1", 0, str(run_dir))
    try:
        token_file = run_dir / "metrics.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text()
        assert endpoint.host == "127.0.0.1"
        collector = _Collector()
        # 100 steps a rank over polls: more than the 64 the collector keeps
        for _ in range(5):
            collector.send(0, 20)
            collector.send(1, 20)
            endpoint.tick(collector, None)
        assert _get(endpoint.url)[0] == 401
        assert _get(endpoint.url, "not-the-token")[0] == 401
        assert _get(endpoint.url.replace("/metrics", "/"), token)[0] == 404
        code, body = _get(endpoint.url, token)
        assert code == 200
        got = {f.name: f for f in text_string_to_metric_families(body)}
        counts = {s.labels["rank"]: s.value for s in got["torchlens_steps"].samples}
        assert counts == {"0": 100, "1": 100}
        assert {s.labels["run"] for s in got["torchlens_world_size"].samples} == {"exp1"}
    finally:
        endpoint.close()
    assert not (run_dir / "metrics.token").exists()


def test_addresses() -> None:
    assert parse_address("9464") == ("127.0.0.1", 9464)
    assert parse_address("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("x", "host:", ":9464", "1.2.3.4:99999", "[::1]9464", "9464:x"):
        with pytest.raises(InputError, match=r"--metrics"):
            parse_address(bad)


def test_port_in_use_says_one_line_and_returns_none(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        said: list[str] = []
        assert serve(("127.0.0.1", s.getsockname()[1]), str(tmp_path), said.append) is None
    assert len(said) == 1 and "the job runs without metrics" in said[0], said
    assert "\n" not in said[0]


def test_bad_address_stops_before_the_job_starts(tmp_path: Path) -> None:
    mark = tmp_path / "started"
    done = subprocess.run(
        [sys.executable, "-m", "torchlens", "run", "--out", str(tmp_path / "run"),
         "--metrics", "localhost:http", "--", "touch", str(mark)],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith("torchlens: error: --metrics localhost:http: expected")
    assert not mark.exists() and not os.path.exists(tmp_path / "run")

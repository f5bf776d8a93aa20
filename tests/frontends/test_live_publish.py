"""A running %%gpumem publishes its memory to the GPU Monitor's rank channel."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest

import torchlens
from torchlens.frontends.shared.live_publish import LivePublisher, RankSink
from torchlens.frontends.shared.rank_channel import RankPublisher, ServerInfo
from torchlens.model.messages import DdpHeartbeat


@pytest.fixture
def fake_server(monkeypatch):
    """Stands in for the Jupyter server's POST <base>/torchlens/monitor/ranks."""
    posts: list[tuple[str, str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posts.append((self.path, self.headers.get("Authorization"), body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("TORCHLENS_SERVER_URL", f"http://127.0.0.1:{server.server_port}/user/a/")
    monkeypatch.setenv("TORCHLENS_SERVER_TOKEN", "sekrit")
    yield posts
    server.shutdown()
    server.server_close()


def test_gpumem_cell_publishes_rank_memory_while_running(fake_server):
    with torchlens.gpumem(stacks=0, title="leaky run"):
        time.sleep(1.3)
    assert len(fake_server) >= 2
    path, auth, body = fake_server[0]
    assert path == "/user/a/torchlens/monitor/ranks" and auth == "token sekrit"
    assert body["run"] == "leaky run"
    sample = body["samples"][0]
    assert sample["rank"] == 0 and sample["allocated"] > 0  # resident memory on CPU
    n = len(fake_server)
    time.sleep(0.8)
    assert len(fake_server) == n  # stopped with the cell


def test_no_server_no_thread_and_a_failing_probe_is_harmless():
    live = LivePublisher("x", lambda: 1 / 0, publisher=RankPublisher("x", server=None))
    with live:
        assert live._thread is None
    dead = RankPublisher("x", server=ServerInfo("http://127.0.0.1:9/", ""), timeout=0.2)
    with LivePublisher("x", lambda: 1 / 0, interval=0.05, publisher=dead) as live:
        time.sleep(0.2)
    assert live.sent == 0 and not live._thread.is_alive()


def _two_rank_step(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    return None


@pytest.mark.slow
def test_ddp_check_publishes_every_ranks_memory(fake_server):
    result = torchlens.ddp_check(_two_rank_step, world_size=2, live=False, steps=1,
                                 timeout=60)
    assert result.profile.kind == "ddp_check"
    ranks = {s["rank"] for _, _, body in fake_server for s in body["samples"]}
    assert ranks == {0, 1}
    assert all(s["allocated"] > 0 for _, _, b in fake_server for s in b["samples"])
    assert fake_server[0][2]["run"].startswith("%ddp_check")


def test_rank_sink_builds_its_live_view_on_start():
    made = []

    class Inner:  # a RankFeed that keeps the heartbeats
        def __init__(self):
            self.pushed = []
            self.started = 0

        def start(self):
            self.started += 1

        def push(self, hb):
            self.pushed.append(hb)

        def push_steps(self, rank, records):
            pass

        def push_summary(self, rank, summary):
            pass

        def rank_ended(self, rank, reason, t):
            pass

        def flush(self, force=False):
            pass

        def close(self):
            pass

    def make():
        made.append(Inner())
        return made[-1]

    sink = RankSink("r", make_inner=make, publisher=RankPublisher("r", server=None))
    assert sink.inner is None and not made
    sink.start()
    sink.start()  # once only
    sink.push(DdpHeartbeat(rank=0, t=1.0, rss=5))
    sink.flush(force=True)
    assert len(made) == 1 and made[0].pushed == [DdpHeartbeat(rank=0, t=1.0, rss=5)]


STEP_MEM = {"rss": 412000000, "allocated": None, "reserved": None,
            "inactive_split": None, "largest_free": None, "source": "rss"}
SUMMARY_MEM = {"allocated": 1048576, "reserved": 2097152, "inactive_split": 4096,
               "largest_free": 1044480, "peak_allocated": 3145728, "source": "modelled"}


def test_push_memory_sends_a_steps_allocator_figures(fake_server):
    """``--profile``: a step record's ``mem`` and a profiled-step summary's
    ``memory`` (docs/RANK_PROFILE.md) become rank samples with the optional
    fragmentation fields, beside the heartbeats ``push`` still sends as before."""
    sink = RankSink("prof", interval=0.0)
    sink.push(DdpHeartbeat(rank=0, t=10.0, rss=5, cuda_allocated=None))
    sink.push_memory(0, STEP_MEM, 10.5)
    sink.push_memory(1, SUMMARY_MEM, 11.0)
    sink.push_memory(1, {"allocated": 7, "reserved": 9, "inactive_split": 2,
                         "largest_free": None, "source": "cuda"}, 12.0, device=1)
    sink.flush(force=True)
    (_, _, body), = fake_server
    heartbeat, step, summary, cuda = body["samples"]
    # push(hb) is unchanged: no new keys
    assert heartbeat == {"rank": 0, "t": 10.0, "device": None, "allocated": 5,
                         "reserved": None}
    # CPU step record: resident memory is the line's "allocated", labelled rss
    assert step == {"rank": 0, "t": 10.5, "device": None, "allocated": 412000000,
                    "reserved": None, "inactive_split": None, "largest_free": None,
                    "source": "rss"}
    # profiled-step summary: the allocator model's figures, labelled modelled
    assert summary == {"rank": 1, "t": 11.0, "device": None, "allocated": 1048576,
                       "reserved": 2097152, "inactive_split": 4096,
                       "largest_free": 1044480, "source": "modelled"}
    assert cuda["device"] == 1 and cuda["source"] == "cuda" and cuda["largest_free"] is None


def test_push_memory_sends_odd_values_as_null_and_nothing_without_a_server():
    """One odd field must not make the server refuse the batch (and the
    heartbeats in it): non-numbers and unknown sources travel as null."""
    sent = []

    class Recorder(RankPublisher):
        def publish(self, samples):
            sent.extend(msgspec.to_builtins(samples))  # as posted
            return True

    sink = RankSink("r", publisher=Recorder("r", server=ServerInfo("http://x/", "")))
    sink.push_memory(2, {"allocated": "1 MiB", "reserved": float("nan"),
                         "inactive_split": True, "largest_free": -3,
                         "source": "<b>gpu</b>"}, 1.0, device="cuda:0")
    sink.flush(force=True)
    assert sent == [{"rank": 2, "t": 1.0, "device": None, "allocated": None,
                     "reserved": None, "inactive_split": None, "largest_free": None,
                     "source": None}]
    off = RankSink("r", publisher=RankPublisher("r", server=None))
    off.push_memory(0, SUMMARY_MEM, 1.0)
    assert off._pending == []


def test_profiled_run_memory_reaches_the_sidebar_and_the_live_view(fake_server, tmp_path):
    """A real 2-rank ``--profile`` run through ``RankSink``: the sidebar's channel
    gets each rank's step memory (RSS) and the profiled steps' modelled
    allocator figures; the live view gets every step record and summary."""
    import cloudpickle

    from tests.ddp import profiled
    from torchlens.frontends.ddp.api import ddp_check

    cloudpickle.register_pickle_by_value(profiled)
    seen = {"steps": 0, "summaries": 0, "ended": []}

    class View:  # a RankFeed that counts what it is given
        def start(self):
            pass

        def push(self, hb):
            pass

        def push_steps(self, rank, records):
            seen["steps"] += len(records)

        def push_summary(self, rank, summary):
            seen["summaries"] += 1

        def rank_ended(self, rank, reason, t):
            seen["ended"].append((rank, reason))

        def flush(self, force=False):
            pass

        def close(self):
            pass

    import torchlens.frontends.shared.live_publish as lp

    real = lp.RankSink

    class Sink(real):
        def __init__(self, run, make_inner=None, **kw):
            super().__init__(run, inner=View(), interval=0.0, **kw)

    lp.RankSink = Sink
    try:
        res = ddp_check(profiled.balanced, world_size=2, backend="gloo", profile=True,
                        profile_every=3, steps=9, run_dir=str(tmp_path / "run"), live=False)
    finally:
        lp.RankSink = real
    assert res.records.outcome == "finished"
    assert seen["steps"] == 18 and seen["summaries"] == 6
    assert sorted(seen["ended"]) == [(0, "finished"), (1, "finished")]
    samples = [s for _, _, body in fake_server for s in body["samples"]]
    sources = {(s["rank"], s.get("source")) for s in samples}
    assert {(0, "rss"), (1, "rss"), (0, "modelled"), (1, "modelled")} <= sources
    modelled = [s for s in samples if s.get("source") == "modelled"]
    assert all(s["reserved"] and s["inactive_split"] is not None for s in modelled)

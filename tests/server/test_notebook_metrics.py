"""A notebook kernel's run series on the Jupyter server's /metrics (``%ddp_check --profile
--metrics``, ``torchlens.watch(..., metrics=True)``): the kernel's ``MetricsFeed`` POSTs
them with the server's token, a scrape yields them; what the server refuses."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import HTTPClientError

from torchlens.frontends.shared.metrics_publish import MetricsFeed
from torchlens.frontends.shared.rank_channel import RankPublisher, ServerInfo
from torchlens.model.messages import DdpHeartbeat
from torchlens.model.records import StepRecord


def _rec(step: int, data: float, backward: float) -> StepRecord:
    t0 = 1_700_000_000 + step * 0.1
    return StepRecord.from_dict({"step": step, "t0": t0, "t1": t0 + 0.045, "window": False,
                                 "phases": {"data": data, "forward": 0.002, "backward": backward,
                                            "optimizer": 0.001, "collective": 0.0},
                                 "mem": {"rss": 100 << 20, "source": "rss"}})


def _series(body: bytes) -> dict[str, list]:
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(body.decode())}


def _publisher(jp_serverapp: Any, token: str | None = None) -> RankPublisher:
    app = jp_serverapp
    url = f"http://127.0.0.1:{app.port}{app.base_url}"
    return RankPublisher("t", ServerInfo(url, app.identity_provider.token if token is None
                                         else token), timeout=5.0)


def _straggler(feed: MetricsFeed) -> None:
    """Rank 1 spends 40 ms a step loading data; rank 0 waits for it in backward (the
    gradient all-reduce), so both steps take 45 ms."""
    for r in range(2):
        feed.push(DdpHeartbeat(rank=r, t=1_700_000_001.0, host="gpu7", node=0))
        feed.push_steps(r, [_rec(i, *((0.040, 0.001) if r == 1 else (0.0002, 0.041)))
                               for i in range(12)])


async def test_feed_series_on_the_server_metrics(jp_fetch: Any, jp_serverapp: Any,
                                                 monitor: Any) -> None:
    monitor.sample_once()
    feed = MetricsFeed("cell-20250101-1200-42", 2, _publisher(jp_serverapp))
    _straggler(feed)
    await asyncio.to_thread(feed.flush)
    assert feed.sent == 1 and feed.trouble() == ""
    body = (await jp_fetch("metrics")).body
    # a counter is typed as one (prometheus_client adds "_total" to a counter's family)
    assert b"# TYPE torchlens_steps_total counter\n" in body
    got = _series(body)
    labels = {"run": "cell-20250101-1200-42", "rank": "1", "node": "0", "host": "gpu7"}
    assert got["torchlens_slow_rank"] == [("torchlens_slow_rank", {**labels, "cause": "data"}, 1)]
    counts = {s[1]["rank"]: s[2] for s in got["torchlens_steps"]}
    assert counts == {"0": 12, "1": 12}
    assert got["torchlens_world_size"][0][2] == 2
    up = {s[1]["rank"]: s[2] for s in got["torchlens_rank_state"] if s[1]["state"] == "up"}
    assert up == {"0": 1, "1": 1}
    # the machine's series are still there, beside the run's
    assert "torchlens_gpu_count" in got
    # the end: a rank killed by a signal is lost, a finished one ended (one post, forced)
    feed.rank_ended(0, "finished", 1_700_000_002.0)
    feed.rank_ended(1, "killed by SIGKILL", 1_700_000_002.0)
    await asyncio.to_thread(feed.close)
    got = _series((await jp_fetch("metrics")).body)
    now = {s[1]["rank"]: s[1]["state"] for s in got["torchlens_rank_state"] if s[2] == 1}
    assert now == {"0": "ended", "1": "lost"}


async def test_feed_with_a_wrong_token_says_so(jp_fetch: Any, jp_serverapp: Any,
                                               monitor: Any) -> None:
    feed = MetricsFeed("r1", 2, _publisher(jp_serverapp, token="not-the-token"))
    _straggler(feed)
    await asyncio.to_thread(feed.flush)
    assert feed.sent == 0 and "403" in feed.trouble()
    got = _series((await jp_fetch("metrics")).body)
    assert "torchlens_slow_rank" not in got


@pytest.mark.parametrize("family, why", [
    ({"name": "torchlens_secret_total", "samples": []}, "unknown family"),
    ({"name": "torchlens_world_size", "samples": [["", {"run": "r1", "path": "/x"}, 2]]},
     "labels must be among"),
    ({"name": "torchlens_world_size", "samples": [["", {"run": "other"}, 2]]},
     "the batch's run"),
    ({"name": "torchlens_world_size", "samples": [["", {"run": "r1"}, "NaN"]]},
     "finite numbers"),
    ({"name": "torchlens_world_size", "samples": [["_bucket", {"run": "r1"}, 1]]},
     "suffix"),
])
async def test_server_refuses_what_torchlens_does_not_write(jp_fetch: Any, monitor: Any,
                                                            family: dict, why: str) -> None:
    body = json.dumps({"run": "r1", "families": [family]})
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("torchlens", "monitor", "metrics", method="POST", body=body)
    assert err.value.code == 400 and why in err.value.response.body.decode()
    assert "run=\"r1\"" not in (await jp_fetch("metrics")).body.decode()


async def test_post_needs_the_token(jp_fetch: Any, monitor: Any) -> None:
    body = json.dumps({"run": "r1", "families": []})
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("torchlens", "monitor", "metrics", method="POST", body=body,
                       headers={"Authorization": ""})
    assert err.value.code == 403


def test_metrics_needs_profile_and_a_server(monkeypatch: Any, tmp_path: Any) -> None:
    from torchlens.frontends.ddp.api import ddp_check
    from torchlens.frontends.ranks.watch import watch
    from torchlens.model import InputError

    monkeypatch.delenv("TORCHLENS_SERVER_URL", raising=False)
    monkeypatch.setattr("torchlens.frontends.shared.rank_channel._server_files", lambda: [])
    with pytest.raises(InputError, match="add --profile"):
        ddp_check(lambda rank, world_size: None, metrics=True, live=False)
    with pytest.raises(InputError, match="none was found"):
        ddp_check(lambda rank, world_size: None, metrics=True, profile=True, live=False)
    with pytest.raises(InputError, match="none was found"):
        watch(str(tmp_path), metrics=True)

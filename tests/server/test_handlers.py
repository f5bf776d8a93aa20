"""The server extension under jupyter_server's test server: auth, base_url, endpoints.

pytest-jupyter's default base_url is ``/a%40b/``, so every test here already
runs behind a non-root base_url; one test also uses ``/user/alice/``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from torchlens.frontends.shared.rank_channel import RankPublisher, ServerInfo

ENDPOINTS = [
    ("GET", "samples", None),
    ("GET", "config", None),
    ("PUT", "config", b'{"interval": 1}'),
    ("POST", "ranks", b'{"run": "x", "samples": []}'),
    ("GET", "ranks", None),
    ("GET", "history.csv", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
async def test_every_endpoint_refuses_without_token(
    jp_fetch: Any, monitor: Any, method: str, path: str, body: bytes | None
) -> None:
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch(
            "torchlens",
            "monitor",
            path,
            method=method,
            body=body,
            headers={"Authorization": ""},
        )
    assert err.value.code == 403


async def test_wrong_token_is_refused(jp_fetch: Any, monitor: Any) -> None:
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch(
            "torchlens", "monitor", "samples", headers={"Authorization": "token nope"}
        )
    assert err.value.code == 403


async def test_samples_history_and_long_poll(jp_fetch: Any, monitor: Any) -> None:
    response = await jp_fetch("torchlens", "monitor", "samples", params={"since": "0"})
    reply = json.loads(response.body)
    assert reply["samples"], "the extension samples from load time on"
    first = reply["samples"][0]
    assert first["gpu"]["status"].startswith(
        ("no NVIDIA GPU found (", "1 NVIDIA", "2 NVIDIA")
    )
    assert 0 <= first["host"]["cpu_percent"] <= 100
    last = reply["samples"][-1]["t"]
    started = time.monotonic()
    response = await jp_fetch(
        "torchlens", "monitor", "samples", params={"since": str(last), "wait": "5"}
    )
    newer = json.loads(response.body)["samples"]
    assert newer and all(s["t"] > last for s in newer)
    assert time.monotonic() - started < 2, (
        "long poll answers when the next sample exists"
    )


async def test_bad_arguments_are_400(jp_fetch: Any, monitor: Any) -> None:
    for kwargs in (
        {"params": {"since": "yesterday"}},
        {"method": "PUT", "body": b'{"interval": "fast"}'},
        {"method": "PUT", "body": b"[1]"},
    ):
        path = "samples" if "params" in kwargs else "config"
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch("torchlens", "monitor", path, **kwargs)
        assert err.value.code == 400


async def test_interval_can_be_set(jp_fetch: Any, monitor: Any) -> None:
    response = await jp_fetch(
        "torchlens", "monitor", "config", method="PUT", body=b'{"interval": 2.5}'
    )
    assert json.loads(response.body)["interval"] == 2.5 and monitor.interval == 2.5


async def test_ranks_posted_show_up_in_samples(jp_fetch: Any, monitor: Any) -> None:
    body = {
        "run": "ddp",
        "samples": [
            {"rank": r, "t": time.time(), "allocated": 2**20 * r} for r in range(2)
        ],
    }
    response = await jp_fetch(
        "torchlens", "monitor", "ranks", method="POST", body=json.dumps(body)
    )
    assert json.loads(response.body) == {"stored": 2}
    reply = json.loads((await jp_fetch("torchlens", "monitor", "samples")).body)
    assert [(r["run"], r["rank"]) for r in reply["ranks"]] == [("ddp", 0), ("ddp", 1)]


async def test_ranks_get_returns_the_ranks_and_put_is_refused(
    jp_fetch: Any, monitor: Any
) -> None:
    """``/ranks`` is the per-rank channel, not a second ``/config``: GET lists the
    ranks (not the interval) and PUT cannot change the sampling interval."""
    body = {"run": "r", "samples": [{"rank": 1, "t": time.time(), "allocated": 5}]}
    await jp_fetch("torchlens", "monitor", "ranks", method="POST", body=json.dumps(body))
    reply = json.loads((await jp_fetch("torchlens", "monitor", "ranks")).body)
    assert set(reply) == {"ranks"}
    assert [(r["run"], r["rank"]) for r in reply["ranks"]] == [("r", 1)]
    before = monitor.interval
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch(
            "torchlens", "monitor", "ranks", method="PUT", body=b'{"interval": 7}'
        )
    assert err.value.code == 405 and monitor.interval == before


async def test_ranks_carry_fragmentation_fields_and_bad_ones_are_400(
    jp_fetch: Any, monitor: Any
) -> None:
    """``%ddp_check --profile``'s allocator figures go in and come back out; a
    sample with a value that is not a number (or a source outside the fixed
    set) is refused whole, and nothing of its batch is kept."""
    now = time.time()
    profiled = {"rank": 0, "t": now, "device": None, "allocated": 1048576,
                "reserved": 2097152, "inactive_split": 4096,
                "largest_free": 1044480, "source": "modelled"}
    body = {"run": "prof", "samples": [profiled, {"rank": 1, "t": now, "allocated": 7}]}
    response = await jp_fetch(
        "torchlens", "monitor", "ranks", method="POST", body=json.dumps(body)
    )
    assert json.loads(response.body) == {"stored": 2}
    reply = json.loads((await jp_fetch("torchlens", "monitor", "ranks")).body)
    first, second = reply["ranks"]
    assert first == {**profiled, "run": "prof"}
    assert (second["inactive_split"], second["largest_free"], second["source"]) == (
        None, None, None)
    for bad in ({"source": "<script>alert(1)</script>"}, {"inactive_split": "4 KiB"},
                {"largest_free": -5}, {"reserved": True}):
        body = {"run": "bad", "samples": [profiled, {**profiled, **bad}]}
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch(
                "torchlens", "monitor", "ranks", method="POST", body=json.dumps(body)
            )
        assert err.value.code == 400
    # NaN is valid to Python's json.loads but not to the browser's JSON.parse
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("torchlens", "monitor", "ranks", method="POST",
                       body=b'{"run": "nan", "samples": [{"rank": 0, "largest_free": NaN}]}')
    assert err.value.code == 400
    assert {r.run for r in monitor.ranks.since(0)} == {"prof"}


async def test_csv_export(jp_fetch: Any, monitor: Any) -> None:
    import asyncio

    # the sampler thread's first sample may come after the server answers
    # (a loaded CI machine): the export is of what was sampled
    for _ in range(100):
        if monitor.samples_taken:
            break
        await asyncio.sleep(0.1)
    response = await jp_fetch("torchlens", "monitor", "history.csv")
    assert response.headers["Content-Type"].startswith("text/csv")
    lines = response.body.decode().splitlines()
    assert lines[0].startswith("time,host_cpu_percent") and len(lines) >= 2


async def test_publisher_posts_with_the_server_token(
    jp_serverapp: Any,
    monitor: Any,
    http_server_client: Any,
    http_server_port: Any,
    jp_base_url: str,
) -> None:
    """The kernel-side client, against the live test server (run in a thread: it blocks)."""
    import asyncio

    url = f"http://127.0.0.1:{http_server_port[-1]}{jp_base_url}"
    good = RankPublisher("run-a", ServerInfo(url, jp_serverapp.identity_provider.token))
    bad = RankPublisher("run-b", ServerInfo(url, "wrong"))
    sample = [{"rank": 0, "t": time.time(), "allocated": 1, "reserved": 2}]
    assert await asyncio.to_thread(good.publish, sample)
    assert not await asyncio.to_thread(bad.publish, sample) and bad.failures == 1
    assert [r.run for r in monitor.ranks.since(0)] == ["run-a"]
    assert not RankPublisher("x", server=None).publish(sample)


class TestUserBaseUrl:
    @pytest.fixture
    def jp_base_url(self) -> str:
        return "/user/alice/"

    async def test_routes_live_under_the_base_url(
        self, jp_fetch: Any, monitor: Any
    ) -> None:
        response = await jp_fetch("torchlens", "monitor", "config")
        assert json.loads(response.body)["interval"] == pytest.approx(0.1)
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch(
                "torchlens", "monitor", "config", headers={"Authorization": ""}
            )
        assert err.value.code == 403

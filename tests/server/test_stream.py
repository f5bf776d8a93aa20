"""The monitor's WebSocket (``torchlens/monitor/ws``) under jupyter_server's test server.

Auth and origin the way jupyter_server's own sockets do it, history on
connect, each sample pushed once to every socket (encoded once), pause and
resume with the gap filled, interval over the socket, and the sampler's idle
rate depending on open sockets. pytest-jupyter's base_url is ``/a%40b/``;
one class repeats the essentials under ``/user/alice/``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from torchlens.frontends.monitor.sampler import History
from torchlens.model.samples import RankSample

WS = ("torchlens", "monitor", "ws")


async def read(ws: Any, timeout: float = 5.0) -> dict[str, Any]:
    message = await asyncio.wait_for(ws.read_message(), timeout)
    assert message is not None, "socket closed by the server"
    return json.loads(message)


async def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": ""}, {"Authorization": "token nope"}],
    ids=["no-token", "wrong-token"],
)
async def test_socket_refuses_without_token(
    jp_ws_fetch: Any, monitor: Any, headers: dict[str, str]
) -> None:
    with pytest.raises(HTTPClientError) as err:
        await jp_ws_fetch(*WS, headers=headers)
    assert err.value.code == 403
    assert monitor.watchers == 0


async def test_cookie_auth_checks_origin(
    jp_ws_fetch: Any, jp_fetch: Any, monitor: Any
) -> None:
    """Cross-site WebSocket hijacking: a page elsewhere must not ride on the login cookie.

    Like every jupyter_server socket, token-authenticated connections skip the
    origin check (whoever has the token is trusted); cookie ones do not.
    """
    response = await jp_fetch("api", "status")  # token request -> login cookie
    cookies = [c.split(";")[0] for c in response.headers.get_list("Set-Cookie")]
    assert cookies, "the server sets its login cookie on a token request"
    host = response.effective_url.split("/")[2]  # the cookie's name carries the host
    cookie = {"Authorization": "", "Cookie": "; ".join(cookies), "Host": host}
    ws = await jp_ws_fetch(*WS, headers={**cookie, "Origin": f"http://{host}"})
    assert (await read(ws))["history"] is True
    ws.close()
    with pytest.raises(HTTPClientError) as err:
        await jp_ws_fetch(*WS, headers={**cookie, "Origin": "http://evil.example"})
    assert err.value.code == 403


async def test_token_as_query_argument(
    jp_ws_fetch: Any, jp_serverapp: Any, monitor: Any
) -> None:
    """What the sidebar sends when ServerConnection says appendToken."""
    token = jp_serverapp.identity_provider.token
    ws = await jp_ws_fetch(*WS, headers={"Authorization": ""}, params={"token": token})
    assert (await read(ws))["history"] is True
    ws.close()


async def test_history_on_connect_then_each_sample_once(
    jp_ws_fetch: Any, monitor: Any
) -> None:
    monitor.touch()  # as a first poll would: leave the idle rate
    await wait_until(lambda: len(monitor.history) >= 3)
    ws = await jp_ws_fetch(*WS)
    first = await read(ws)
    assert first["type"] == "samples" and first["history"] is True
    assert first["interval"] == pytest.approx(0.1)
    assert len(first["samples"]) >= 3, "a reloaded page gets the server's history"
    assert first["samples"][0]["host"]["cpu_percent"] is not None
    seen = [s["t"] for s in first["samples"]]
    for _ in range(5):
        message = await read(ws)
        assert message["history"] is False
        seen += [s["t"] for s in message["samples"]]
    assert seen == sorted(seen) and len(seen) == len(set(seen)), (
        "no sample twice, none reordered"
    )
    assert len(seen) >= len(first["samples"]) + 5
    ws.close()


async def test_three_sockets_share_one_encoding(
    jp_ws_fetch: Any, jp_serverapp: Any, monitor: Any, monkeypatch: Any
) -> None:
    hub = jp_serverapp.web_app.settings["torchlens_broadcaster"]
    sockets = [await jp_ws_fetch(*WS) for _ in range(3)]
    for ws in sockets:
        await read(ws)  # history
    assert monitor.watchers == 3
    encodes = []
    original = hub.encode
    monkeypatch.setattr(
        hub, "encode", lambda *a, **k: encodes.append(a) or original(*a, **k)
    )
    start = hub.messages_sent
    await wait_until(lambda: hub.messages_sent >= start + 3)
    monkeypatch.setattr(hub, "encode", original)
    broadcasts = hub.messages_sent - start
    assert len(encodes) == broadcasts, "one encode per broadcast, not per socket"
    monitor.set_interval(60)  # one more sample now, then quiet: the sockets can drain
    await asyncio.sleep(0.3)
    newest = []
    for ws in sockets:  # every socket got every broadcast, up to the newest sample
        seen: list[float] = []
        while True:
            try:
                seen += [s["t"] for s in (await read(ws, timeout=0.3))["samples"]]
            except asyncio.TimeoutError:
                break
        newest.append(seen[-1])
    assert newest == [monitor.history.tail(0)[0][-1].t] * 3
    for ws in sockets:
        ws.close()
    await wait_until(lambda: monitor.watchers == 0)


async def test_ranks_are_pushed(jp_ws_fetch: Any, jp_fetch: Any, monitor: Any) -> None:
    ws = await jp_ws_fetch(*WS)
    await read(ws)
    body = {"run": "ddp", "samples": [
        {"rank": 1, "t": time.time(), "allocated": 5},
        {"rank": 0, "t": time.time(), "allocated": 5, "reserved": 8,
         "inactive_split": 2, "largest_free": 1, "source": "cuda"}]}
    await jp_fetch(
        "torchlens", "monitor", "ranks", method="POST", body=json.dumps(body)
    )
    for _ in range(20):
        message = await read(ws)
        if message["ranks"]:
            plain, profiled = message["ranks"]
            assert [(r["run"], r["rank"]) for r in (plain, profiled)] == [
                ("ddp", 1), ("ddp", 0)]
            # the allocator figures travel to the sidebar; absent ones as null
            assert [plain[k] for k in ("inactive_split", "largest_free", "source")] == [
                None, None, None]
            assert [profiled[k] for k in ("inactive_split", "largest_free", "source")] == [
                2, 1, "cuda"]
            break
    else:
        pytest.fail("the posted rank sample never arrived")
    ws.close()


async def test_pause_resume_fills_the_gap_and_interval_message(
    jp_ws_fetch: Any, monitor: Any
) -> None:
    ws = await jp_ws_fetch(*WS)
    last = (await read(ws))["samples"][-1]["t"]
    await ws.write_message(json.dumps({"pause": True}))
    await wait_until(lambda: monitor.watchers == 0)
    # drain what was in flight before the pause landed
    while True:
        try:
            message = await read(ws, timeout=0.5)
        except asyncio.TimeoutError:
            break
        last = max([last, *(s["t"] for s in message["samples"])])
    taken = monitor.samples_taken
    await wait_until(lambda: monitor.samples_taken >= taken + 3)
    with pytest.raises(asyncio.TimeoutError):
        await read(ws, timeout=0.3)  # paused: nothing sent
    await ws.write_message(json.dumps({"pause": False, "since": last}))
    gap = await read(ws)
    assert gap["history"] is True and len(gap["samples"]) >= 3
    assert all(s["t"] > last for s in gap["samples"])
    assert monitor.watchers == 1

    await ws.write_message(json.dumps({"interval": 0.25}))
    await wait_until(lambda: monitor.interval == 0.25)
    ws.close()


async def test_open_socket_keeps_full_rate_closing_lets_it_idle(
    jp_ws_fetch: Any, monitor: Any
) -> None:
    monitor.idle_after = 0.2
    ws = await jp_ws_fetch(*WS)
    await read(ws)
    await asyncio.sleep(0.5)
    assert not monitor.idle, "a watching socket is not idle, however long it waits"
    ws.close()
    await wait_until(lambda: monitor.watchers == 0)
    await wait_until(lambda: monitor.idle, timeout=2)
    assert monitor.current_interval() == monitor.idle_interval


async def test_reconnect_with_since_gets_only_the_gap(
    jp_ws_fetch: Any, monitor: Any
) -> None:
    ws = await jp_ws_fetch(*WS)
    history = (await read(ws))["samples"]
    ws.close()
    await wait_until(lambda: len(monitor.history) >= len(history) + 2)
    since = history[-1]["t"]
    ws = await jp_ws_fetch(*WS, params={"since": str(since)})
    gap = (await read(ws))["samples"]
    assert gap and all(s["t"] > since for s in gap)
    ws.close()


def test_history_tail_by_sequence_number() -> None:
    h = History(seconds=100, max_items=4)
    assert h.tail(0) == ([], 0)
    for t in range(1, 7):
        h.append(RankSample(t=float(t), run="r", rank=0))
    items, seq = h.tail(0)
    assert seq == 6 and [i.t for i in items] == [3, 4, 5, 6], "evicted ones are gone"
    assert [i.t for i in h.tail(4)[0]] == [5, 6]
    assert [i.t for i in h.tail(2, upto=5)[0]] == [3, 4, 5]
    assert h.tail(6) == ([], 6) and h.tail(0, upto=1) == ([], 6)


class TestUserBaseUrl:
    @pytest.fixture
    def jp_base_url(self) -> str:
        return "/user/alice/"

    async def test_socket_lives_under_the_base_url(
        self, jp_ws_fetch: Any, monitor: Any
    ) -> None:
        ws = await jp_ws_fetch(*WS)
        assert (await read(ws))["history"] is True
        assert (await read(ws))["history"] is False
        ws.close()
        with pytest.raises(HTTPClientError) as err:
            await jp_ws_fetch(*WS, headers={"Authorization": ""})
        assert err.value.code == 403

"""The end-of-run hold of ``torchlens run --metrics`` counts only Prometheus's scrapes,
and ``--metrics-token-file`` reads a token the user keeps across runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from torchlens.frontends.ranks.metrics_endpoint import MetricsEndpoint, read_token
from torchlens.model import InputError

from .helpers import REPO, env
from .test_metrics_endpoint import _Collector, _get

PROMETHEUS_UA = "Prometheus/2.42.0"


def _scrape(url: str, token: str, agent: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}",
                                                   "User-Agent": agent})
    with urllib.request.urlopen(request, timeout=10) as r:
        r.read()
        return r.status


def test_a_poller_that_is_not_prometheus_neither_ends_the_hold_nor_sets_its_length(
        tmp_path: Path) -> None:
    endpoint = MetricsEndpoint("127.0.0.1", 0, str(tmp_path))
    collector = _Collector()
    collector.send(0, 5)
    collector.send(1, 5)
    endpoint.tick(collector, None)
    token = endpoint.token
    stop = threading.Event()
    polled: list[int] = []

    def poll() -> None:  # a user's curl loop: every 0.1 s, with the token
        while not stop.is_set():
            try:
                polled.append(_scrape(endpoint.url, token, "curl/8.5.0"))
            except OSError:
                return
            time.sleep(0.1)

    try:
        a0 = time.monotonic()
        _scrape(endpoint.url, token, PROMETHEUS_UA)
        a1 = time.monotonic()
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        time.sleep(1.5)
        b0 = time.monotonic()
        _scrape(endpoint.url, token, PROMETHEUS_UA)  # Prometheus scrapes every 1.5 s
        b1 = time.monotonic()
        # the server counts a scrape once its answer is written, which can be just
        # after the client has read it: give its thread a moment
        deadline = time.monotonic() + 5
        while endpoint.linger_s() == 0.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        linger = endpoint.linger_s()
        # the interval is Prometheus's (about 1.5 s), not the poller's 0.1 s
        # two intervals and a second: one late scrape does not lose the final view
        assert 2 * (b0 - a1) + 1.0 <= linger <= 2 * (time.monotonic() - a0) + 1.0, (
            linger, a0, a1, b0, b1)
        assert linger >= 3.9, linger
        endpoint.tick(collector, endpoint.view)  # the final view: the hold waits for its scrape
        t0 = time.monotonic()
        endpoint.close(linger=True)  # the poller's GETs do not end it
        held = time.monotonic() - t0
    finally:
        stop.set()
    assert held >= 3.7, held
    assert polled and set(polled) == {200}  # a plain client still gets the figures


def test_a_prometheus_scrape_of_the_final_view_ends_the_hold(tmp_path: Path) -> None:
    endpoint = MetricsEndpoint("127.0.0.1", 0, str(tmp_path))
    collector = _Collector()
    endpoint.tick(collector, None)
    _scrape(endpoint.url, endpoint.token, PROMETHEUS_UA)
    time.sleep(5)
    _scrape(endpoint.url, endpoint.token, PROMETHEUS_UA)
    endpoint.tick(collector, endpoint.view)
    threading.Timer(0.5, _scrape, (endpoint.url, endpoint.token, PROMETHEUS_UA)).start()
    t0 = time.monotonic()
    endpoint.close(linger=True)
    assert time.monotonic() - t0 < 3.0


def _token(path: Path, text: str = "s3cret-token\n", mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_a_token_file_of_the_user_is_read_and_kept(tmp_path: Path) -> None:
    token_file = _token(tmp_path / "prom.token")
    run_dir = tmp_path / "exp1"
    run_dir.mkdir()
    endpoint = MetricsEndpoint("127.0.0.1", 0, str(run_dir), token_file=str(token_file))
    try:
        endpoint.tick(_Collector(), None)
        assert endpoint.token_path == str(token_file)
        assert _get(endpoint.url, "s3cret-token")[0] == 200  # Prometheus strips the newline too
        assert _get(endpoint.url, "other")[0] == 401
        assert not (run_dir / "metrics.token").exists()
    finally:
        endpoint.close()
    assert token_file.read_text() == "s3cret-token\n"  # never deleted nor rewritten


@pytest.mark.parametrize(("text", "mode", "words"), [
    (None, 0o600, "does not exist"),
    ("  \n", 0o600, "is empty"),
    ("tok", 0o640, "readable by group or others"),
    ("tok", 0o604, "readable by group or others"),
])
def test_a_bad_token_file_is_refused_in_one_line(tmp_path: Path, text: str | None, mode: int,
                                                 words: str) -> None:
    path = tmp_path / "prom.token"
    if text is not None:
        _token(path, text, mode)
    with pytest.raises(InputError, match=words) as caught:
        read_token(str(path))
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"--metrics-token-file {path}")


def test_run_refuses_a_shared_token_file_before_the_job_starts(tmp_path: Path) -> None:
    token_file = _token(tmp_path / "prom.token", "tok", 0o644)
    mark = tmp_path / "started"
    done = subprocess.run(
        [sys.executable, "-m", "torchlens", "run", "--out", str(tmp_path / "run"),
         "--metrics", "0", "--metrics-token-file", str(token_file), "--", "touch", str(mark)],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "readable by group or others" in done.stderr
    assert not mark.exists() and token_file.read_text() == "tok"


def test_a_token_file_without_metrics_is_refused(tmp_path: Path) -> None:
    token_file = _token(tmp_path / "prom.token", "tok")
    done = subprocess.run(
        [sys.executable, "-m", "torchlens", "run", "--out", str(tmp_path / "run"),
         "--metrics-token-file", str(token_file), "--", "true"],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert "--metrics-token-file is for --metrics" in done.stderr


def test_an_answer_of_the_older_view_written_after_the_last_tick_does_not_end_the_hold(
        tmp_path: Path) -> None:
    # a scrape that read the view before the final tick, but whose answer was written
    # after it, is not a scrape of the final view: the hold goes on to the next one
    endpoint = MetricsEndpoint("127.0.0.1", 0, str(tmp_path))
    collector = _Collector()
    endpoint.tick(collector, None)
    _scrape(endpoint.url, endpoint.token, PROMETHEUS_UA)
    time.sleep(1.0)
    began = time.monotonic()  # this scrape reads the older view ...
    endpoint.tick(collector, endpoint.view)  # ... the final view lands ...
    endpoint.scraped(PROMETHEUS_UA, began)  # ... and then its answer is counted
    threading.Timer(1.0, _scrape, (endpoint.url, endpoint.token, PROMETHEUS_UA)).start()
    t0 = time.monotonic()
    endpoint.close(linger=True)
    held = time.monotonic() - t0
    assert 0.9 <= held < 2.0, held  # ended by the Timer's scrape, not at once

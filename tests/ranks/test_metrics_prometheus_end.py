"""How a ``torchlens run --metrics`` job ended reaches a real Prometheus:
a rank that raises is ``failed`` in Prometheus even while a user polls ``/metrics`` with
the token (the poll had ended the end-of-run hold before Prometheus's next scrape), and a
token file of the user's serves every run with one scrape config.

Needs Debian's ``prometheus`` package, as tests/ranks/test_metrics_prometheus.py does.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from .helpers import free_port, torchrun_args
from .prometheus_server import Prometheus, binary, wait_for
from .test_metrics_prometheus import _MetricsCollector

pytestmark = pytest.mark.timeout(400)

#: Prometheus's scrape interval here: the walk's (its poller asked every second)
SCRAPE_S = 15


def _job(name: str, port: int, token_file: Path) -> str:
    return (f"  - job_name: {name}\n    scrape_interval: {SCRAPE_S}s\n"
            f"    scrape_timeout: {SCRAPE_S - 1}s\n"
            f"    authorization:\n      type: Bearer\n      credentials_file: {token_file}\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")


def _poll(url: str, token_file: Path, stop: threading.Event) -> None:
    """A user's ``curl -H "Authorization: Bearer $(cat metrics.token)"`` every 0.3 s."""
    while not stop.is_set():
        try:
            request = urllib.request.Request(url, headers={
                "Authorization": f"Bearer {token_file.read_text().strip()}"})
            urllib.request.urlopen(request, timeout=2).read()
        except OSError:
            pass
        time.sleep(0.3)


def test_a_raising_rank_reaches_prometheus_as_failed_despite_a_poller(tmp_path: Path) -> None:
    binary("prometheus")
    out = tmp_path / "exp3"
    port = free_port()
    fail = tmp_path / "fail-now"
    c = _MetricsCollector(out, str(port), torchrun_args(1, 2, free_port()), TL_STEPS="5000",
                          TL_SLOW_S="0.0", TL_STEP_SLEEP="0.05", TL_FAIL_WHEN=str(fail))
    prom = None
    stop = threading.Event()
    try:
        c.wait_line("torchlens run: metrics at")
        token_file = out / "metrics.token"
        prom = Prometheus(tmp_path, [_job("torchlens", port, token_file)])
        threading.Thread(target=_poll, args=(f"http://127.0.0.1:{port}/metrics", token_file,
                                             stop), daemon=True).start()
        # Prometheus has scraped twice (the hold knows its interval) with both ranks up
        wait_for("two scrapes of both ranks up", lambda: len(prom.query(
            'count_over_time(torchlens_rank_state{state="up"}[1m]) >= 2 '
            'and torchlens_rank_state{state="up"} == 1')) == 2)
        # rank 1 raises just after a scrape: the job ends before the next one (the walk's
        # case, where only the hold could let Prometheus see how it ended)
        wait_for("a fresh scrape", lambda: float(prom.query(
            'time() - timestamp(up{job="torchlens"})')[0]["value"][1]) < 1.0, 30)
        fail.touch()
        assert c.wait() != 0
        # the run's last scrape is its final view: rank 1 failed, rank 0 no longer up
        (failed,) = prom.query('last_over_time(torchlens_rank_state{rank="1",state="failed"}[5m])')
        assert failed["value"][1] == "1", failed
        (up,) = prom.query('last_over_time(torchlens_rank_state{rank="0",state="up"}[5m])')
        assert up["value"][1] == "0", up
        # the shipped alert sees it (its rule's expression, as Prometheus evaluates it)
        rules = (Path(__file__).parents[2] / "torchlens" / "frontends" / "metrics_files"
                 / "torchlens-rules.yml").read_text()
        expr = next(line.split("expr: ", 1)[1] for line in rules.splitlines()
                    if "torchlens_rank_state{state=~" in line)
        firing = {r["metric"]["rank"]: r["metric"]["state"] for r in prom.query(expr)}
        assert firing.get("1") == "failed", firing  # (rank 0 too, gloo: it saw its peer go)
    finally:
        stop.set()
        if prom is not None:
            prom.stop()
        c.kill()


def test_one_token_file_and_scrape_config_serve_run_after_run(tmp_path: Path) -> None:
    binary("prometheus")
    token_file = tmp_path / "torchlens.token"
    token_file.write_text("a-token-of-mine\n")
    os.chmod(token_file, 0o600)
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("scrape_configs:\n" + _job("torchlens", port, token_file))
    # the config is valid with no run active (a RUN_DIR/metrics.token is not)
    checked = subprocess.run([binary("promtool"), "check", "config", str(config)],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    prom = Prometheus(tmp_path, [_job("torchlens", port, token_file).replace(
        f"scrape_interval: {SCRAPE_S}s", "scrape_interval: 1s").replace(
        f"scrape_timeout: {SCRAPE_S - 1}s", "scrape_timeout: 1s")])
    try:
        for name in ("run1", "run2"):
            c = _MetricsCollector(tmp_path / name, str(port), torchrun_args(1, 2, free_port()),
                                  TL_STEPS="60", TL_SLOW_S="0.0", TL_STEP_SLEEP="0.1",
                                  extra_args=["--metrics-token-file", str(token_file)])
            try:
                c.wait_line("torchlens run: metrics at")
                assert not (tmp_path / name / "metrics.token").exists()
                wait_for(f"{name}'s ranks in Prometheus", lambda n=name: len(prom.query(
                    f'torchlens_world_size{{run="{n}"}}')) == 1)
                assert c.wait() == 0, c.output
            finally:
                c.kill()
            assert token_file.read_text() == "a-token-of-mine\n"  # kept for the next run
    finally:
        prom.stop()

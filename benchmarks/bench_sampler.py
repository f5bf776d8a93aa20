"""GPU monitor cost: server CPU at 1, 2, 10 Hz with 3 clients, and sample->drawn latency.

Why measured this way: the cost that matters is what the Jupyter server
process pays, so the script starts a real ``jupyter server`` with the torchlens
extension, attaches 3 clients that do exactly what the sidebar does (hold
the monitor's WebSocket ``torchlens/monitor/ws`` open, authenticated with the
server's token, and read every pushed sample) and reads the server process's
CPU time (user+system, psutil) over a window. A server without the
extension, with no clients, is the baseline. ``--compare-poll`` also
measures 3 long-polling clients (``samples?since=..&wait=10``, the sidebar's
fallback and the previous transport) at the same rates.

Latency: a real JupyterLab in Debian Chromium; the panel stamps
``data-latency-ms`` (now - sample time) in the animation frame after drawing.

``--nvd-python PY`` also measures jupyterlab-nvdashboard's server (installed in
its own venv, never the project's: ``scripts/bench-env`` makes
``.bench-venv-nvd``, which is the default, as is ``$TORCHLENS_BENCH_NVD_PYTHON``;
``--no-nvd`` leaves it out) with 3 WebSocket clients on its CPU endpoint (the
only one it registers without a GPU).

    python benchmarks/bench_sampler.py [--seconds 20] [--compare-poll] [--nvd-python PY | --no-nvd] [--no-latency]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import paths
import psutil

CLIENTS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    python: str, extensions: dict[str, bool], settings: dict[str, Any], tmp: Path
) -> tuple[subprocess.Popen[bytes], str, str]:
    """A bare ``jupyter server`` with exactly ``extensions`` enabled; returns (proc, url, token)."""
    port, token = free_port(), secrets.token_hex(8)
    (tmp / "config").mkdir(parents=True, exist_ok=True)
    (tmp / "root").mkdir(exist_ok=True)
    config = {
        "ServerApp": {"jpserver_extensions": extensions, "tornado_settings": settings}
    }
    (tmp / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "rt"),
    }
    cmd = [python, "-m", "jupyter_server", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp / 'root'}"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}/"
    for _ in range(300):
        try:
            req = urllib.request.Request(
                url + "api/status", headers={"Authorization": f"token {token}"}
            )
            urllib.request.urlopen(req, timeout=2).close()
            return proc, url, token
        except OSError:
            time.sleep(0.3)
    stop(proc)
    raise RuntimeError("server did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def cpu_percent(pid: int, seconds: float) -> float:
    """Percent of one core used by ``pid`` (and its threads) over ``seconds``."""
    proc = psutil.Process(pid)
    before = proc.cpu_times()
    time.sleep(seconds)
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / seconds


def torchlens_ws_clients(
    url: str, token: str, done: threading.Event
) -> list[threading.Thread]:
    """3 WebSocket clients, like 3 sidebar tabs: history on connect, then every push."""
    from tornado.httpclient import HTTPRequest
    from tornado.ioloop import IOLoop
    from tornado.websocket import websocket_connect

    ws_url = url.replace("http", "ws", 1) + "torchlens/monitor/ws"

    async def client() -> None:
        request = HTTPRequest(ws_url, headers={"Authorization": f"token {token}"})
        conn = await websocket_connect(request, max_message_size=64 * 2**20)
        while not done.is_set() and await conn.read_message() is not None:
            pass
        conn.close()

    threads = [
        threading.Thread(target=lambda: IOLoop().run_sync(client), daemon=True)
        for _ in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    return threads


def torchlens_poll_clients(
    url: str, token: str, done: threading.Event
) -> list[threading.Thread]:
    """3 long-polling clients: the sidebar's fallback when no socket gets through."""

    def client() -> None:
        since = 0.0
        while not done.is_set():
            req = urllib.request.Request(
                f"{url}torchlens/monitor/samples?since={since}&wait=10",
                headers={"Authorization": f"token {token}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    samples = json.load(r)["samples"]
            except OSError:  # the server is being stopped
                return
            if samples:
                since = samples[-1]["t"]

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    return threads


def nvd_clients(url: str, token: str, done: threading.Event) -> list[threading.Thread]:
    """3 clients on nvdashboard's CPU WebSocket: without a GPU it registers no GPU endpoints."""
    from tornado.ioloop import IOLoop
    from tornado.websocket import websocket_connect

    ws = url.replace("http", "ws")

    async def client() -> None:
        conn = await websocket_connect(f"{ws}nvdashboard/cpu_resource?token={token}")
        while not done.is_set() and await conn.read_message() is not None:
            pass
        conn.close()

    threads = [
        threading.Thread(target=lambda: IOLoop().run_sync(client), daemon=True)
        for _ in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    return threads


def measure(
    python: str,
    extensions: dict[str, bool],
    settings: dict[str, Any],
    clients: Any,
    seconds: float,
) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, token = start_server(python, extensions, settings, Path(tmp))
        done = threading.Event()
        try:
            if clients is not None:
                clients(url, token, done)
            time.sleep(3)  # warm-up: first samples, connections set up
            return cpu_percent(proc.pid, seconds)
        finally:
            done.set()
            stop(proc)


def browser_latency(seconds: float) -> list[float]:
    """sample->drawn latencies (ms) seen by the sidebar in Chromium."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
    from lab_harness import CHROMIUM, CHROMIUM_FLAGS, start_lab, stop_lab
    from playwright.sync_api import sync_playwright

    values: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        lab = start_lab(Path(tmp) / "lab")
        try:
            with sync_playwright() as pw:
                ctx = pw.chromium.launch_persistent_context(
                    str(Path(tmp) / "profile"),
                    executable_path=CHROMIUM,
                    args=CHROMIUM_FLAGS,
                )
                page = ctx.new_page()
                page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
                page.locator('.lm-TabBar-tab[data-id="torchlens-gpu-monitor"]').click()
                page.locator(
                    "#torchlens-gpu-monitor .tl-footer[data-samples]"
                ).wait_for(timeout=30_000)
                last, end = None, time.monotonic() + seconds
                while time.monotonic() < end:
                    count = page.locator(
                        "#torchlens-gpu-monitor .tl-footer"
                    ).get_attribute("data-samples")
                    if count != last:
                        page.wait_for_timeout(50)  # let the animation frame stamp it
                        values.append(
                            float(
                                page.locator("#torchlens-gpu-monitor").get_attribute(
                                    "data-latency-ms"
                                )
                                or "nan"
                            )
                        )
                        last = count
                    page.wait_for_timeout(100)
                ctx.close()
        finally:
            stop_lab(lab)
    return values[1:]  # the first one is the history load, not a live sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--nvd-python",
        help="python of a venv with jupyterlab-nvdashboard (default: "
        "$TORCHLENS_BENCH_NVD_PYTHON, else .bench-venv-nvd's when scripts/bench-env made it)",
    )
    parser.add_argument("--no-nvd", action="store_true", help="leave nvdashboard out")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument(
        "--compare-poll",
        action="store_true",
        help="also measure 3 long-polling clients (the fallback)",
    )
    parser.add_argument(
        "--skip-torchlens", action="store_true", help="only nvdashboard / latency"
    )
    args = parser.parse_args()
    args.nvd_python = None if args.no_nvd else paths.nvd_python(args.nvd_python)
    py = sys.executable
    print(
        f"machine: {psutil.cpu_count()} cores; window {args.seconds:.0f} s; {CLIENTS} clients"
    )
    if not args.skip_torchlens:
        base = measure(py, {"torchlens": False}, {}, None, args.seconds)
        print(f"jupyter server, no extension, no clients: {base:.2f}% of one core")
        kinds = [("WebSocket", torchlens_ws_clients)]
        if args.compare_poll:
            kinds.append(("long-poll", torchlens_poll_clients))
        for kind, clients in kinds:
            for hz in (1, 2, 10):
                settings = {"torchlens_monitor_interval": 1 / hz}
                cpu = measure(py, {"torchlens": True}, settings, clients, args.seconds)
                print(
                    f"torchlens {hz:>2} Hz, {CLIENTS} {kind} clients: {cpu:.2f}% of one core (server total; {cpu - base:+.2f} over baseline)"
                )
        busy = {"torchlens_monitor_interval": 0.5, "torchlens_monitor_idle_after": 1e9}
        sampling = measure(py, {"torchlens": True}, busy, None, args.seconds)
        print(
            f"torchlens  2 Hz, sampling only (no clients, idling disabled): {sampling:.2f}% of one core"
        )
        idle = measure(py, {"torchlens": True}, {}, None, args.seconds)
        print(f"torchlens, nobody watching (idle rate 0.1 Hz): {idle:.2f}% of one core")
    if args.nvd_python:
        nvd_base = measure(
            args.nvd_python, {"jupyterlab_nvdashboard": False}, {}, None, args.seconds
        )
        cpu = measure(
            args.nvd_python,
            {"jupyterlab_nvdashboard": True},
            {},
            nvd_clients,
            args.seconds,
        )
        print(
            f"nvdashboard venv, no extension: {nvd_base:.2f}%; nvdashboard, {CLIENTS} clients on cpu_resource (1 Hz each): {cpu:.2f}% of one core"
        )
    if not args.no_latency:
        lat = sorted(browser_latency(15))
        if lat:
            print(
                f"sample->drawn latency in Chromium (1 Hz, n={len(lat)}): median {lat[len(lat) // 2]:.0f} ms, max {lat[-1]:.0f} ms"
            )


if __name__ == "__main__":
    main()

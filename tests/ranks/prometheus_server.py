"""A real Prometheus for the tests (Debian's ``prometheus`` package), shared by the tests of
``torchlens run --metrics`` (tests/ranks) and of the Jupyter server's /metrics (tests/server).

Without /usr/bin/prometheus or promtool a test that needs them skips, saying how to get them;
under CI=true it fails instead (``scripts/setup test`` installs the package there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .helpers import free_port


def binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing: scripts/setup test installs Debian's prometheus package")
        pytest.skip(f"{name} is not installed (apt-get install prometheus, or scripts/setup test)")
    return path


#: a scrape job: (name, "host:port", bearer token file or None), or a job's YAML as written
#: under ``scrape_configs:`` (indented two spaces, starting "  - job_name:")
Job = tuple[str, str, str | None] | str


class Prometheus:
    """A real Prometheus on a free loopback port, scraping its jobs every second."""

    def __init__(self, tmp: Path, jobs: list[Job]) -> None:
        config = tmp / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                          "  evaluation_interval: 1s\nscrape_configs:\n"
                          + "".join(map(_job_yaml, jobs)))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=open(log, "w"))  # noqa: SIM115
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).close()
                return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise AssertionError("prometheus did not start: " + log.read_text())

    def query(self, expr: str) -> list[dict]:
        """An instant query's result (asserting Prometheus accepted the expression)."""
        return self.query_data(expr)["result"]

    def query_data(self, expr: str) -> dict[str, Any]:
        """An instant query's ``data``: ``resultType`` and ``result``."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def label_values(self, label: str, selector: str) -> list[str]:
        url = (f"{self.url}/api/v1/label/{label}/values?"
               + urllib.parse.urlencode({"match[]": selector}))
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)["data"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def _job_yaml(job: Job) -> str:
    if isinstance(job, str):
        return job if job.endswith("\n") else job + "\n"
    name, target, token_file = job
    text = f"  - job_name: {name}\n    static_configs:\n      - targets: ['{target}']\n"
    if token_file:
        text += f"    authorization:\n      type: Bearer\n      credentials_file: {token_file}\n"
    return text


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180) -> Any:
    """``check()``'s first truthy answer, asked every half second (180 s: on a loaded
    machine torchrun, its ranks' imports and Prometheus' start took over 90 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout} s")

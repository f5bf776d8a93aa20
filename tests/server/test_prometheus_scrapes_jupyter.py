"""A real Prometheus scrapes the Jupyter server's /metrics with the server's token, through
the scrape config docs/METRICS.md shows: torchlens's GPU series (fake NVML, installed before
the server starts so every sample and scrape sees it), a notebook run posted the way
``%ddp_check --profile --metrics`` posts it, ``up == 0`` for a scrape without the token, and
every GPU panel and variable of the shipped Grafana dashboard evaluated against it.

Needs Debian's ``prometheus`` package (skips without it, fails under CI=true).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path
from typing import Any

import pynvml
import pytest
from fake_monitor import install_fake_gpus
from fake_nvml import gpu
from ranks.prometheus_server import Prometheus, binary, wait_for
from test_notebook_metrics import _publisher, _straggler

from torchlens.frontends.shared.metrics_publish import MetricsFeed

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "METRICS.md"
DASHBOARD = REPO / "torchlens" / "frontends" / "metrics_files" / "torchlens-dashboard.json"
GIB = 2**30

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def jp_base_url() -> str:
    """A server under a base_url, as the doc's scrape config allows for."""
    return "/jl/"


@pytest.fixture
def jp_server_config(jp_server_config: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The extension's monitor samples two fake GPUs from its first sample on (one has no
    utilisation counter: NVML answers NOT_SUPPORTED)."""
    binary("prometheus")  # skip before a server starts

    install_fake_gpus(monkeypatch, [gpu("GPU-a", temp=61),
                                    gpu("GPU-b", util=pynvml.NVMLError_NotSupported)])
    return jp_server_config


def _doc_job(target: str, metrics_path: str, token_file: Path) -> str:
    """docs/METRICS.md's scrape job for the Jupyter server, pointed at this server."""
    (block,) = re.findall(r"```yaml\n(  - job_name: jupyter\n.*?)```", DOC.read_text(), re.S)
    for old, new in (("/metrics      #", f"{metrics_path}      #"),
                     ("/path/to/jupyter.token", str(token_file)),
                     ('"127.0.0.1:8888"', f'"{target}"')):
        assert block.count(old) == 1, (old, block)
        block = block.replace(old, new)
    assert "type: token" in block
    return block


def _by(results: list[dict], label: str) -> dict[str, float]:
    return {r["metric"][label]: float(r["value"][1]) for r in results}


async def _query(prom: Prometheus, what: str, expr: str, timeout: float = 60) -> list[dict]:
    """``expr``'s result once non-empty (off the loop: the server must answer the scrapes)."""
    return await asyncio.to_thread(wait_for, what, lambda: prom.query(expr), timeout)


async def test_prometheus_scrapes_the_jupyter_server(jp_fetch: Any, jp_serverapp: Any,
                                                     monitor: Any, tmp_path: Path) -> None:
    # jp_fetch: its fixture is what makes the server listen on app.port
    app = jp_serverapp
    monitor.sample_once()
    token_file = tmp_path / "jupyter.token"
    token_file.write_text(app.identity_provider.token)
    target, path = f"127.0.0.1:{app.port}", f"{app.base_url}metrics"
    no_token = (f"  - job_name: no-token\n    metrics_path: {path}\n"
                f"    static_configs:\n      - targets: ['{target}']\n")
    # a notebook run, posted with the server's token as %ddp_check --profile --metrics does
    feed = MetricsFeed("cell-20250101-1200-42", 2, _publisher(app))
    _straggler(feed)
    await asyncio.to_thread(feed.flush)
    assert feed.sent == 1 and feed.trouble() == "", feed.trouble()

    prom = await asyncio.to_thread(Prometheus, tmp_path, [_doc_job(target, path, token_file),
                                                          no_token])
    try:
        await _query(prom, "both scrapes", 'count(up{job=~"jupyter|no-token"}) == 2')
        up = _by(prom.query("up"), "job")
        assert up == {"jupyter": 1, "no-token": 0}, up
        # the fake GPUs: 10 GiB used of 40 GiB each; GPU 1 has no utilisation counter
        used = _by(await _query(prom, "GPU memory", 'torchlens_gpu_memory_used_bytes{job="jupyter"}'),
                   "gpu")
        assert used == {"0": 10 * GIB, "1": 10 * GIB}
        total = _by(prom.query('torchlens_gpu_memory_total_bytes{job="jupyter"}'), "gpu")
        assert total == {"0": 40 * GIB, "1": 40 * GIB}
        assert _by(prom.query("torchlens_gpu_utilization_ratio"), "gpu") == {"0": 0.42}
        assert _by(prom.query("torchlens_gpu_temperature_celsius"), "gpu") == {"0": 61, "1": 55}
        assert _by(prom.query("torchlens_gpu_power_watts"), "gpu") == {"0": 250, "1": 250}
        # the notebook run: the slow rank and its cause, steps per rank
        (slow,) = prom.query('torchlens_slow_rank{job="jupyter"} == 1')
        assert {k: slow["metric"][k] for k in ("run", "rank", "cause", "host")} == {
            "run": "cell-20250101-1200-42", "rank": "1", "cause": "data", "host": "gpu7"}
        assert _by(prom.query('torchlens_steps_total{job="jupyter"}'), "rank") == {"0": 12, "1": 12}
        # nothing came through the scrape without the token
        assert prom.query('{job="no-token", __name__=~"torchlens_.*"}') == []
        await asyncio.to_thread(_gpu_panels_evaluate, prom)
    finally:
        await asyncio.to_thread(prom.stop)


def _gpu_panels_evaluate(prom: Prometheus) -> None:
    """Every GPU variable and panel expression of the dashboard, with the values its
    variables offer, is a non-empty instant vector of finite numbers."""
    dash = json.loads(DASHBOARD.read_text())
    values: dict[str, str] = {}
    gpu_vars = [v for v in dash["templating"]["list"] if "torchlens_gpu_" in v.get("definition", "")]
    assert [v["name"] for v in gpu_vars] == ["host", "gpu"]
    for var in gpu_vars:
        selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", var["definition"]).groups()
        for name, value in values.items():
            selector = selector.replace(f"${name}", value)
        offered = prom.label_values(label, selector)
        assert offered, var["definition"]
        values[var["name"]] = offered[0]  # Grafana's default pick
    assert values["gpu"] == "0"
    panels = [p for p in dash["panels"] if any("torchlens_gpu_" in t["expr"] for t in p["targets"])]
    families = {re.match(r"\w+", t["expr"]).group() for p in panels for t in p["targets"]}
    assert families == {"torchlens_gpu_utilization_ratio", "torchlens_gpu_memory_used_bytes",
                        "torchlens_gpu_memory_total_bytes", "torchlens_gpu_temperature_celsius",
                        "torchlens_gpu_power_watts", "torchlens_gpu_power_limit_watts"}
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            for name in ("host", "gpu"):  # one value (Grafana's pick), then All
                assert f"${name}" in expr, expr
            for concrete in (expr.replace("$host", values["host"]).replace("$gpu", values["gpu"]),
                             expr.replace("$host", ".*").replace("$gpu", ".*")):
                data = prom.query_data(concrete)
                assert data["resultType"] == "vector" and data["result"], (panel["title"], concrete)
                assert all(math.isfinite(float(r["value"][1])) for r in data["result"]), data

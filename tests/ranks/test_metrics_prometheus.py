"""The shipped rules and dashboard, and ``torchlens run --metrics`` scraped by a real Prometheus.

Needs Debian's ``prometheus`` package (/usr/bin/prometheus, /usr/bin/promtool;
``scripts/setup test`` installs it where it can): without it these tests skip,
except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from .helpers import REPO, Collector, env, free_port, processes_of_run, torchrun_args

FILES = REPO / "torchlens" / "frontends" / "metrics_files"
RULES_TEST = Path(__file__).with_name("metrics_rules_test.yml")

pytestmark = pytest.mark.timeout(400)


def _binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing: scripts/setup test installs Debian's prometheus package")
        pytest.skip(f"{name} is not installed (apt-get install prometheus, or scripts/setup test)")
    return path


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "torchlens", *args], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def test_cli_prints_the_shipped_rules_and_dashboard() -> None:
    assert _cli("metrics", "rules") == (FILES / "torchlens-rules.yml").read_text()
    dash = json.loads(_cli("metrics", "dashboard"))
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"job", "run", "rank"} <= set(variables)
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
    # not git-ignored: the wheel (hatch: every file under torchlens/) ships them
    ignored = subprocess.run(["git", "check-ignore", *map(str, FILES.iterdir())], cwd=REPO,
                             capture_output=True, text=True)
    assert ignored.stdout == ""


def test_promtool_checks_and_unit_tests_every_alert(tmp_path: Path) -> None:
    promtool = _binary("promtool")
    rules = tmp_path / "torchlens-rules.yml"
    rules.write_text(_cli("metrics", "rules"))
    checked = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    tested = subprocess.run([promtool, "test", "rules", str(tmp_path / RULES_TEST.name)],
                            capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # every alert has a unit test
    alerts = set(re.findall(r"- alert: (\w+)", rules.read_text()))
    covered = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert alerts and alerts == covered


class _Prometheus:
    """A real Prometheus on a free loopback port, scraping ``targets`` every second."""

    def __init__(self, tmp: Path, targets: list[tuple[str, str, str | None]]) -> None:
        jobs = []
        for name, target, token_file in targets:
            job = (f"  - job_name: {name}\n    scrape_interval: 1s\n    scrape_timeout: 1s\n"
                   f"    static_configs:\n      - targets: ['{target}']\n")
            if token_file:
                job += (f"    authorization:\n      type: Bearer\n"
                        f"      credentials_file: {token_file}\n")
            jobs.append(job)
        config = tmp / "prometheus.yml"
        config.write_text("global:\n  evaluation_interval: 1s\nscrape_configs:\n" + "".join(jobs))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [_binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"))  # noqa: SIM115
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).close()
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError("prometheus did not start: " + (tmp / "prometheus.log").read_text())

    def query(self, expr: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _wait_for(what: str, check, timeout: float = 90) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout} s")


class _MetricsCollector(Collector):
    """``python -m torchlens run --metrics ADDRESS``, read as ``helpers.Collector`` reads it."""

    def __init__(self, out: Path, metrics: str, command: list[str], **extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchlens", "run", "--out", str(out), "--metrics", metrics,
             "--", *command],
            cwd=REPO, env=env(**extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


def test_prometheus_scrapes_a_straggler_job(tmp_path: Path) -> None:
    _binary("prometheus")
    out = tmp_path / "exp1"
    port = free_port()
    # rank 1 loads data slowly (40 ms a batch); 3 steps a second, 120 steps
    c = _MetricsCollector(out, f"127.0.0.1:{port}", torchrun_args(1, 2, free_port()),
                          TL_STEPS="120", TL_SLOW_S="0.04", TL_STEP_SLEEP="0.25")
    prom = None
    try:
        line = c.wait_line("torchlens run: metrics at")
        assert f"http://127.0.0.1:{port}/metrics" in line
        token_file = out / "metrics.token"
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        prom = _Prometheus(tmp_path, [("torchlens", f"127.0.0.1:{port}", str(token_file)),
                                      ("no-token", f"127.0.0.1:{port}", None)])
        slow = _wait_for("slow rank", lambda: prom.query('torchlens_slow_rank{job="torchlens"} == 1'))
        (series,) = slow
        assert series["metric"]["rank"] == "1" and series["metric"]["cause"] == "data", series
        assert series["metric"]["run"] == "exp1"
        up = {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}
        assert up == {"torchlens": "1", "no-token": "0"}, up
        # the endpoint itself: 401 without the token
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
            raise AssertionError("served without a token")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        states = prom.query('torchlens_rank_state{state="up"} == 1')
        assert sorted(r["metric"]["rank"] for r in states) == ["0", "1"]
        _dashboard_expressions_evaluate(prom)
        assert c.wait() == 0, c.output
        # the step times Prometheus last scraped are the run folder's first steps'
        for rank in ("0", "1"):
            sel = f'{{job="torchlens",rank="{rank}"}}'
            (count,) = prom.query(f"last_over_time(torchlens_step_seconds_count{sel}[5m])")
            (total,) = prom.query(f"last_over_time(torchlens_step_seconds_sum{sel}[5m])")
            n = int(float(count["value"][1]))
            steps = [json.loads(x) for x in (out / f"rank{rank}" / "steps.jsonl").read_text().split("\n") if x]
            steps = [s for s in steps if not s.get("window")]
            assert 20 <= n <= len(steps) == 120
            assert abs(float(total["value"][1]) - sum(s["t1"] - s["t0"] for s in steps[:n])) < 1e-6
        assert not token_file.exists()  # deleted with the run
    finally:
        if prom is not None:
            prom.stop()
        c.kill()


def test_a_killed_rank_reaches_prometheus_as_lost(tmp_path: Path) -> None:
    _binary("prometheus")
    out = tmp_path / "exp2"
    port = free_port()
    c = _MetricsCollector(out, str(port), torchrun_args(1, 2, free_port()), TL_STEPS="2000",
                          TL_SLOW_S="0.0", TL_STEP_SLEEP="0.05")
    prom = None
    try:
        c.wait_line("torchlens run: metrics at")
        run_id = re.search(r"run (\w+),", c.wait_line("torchlens run: run")).group(1)
        prom = _Prometheus(tmp_path, [("torchlens", f"127.0.0.1:{port}", str(out / "metrics.token"))])
        _wait_for("both ranks up", lambda: len(prom.query('torchlens_rank_state{state="up"} == 1')) == 2)
        (victim,) = [p for p in processes_of_run(run_id) if p.environ().get("RANK") == "1"]
        victim.kill()  # SIGKILL: no goodbye; torchrun's agent then ends rank 0 and the job
        assert c.wait() != 0
        written = (out / "manifest.json").stat().st_mtime  # just after the final view
        (lost,) = prom.query('torchlens_rank_state{state="lost",rank="1"}[5m]')
        first = min(float(t) for t, v in lost["values"] if v == "1")
        assert first <= written + 2.5, (first, written)  # two scrapes of 1 s
        ended = prom.query('last_over_time(torchlens_rank_state{rank="0"}[5m]) == 1')
        # rank 0 saw its peer go (gloo: failed) or was ended by its agent; not up
        assert [r["metric"]["state"] for r in ended] in (["failed"], ["ended"]), ended
    finally:
        if prom is not None:
            prom.stop()
        c.kill()


#: dashboard series only a CUDA rank has (the test job runs on CPU)
CUDA_ONLY = ("torchlens_memory_allocated_bytes", "torchlens_memory_reserved_bytes",
             "torchlens_fragmentation_ratio", "torchlens_largest_free_block_bytes")


def _dashboard_expressions_evaluate(prom: _Prometheus) -> None:
    dash = json.loads((FILES / "torchlens-dashboard.json").read_text())
    # the template variables: Grafana's label_values(SELECTOR, LABEL)
    for var in dash["templating"]["list"][1:]:
        selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", var["definition"]).groups()
        selector = selector.replace("$job", ".*").replace("$run", ".*")
        url = f"{prom.url}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": selector})
        with urllib.request.urlopen(url, timeout=10) as r:
            assert json.load(r)["data"], var["definition"]
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for expr in exprs:
        concrete = (expr.replace("$__rate_interval", "15s").replace("$job", ".*")
                    .replace("$run", ".*").replace("$rank", ".*"))
        prom.query(concrete)  # Prometheus accepts it
        if not any(name in expr for name in CUDA_ONLY):  # a rate needs two scrapes in its window
            _wait_for(f"data for the dashboard's {expr}", lambda q=concrete: prom.query(q), 30)

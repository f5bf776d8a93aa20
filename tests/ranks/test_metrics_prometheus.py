"""The shipped rules and dashboard, and ``torchlens run --metrics`` scraped by a real Prometheus.

Needs Debian's ``prometheus`` package (/usr/bin/prometheus, /usr/bin/promtool;
``scripts/setup test`` installs it where it can): without it these tests skip,
except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from torchlens.analysis.ranks.slow import WINDOW

from .helpers import REPO, Collector, env, free_port, processes_of_run, torchrun_args
from .prometheus_server import Prometheus, binary, wait_for

FILES = REPO / "torchlens" / "frontends" / "metrics_files"
RULES_TEST = Path(__file__).with_name("metrics_rules_test.yml")

pytestmark = pytest.mark.timeout(400)


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
    promtool = binary("promtool")
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


class _MetricsCollector(Collector):
    """``python -m torchlens run --metrics ADDRESS``, read as ``helpers.Collector`` reads it."""

    def __init__(self, out: Path, metrics: str, command: list[str],
                 extra_args: list[str] | None = None, **extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchlens", "run", "--out", str(out), "--metrics", metrics,
             *(extra_args or []), "--", *command],
            cwd=REPO, env=env(**extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


def test_prometheus_scrapes_a_straggler_job(tmp_path: Path) -> None:
    binary("prometheus")
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
        prom = Prometheus(tmp_path, [("torchlens", f"127.0.0.1:{port}", str(token_file)),
                                      ("no-token", f"127.0.0.1:{port}", None)])
        slow = wait_for("slow rank", lambda: prom.query('torchlens_slow_rank{job="torchlens"} == 1'))
        (series,) = slow
        assert series["metric"]["rank"] == "1" and series["metric"]["cause"] == "data", series
        assert series["metric"]["run"] == "exp1"
        # both targets scraped at least once (each job keeps its own schedule)
        up = wait_for("both targets' up", lambda: (
            got if len(got := {r["metric"]["job"]: r["value"][1] for r in prom.query("up")}) == 2
            else None))
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
            # the median the terminal shows (the verdict's window: the last 20 training
            # steps), not a bucket's interpolation: the run's last scrape is its final view
            # (the end-of-run hold)
            (median,) = prom.query(f"last_over_time(torchlens_step_median_seconds{sel}[5m])")
            kept = [s["t1"] - s["t0"] for s in steps if not s.get("label")][-WINDOW:]
            assert abs(float(median["value"][1]) - statistics.median(kept)) < 1e-9, median
        # a CPU run's allocator figures are modelled: not exported, no fragmentation alert
        for name in CUDA_ONLY:
            assert prom.query(f"last_over_time({name}[5m])") == [], name
        rules = (FILES / "torchlens-rules.yml").read_text()
        frag = re.search(r"alert: TorchlensFragmentation\n\s+expr: (.*)\n", rules).group(1)
        assert prom.query(frag.replace("torchlens_fragmentation_ratio",
                                       "last_over_time(torchlens_fragmentation_ratio[5m])")) == []
        assert not token_file.exists()  # deleted with the run
    finally:
        if prom is not None:
            prom.stop()
        c.kill()


def test_a_killed_rank_reaches_prometheus_as_lost(tmp_path: Path) -> None:
    binary("prometheus")
    out = tmp_path / "exp2"
    port = free_port()
    c = _MetricsCollector(out, str(port), torchrun_args(1, 2, free_port()), TL_STEPS="2000",
                          TL_SLOW_S="0.0", TL_STEP_SLEEP="0.05")
    prom = None
    try:
        c.wait_line("torchlens run: metrics at")
        run_id = re.search(r"run (\w+),", c.wait_line("torchlens run: run")).group(1)
        prom = Prometheus(tmp_path, [("torchlens", f"127.0.0.1:{port}", str(out / "metrics.token"))])
        wait_for("both ranks up", lambda: len(prom.query('torchlens_rank_state{state="up"} == 1')) == 2)
        (victim,) = [p for p in processes_of_run(run_id) if p.environ().get("RANK") == "1"]
        victim.kill()  # SIGKILL: no goodbye; torchrun's agent then ends rank 0 and the job
        assert c.wait() != 0
        written = (out / "manifest.json").stat().st_mtime  # just after the final view
        (lost,) = prom.query('torchlens_rank_state{state="lost",rank="1"}[5m]')
        first = min(float(t) for t, v in lost["values"] if v == "1")
        assert first <= written + 2.5, (first, written)  # two scrapes of 1 s
        ended = prom.query('last_over_time(torchlens_rank_state{rank="0"}[5m]) == 1')
        # rank 0 saw its peer go (gloo: failed) or was ended by its agent (SIGTERM:
        # ended; on a loaded machine the agent's SIGKILL after it: lost); not up
        assert [r["metric"]["state"] for r in ended] in (["failed"], ["ended"], ["lost"]), ended
    finally:
        if prom is not None:
            prom.stop()
        c.kill()


#: dashboard series only a CUDA rank has (the test job runs on CPU)
CUDA_ONLY = ("torchlens_memory_allocated_bytes", "torchlens_memory_reserved_bytes",
             "torchlens_fragmentation_ratio", "torchlens_largest_free_block_bytes")
#: the Jupyter server's machine series: not in a torchlens run's scrape
GPU_SERIES = "torchlens_gpu_"


def _dashboard_expressions_evaluate(prom: Prometheus) -> None:
    dash = json.loads((FILES / "torchlens-dashboard.json").read_text())
    # the template variables: Grafana's label_values(SELECTOR, LABEL); the GPU ones read the
    # Jupyter server's series (tests/server/test_prometheus_scrapes_jupyter.py)
    for var in dash["templating"]["list"][1:]:
        selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", var["definition"]).groups()
        if selector.startswith(GPU_SERIES):
            continue
        selector = selector.replace("$job", ".*").replace("$run", ".*")
        assert prom.label_values(label, selector), var["definition"]
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for expr in exprs:
        if expr.startswith(GPU_SERIES):
            continue
        concrete = (expr.replace("$__rate_interval", "15s").replace("$job", ".*")
                    .replace("$run", ".*").replace("$rank", ".*"))
        prom.query(concrete)  # Prometheus accepts it
        if not any(name in expr for name in CUDA_ONLY):  # a rate needs two scrapes in its window
            wait_for(f"data for the dashboard's {expr}", lambda q=concrete: prom.query(q), 30)

"""Launch statistics, queue length and memcpy/memset bandwidth per rank
(analysis.runs.launches / counters) against a plain-json reading.

``_Plain`` re-reads each trace with ``json`` and recomputes the figures event
by event from the definitions (HTA's, as the modules' docstrings state): GPU
work inside HTA's window, each paired with its launch call by correlation
id. Times are compared within 1e-3 µs (the events table stores times
relative to the trace's start, the file absolute ones).
"""

from __future__ import annotations

import gzip
import html
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import msgspec
import pytest

from torchlens.analysis import runs
from torchlens.analysis.runs.launch_tables import pooled
from torchlens.formats.kineto import load_trace
from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import JSON_SCHEMA, load_run
from torchlens.model.run_figures import Summary


def _as_json(fn: Any) -> Any:
    """``fn``'s figures as JSON builtins, as a saved run holds them (the
    figures are ``model.run_figures`` structs)."""
    return lambda *args, **kwargs: msgspec.to_builtins(fn(*args, **kwargs))


launch_stats = _as_json(runs.launch_stats)
memory_bandwidth = _as_json(runs.memory_bandwidth)
queue_length = _as_json(runs.queue_length)

GPU_TRACES = ["a100_ddp_resnet_rank0_nccl.json.gz", "sampled_rank-0.json.gz",
              "v100_ddp_sgd_annotations_rank0.json.gz", "amd_mi250_rocm.json.gz",
              "a100_simple_add.json.gz", "triton_compile.json.gz"]
CPU_TRACES = ["cpu_only_gloo_rank34.json.gz", "no_distributed_info.json.gz"]
LAUNCH_APIS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync",
               "cudaMemsetAsync", "runFunction - job_prep_and_submit_for_execution",
               "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemsetAsync",
               "hipMemcpyAsync", "hipMemcpyWithStream"}
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}
STEP = re.compile(r"^ProfilerStep#\d+")
ABS = 1e-3


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (pandas' describe)."""
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class _Plain:
    """One trace's launch pairs, read with json and plain Python."""

    def __init__(self, path: Path) -> None:
        doc = json.loads(gzip.decompress(path.read_bytes()))
        events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        gpu = [e for e in events if e.get("cat") in DEVICE]
        host = [e for e in events if e.get("cat") not in DEVICE | {"cuda_sync"}
                and isinstance((e.get("args") or {}).get("correlation"), int)
                and e["args"]["correlation"] >= 0]
        steps = [e for e in events if STEP.match(e.get("name", ""))]
        if len({e["name"] for e in steps}) >= 2:  # HTA's window: before the last step
            cut = max(e["ts"] for e in steps)
            early = {e["args"]["correlation"] for e in host if e["ts"] < cut}
            gpu = [e for e in gpu if e["args"].get("correlation") in early]
        calls: dict[int, dict[str, Any]] = {}
        for e in host:
            if e["name"] in LAUNCH_APIS and e["args"]["correlation"] > 0:
                calls.setdefault(e["args"]["correlation"], e)
        self.gpu = gpu
        self.pairs = [(calls[g["args"]["correlation"]], g) for g in gpu
                      if g["args"].get("correlation") in calls]

    def delays(self) -> list[float]:
        return [max(g["ts"] - c["ts"] - c["dur"], 0.0) for c, g in self.pairs]


@pytest.fixture(scope="module")
def plain(traces_dir):
    cache: dict[str, _Plain] = {}

    def get(name: str) -> _Plain:
        if name not in cache:
            cache[name] = _Plain(traces_dir / name)
        return cache[name]
    return get


@pytest.mark.parametrize("name", GPU_TRACES)
def test_launch_stats_are_each_launch_paired_with_its_gpu_work(name, traces_dir, plain):
    ref = plain(name)
    got = launch_stats(load_trace(traces_dir / name))
    assert got["gpu"] is True
    assert got["launches"] == len(ref.pairs) > 0
    apis: dict[str, int] = {}
    for c, _ in ref.pairs:
        apis[c["name"]] = apis.get(c["name"], 0) + 1
    assert got["apis"] == apis
    cpu = [c["dur"] for c, _ in ref.pairs]
    gpu = [g["dur"] for _, g in ref.pairs]
    delay = ref.delays()
    assert got["gpu_shorter_than_cpu"] == sum(g < c for c, g in zip(cpu, gpu, strict=True))
    assert got["short_kernels"] == sum(g < c <= 50 for c, g in zip(cpu, gpu, strict=True))
    assert got["runtime_outliers"] == sum(c > 50 for c in cpu)
    assert got["delay_outliers"] == sum(d > 100 + 1e-6 for d in delay)
    for key, values in (("cpu_us", cpu), ("gpu_us", gpu), ("delay_us", delay)):
        s = got[key]
        assert s["count"] == len(values)
        assert s["mean"] == pytest.approx(statistics.fmean(values), abs=ABS)
        assert s["max"] == pytest.approx(max(values), abs=ABS)
        assert s["p50"] == pytest.approx(_percentile(values, 0.5), abs=ABS)
        assert s["p75"] == pytest.approx(_percentile(values, 0.75), abs=ABS)
        if len(values) > 1:
            assert s["std"] == pytest.approx(statistics.stdev(values), rel=1e-6, abs=ABS)
    worst = got["outliers"][0]
    assert worst["delay_us"] == pytest.approx(max(delay), abs=ABS)
    assert len(got["outliers"]) == min(10, len(delay))
    assert [o["delay_us"] for o in got["outliers"]] == \
        sorted((o["delay_us"] for o in got["outliers"]), reverse=True)


def test_a_rank_figure_stays_small_on_the_largest_shared_trace(traces_dir):
    got = launch_stats(load_trace(traces_dir / "v100_ddp_sgd_annotations_rank0.json.gz"))
    assert got["launches"] == 4876  # kernels + memcpy + memset launched before the last step
    assert len(json.dumps(got, allow_nan=False)) < 10_000


def _queue_points(ref: _Plain) -> dict[tuple[int, int], list[int]]:
    """Queue length after each change, per (device, stream): +1 at the launch
    call's start, -1 at the GPU event's start, removals first at equal times."""
    changes: dict[tuple[int, int], list[tuple[float, int]]] = {}
    for c, g in ref.pairs:
        lane = (g["args"]["device"], g["args"]["stream"])
        changes.setdefault(lane, []).extend([(c["ts"], 1), (g["ts"], -1)])
    out = {}
    for lane, ch in changes.items():
        level, points = 0, []
        for _, step in sorted(ch):
            level += step
            points.append(level)
        out[lane] = points
    return out


@pytest.mark.parametrize("name", GPU_TRACES)
def test_queue_length_per_stream_counts_launched_not_yet_started_work(name, traces_dir, plain):
    expected = _queue_points(plain(name))
    got = {(q["device"], q["stream"]): q for q in queue_length(load_trace(traces_dir / name))}
    assert set(got) == set(expected)
    for lane, points in expected.items():
        q = got[lane]
        assert q["count"] == len(points) and q["launches"] == len(points) // 2
        assert q["mean"] == pytest.approx(statistics.fmean(points))
        assert (q["min"], q["max"]) == (min(points), max(points))
        assert q["p50"] == pytest.approx(_percentile(points, 0.5))
        assert q["full_us"] == 0.0  # no shared trace reaches CUDA's 1024


def test_the_v100_trace_fills_its_launch_queue_to_just_under_cudas_limit(traces_dir):
    (q,) = queue_length(load_trace(traces_dir / "v100_ddp_sgd_annotations_rank0.json.gz"))
    assert q["max"] == 1022 and q["full_us"] == 0.0
    lowered = queue_length(load_trace(traces_dir / "v100_ddp_sgd_annotations_rank0.json.gz"),
                           max_queue=1000)[0]
    assert lowered["full_us"] > 0


def _bandwidth_points(ref: _Plain) -> dict[str, list[float]]:
    """Per memory kind, the GB/s series (bytes / ns of each memcpy/memset, summed
    while they overlap) at each change, points above 0 only."""
    changes: dict[str, list[tuple[float, int, float]]] = {}
    for g in ref.gpu:
        if g["cat"] not in ("gpu_memcpy", "gpu_memset") or "bytes" not in g["args"]:
            continue
        name = g["name"]
        kind = ("Memset" if name.startswith("Memset") else
                name[:11] if name.startswith("Memcpy") else "Memcpy Unknown")
        dur = g["dur"] or 1.0
        bw = g["args"]["bytes"] / (dur * 1000.0)
        changes.setdefault(kind, []).extend([(g["ts"], 0, bw), (g["ts"] + dur, 1, -bw)])
    out = {}
    for kind, ch in changes.items():
        level, points = 0.0, []
        for _, _, d in sorted(ch, key=lambda x: (x[0], x[1])):
            level += d
            if level > 1e-9:
                points.append(level)
        out[kind] = points
    return out


@pytest.mark.parametrize("name", ["a100_ddp_resnet_rank0_nccl.json.gz", "sampled_rank-0.json.gz",
                                  "v100_ddp_sgd_annotations_rank0.json.gz",
                                  "a100_simple_add.json.gz"])
def test_memory_bandwidth_per_kind_is_the_bytes_per_ns_series(name, traces_dir, plain):
    expected = _bandwidth_points(plain(name))
    got = {b["kind"]: b for b in memory_bandwidth(load_trace(traces_dir / name))}
    assert set(got) == set(expected) and got
    for kind, points in expected.items():
        b = got[kind]
        assert b["count"] == len(points)
        assert b["mean"] == pytest.approx(statistics.fmean(points), rel=1e-6)
        assert b["max"] == pytest.approx(max(points), rel=1e-6)
        assert b["p50"] == pytest.approx(_percentile(points, 0.5), rel=1e-6)


def test_bandwidth_equals_kinetos_own_on_a_trace_with_ns_durations(traces_dir):
    # a100_ddp writes durations in ns (4.96 µs): Kineto's "memory bandwidth (GB/s)"
    # argument, computed from the same ns, is the top of each kind's series
    doc = json.loads(gzip.decompress(
        (traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz").read_bytes()))
    memsets = [e["args"]["memory bandwidth (GB/s)"] for e in doc["traceEvents"]
               if e.get("cat") == "gpu_memset"]
    got = {b["kind"]: b for b in memory_bandwidth(
        load_trace(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"))}
    assert got["Memset"]["max"] == pytest.approx(max(memsets), rel=1e-6)


@pytest.mark.parametrize("name", CPU_TRACES)
def test_a_cpu_only_trace_has_no_launch_figures_not_zeros(name, traces_dir):
    trace = load_trace(traces_dir / name)
    got = launch_stats(trace)
    assert got["gpu"] is False
    assert got["launches"] is None and got["delay_us"] is None and got["outliers"] is None
    assert queue_length(trace) == [] and memory_bandwidth(trace) == []


def test_pooled_summary_of_two_traces_is_the_summary_of_their_values(plain):
    a, b = plain("sampled_rank-0.json.gz").delays(), plain("a100_simple_add.json.gz").delays()

    def describe(v: list[float]) -> Summary:
        return Summary(count=len(v), mean=statistics.fmean(v), std=statistics.stdev(v),
                       min=min(v), max=max(v))
    got = pooled([describe(a), describe(b)])
    both = a + b
    assert got is not None and got.count == len(both)
    assert got.mean == pytest.approx(statistics.fmean(both))
    assert got.std == pytest.approx(statistics.stdev(both))
    assert (got.min, got.max) == (min(both), max(both))
    assert got.p50 is None  # not rebuilt from summaries
    assert pooled([None, Summary(count=0)]) is None


@pytest.fixture
def two_ranks(tmp_path, traces_dir):
    run = tmp_path / "run"
    run.mkdir()
    for r in (0, 1):
        (run / f"sampled_rank-{r}.json.gz").symlink_to(traces_dir / f"sampled_rank-{r}.json.gz")
    return run


def test_run_result_has_launch_queue_and_bandwidth_tables(two_ranks, plain, capsys):
    run = load_run(str(two_ranks), workers=1)
    launches = run.launches()
    assert list(launches["rank"]) == [0, 1]
    for r in (0, 1):
        ref = plain(f"sampled_rank-{r}.json.gz")
        row = launches[launches["rank"] == r].iloc[0]
        assert row["launches"] == len(ref.pairs)
        assert row["delay_mean_us"] == pytest.approx(statistics.fmean(ref.delays()), abs=ABS)
        queues = run.queues()
        mine = queues[queues["rank"] == r]
        assert sorted(mine["count"]) == sorted(len(p) for p in _queue_points(ref).values())
    assert set(run.memory_bw()["kind"]) == {"Memcpy DtoD", "Memcpy DtoH", "Memcpy HtoD",
                                            "Memset"}
    assert len(run.launch_outliers()) == 20 and len(run.launch_kernels()) > 0
    assert main(["analyze", str(two_ranks), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("launches", "launch_outliers", "launch_kernels", "queues", "memory_bw"):
        assert key in doc and key in JSON_SCHEMA
        assert doc[key] == json.loads(json.dumps(run.to_json()[key]))


def test_cpu_only_run_says_nothing_to_measure(tmp_path, traces_dir):
    run_dir = tmp_path / "cpu"
    run_dir.mkdir()
    (run_dir / "trace.json.gz").symlink_to(traces_dir / "cpu_only_gloo_rank34.json.gz")
    run = load_run(str(run_dir))
    (row,) = run.to_json()["launches"]
    assert row["gpu"] is False and row["launches"] is None and row["delay_mean_us"] is None
    assert run.queues().empty and run.memory_bw().empty
    json.dumps(run.to_json(), allow_nan=False)
    out = tmp_path / "cpu.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page = html.unescape(out.read_text(encoding="utf-8"))
    # one line says what was not measured, in place of the GPU sections and their n/a
    assert "Not measured on this run" in page
    assert "No rank's trace holds GPU work (CPU-only traces" in page
    for gone in ('id="temporal"', 'id="overlap"', 'id="kernels"', 'id="idle"',
                 'id="launches"', "Kernel launches, queues and memory bandwidth"):
        assert gone not in page, gone


def test_report_sections_escape_kernel_names(tmp_path):
    name = "<img src=x onerror=alert(1)>"
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 100.0, "dur": 5.0, "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 300.0,
         "dur": 2.0, "args": {"correlation": 7, "device": 0, "stream": 7}},
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "rank0.json").write_text(json.dumps(
        {"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1}}))
    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "Kernel launches" in page and "Launch queue per stream" in page
    assert "<img src=x" not in page and "&lt;img src=x" in page
    (row,) = load_run(str(run_dir)).to_json()["launches"]
    assert row["launches"] == 1 and row["delay_max_us"] == pytest.approx(195.0)
    assert row["gpu_shorter_than_cpu"] == 1 and row["short_kernels"] == 1

"""HTA's per-rank figures (analysis.runs) against a plain-json reading.

``_Reference`` recomputes every figure from the trace file with ``json`` and
plain Python, event by event, from the rules in the docstrings of
``multirank.gpu`` and ``multirank.figures`` (HTA's, with the differences they
list); the patterns below restate HTA's kernel kinds. Times are taken relative
to the first GPU event before any sum, as the events table does, so both
sides add the same floats; they agree within 1e-6 relative (1e-6 µs absolute
for values near 0): only the order of the additions differs.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from torchlens.analysis import runs
from torchlens.analysis.runs import KINDS, kind_of
from torchlens.formats.kineto import ingest_bytes, load_trace


def _as_json(fn: Any) -> Any:
    """``fn``'s figures as JSON builtins, as a saved run holds them (the
    figures are ``model.run_figures`` structs)."""
    return lambda *args, **kwargs: msgspec.to_builtins(fn(*args, **kwargs))


comm_comp_overlap = _as_json(runs.comm_comp_overlap)
idle_time = _as_json(runs.idle_time)
kernel_breakdown = _as_json(runs.kernel_breakdown)
rank_figures = _as_json(runs.rank_figures)
temporal_breakdown = _as_json(runs.temporal_breakdown)

GPU_TRACES = ["a100_ddp_resnet_rank0_nccl.json.gz", "sampled_rank-0.json.gz",
              "sampled_rank-1.json.gz", "v100_ddp_sgd_annotations_rank0.json.gz",
              "amd_mi250_rocm.json.gz", "a100_simple_add.json.gz",
              "triton_compile.json.gz"]
#: No kernel, memcpy or memset at all (no_distributed_info holds only host ops).
CPU_TRACES = ["cpu_only_gloo_rank34.json.gz", "no_distributed_info.json.gz"]

OLD_CATS = {"Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}
COMMUNICATION = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
MEMORY = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
NOT_COMPUTE = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)"
    r"|(cuda.*LaunchKernel)|(^runFunction)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)"
    r"|(^cpum_exe_subgraph)|(^hccl)|(^collective_subgraph_execution)")
STEP = re.compile(r"^ProfilerStep#(\d+)")
WAIT_US = 30.0


def _cat(e: dict[str, Any]) -> str:
    return OLD_CATS.get(e.get("cat"), e.get("cat"))


def _kind(e: dict[str, Any]) -> str:
    name = e["name"]
    if _cat(e) != "kernel":
        return "memory"
    if COMMUNICATION.match(name):
        return "communication"
    if MEMORY.match(name):
        return "memory"
    return "other" if NOT_COMPUTE.match(name) else "compute"


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(spans: list[tuple[float, float]]) -> float:
    return sum((e - s for s, e in spans), 0.0)


def _share(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole else None


class _Reference:
    """The figures of one trace file, event by event."""

    def __init__(self, doc: dict[str, Any], include_last_step: bool = False) -> None:
        xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        gpu = [e for e in xs if _cat(e) in DEVICE
               and math.isfinite(e.get("ts", math.nan)) and math.isfinite(e.get("dur", math.nan))]
        launches = [e for e in xs if _cat(e) not in DEVICE | {"cuda_sync"}
                    and isinstance((e.get("args") or {}).get("correlation"), int)
                    and e["args"]["correlation"] >= 0]
        steps = [e for e in xs if STEP.match(e.get("name", ""))]
        self.n_steps = len({e["name"] for e in steps})
        self.n_gpu = len(gpu)
        if self.n_steps >= 2:
            if include_last_step:
                cut = max(e["ts"] + e["dur"] for e in steps)
                early = {e["args"]["correlation"] for e in launches if e["ts"] <= cut}
            else:
                cut = max(e["ts"] for e in steps)
                early = {e["args"]["correlation"] for e in launches if e["ts"] < cut}
            gpu = [e for e in gpu if (e.get("args") or {}).get("correlation") in early]
        launch_ts: dict[int, float] = {}
        for e in launches:
            launch_ts.setdefault(e["args"]["correlation"], e["ts"])
        t0 = min((e["ts"] for e in gpu), default=0.0)
        self.work = []
        for e in gpu:
            args = e.get("args") or {}
            start = float(e["ts"] - t0)
            launch = launch_ts.get(args.get("correlation"))
            device = args.get("device", e["pid"])
            self.work.append({
                "name": e["name"], "kind": _kind(e), "start": start, "end": start + float(e["dur"]),
                "lane": (device, args.get("stream", e["tid"])),
                "launch": None if launch is None else float(launch - t0),
            })
        self.work.sort(key=lambda w: w["start"])

    def spans(self, *kinds: str) -> list[tuple[float, float]]:
        return _union([(w["start"], w["end"]) for w in self.work
                       if not kinds or w["kind"] in kinds])

    def temporal(self) -> dict[str, Any]:
        keys = ["span_us", "busy_us", "idle_us", "compute_us", "non_compute_us",
                "idle_pct", "compute_pct", "non_compute_pct"]
        out: dict[str, Any] = {"gpu": bool(self.work), "window": {
            "steps": self.n_steps, "applied": self.n_steps >= 2,
            "gpu_events": self.n_gpu, "dropped": self.n_gpu - len(self.work)}}
        if not self.work:
            return out | dict.fromkeys(keys)
        span = max(w["end"] for w in self.work) - min(w["start"] for w in self.work)
        busy = _length(self.spans())
        compute = _length(self.spans("compute"))
        out |= {"span_us": span, "busy_us": busy, "idle_us": span - busy,
                "compute_us": compute, "non_compute_us": busy - compute}
        for k in ("idle", "compute", "non_compute"):
            out[f"{k}_pct"] = _share(out[f"{k}_us"], span)
        return out

    def idle(self) -> list[dict[str, Any]]:
        lanes: dict[Any, list[dict]] = {}
        for w in self.work:
            lanes.setdefault(w["lane"], []).append(w)
        out = []
        for (device, stream), items in sorted(lanes.items()):
            sums = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
            for prev, w in zip(items, items[1:], strict=False):
                gap = w["start"] - prev["end"]
                if w["launch"] is not None and w["launch"] > prev["end"]:
                    sums["host_wait"] += gap
                elif gap < WAIT_US:
                    sums["kernel_wait"] += gap
                else:
                    sums["other"] += gap
            total = sum(sums.values())
            row = {"device": device, "stream": stream, "events": len(items), "idle_us": total}
            row |= {f"{k}_us": v for k, v in sums.items()}
            row |= {f"{k}_pct": _share(v, total) for k, v in sums.items()}
            out.append(row)
        return out

    def overlap(self) -> dict[str, Any]:
        if not self.work:
            return {"gpu": False, "communication_us": None, "overlapped_us": None,
                    "overlap_pct": None}
        comm, comp = self.spans("communication"), self.spans("compute")
        both = 0.0
        for s, e in comm:
            for s2, e2 in comp:
                both += max(0.0, min(e, e2) - max(s, s2))
        total = _length(comm)
        return {"gpu": True, "communication_us": total, "overlapped_us": both,
                "overlap_pct": _share(both, total)}

    def kernels(self, top: int) -> dict[str, Any]:
        if not self.work:
            return {"gpu": False, "kinds": None, "states": None, "top": None}
        kinds, tops = {}, {}
        for kind in KINDS:
            mine = [w for w in self.work if w["kind"] == kind]
            by_name: dict[str, list[float]] = {}
            for w in mine:
                by_name.setdefault(w["name"], []).append(w["end"] - w["start"])
            kinds[kind] = {"us": sum((w["end"] - w["start"] for w in mine), 0.0),
                           "count": len(mine), "names": len(by_name)}
            rows = sorted(by_name.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
            tops[kind] = {"kernels": [
                {"name": n, "count": len(d), "total_us": sum(d), "mean_us": sum(d) / len(d),
                 "min_us": min(d), "max_us": max(d),
                 "std_us": statistics.stdev(d) if len(d) > 1 else 0.0}
                for n, d in rows[:top]],
                "rest": ({"names": len(rows) - top, "count": sum(len(d) for _, d in rows[top:]),
                          "total_us": sum((sum(d) for _, d in rows[top:]), 0.0)}
                         if len(rows) > top else None)}
        # the exclusive overlap states of compute (1), communication (2), memory (4)
        marks = []
        for bit, kind in enumerate(("compute", "communication", "memory")):
            for s, e in self.spans(kind):
                marks += [(s, 1 << bit), (e, -(1 << bit))]
        marks.sort(key=lambda m: m[0])
        times = [0.0] * 8
        state = 0
        for (t, d), (t_next, _) in zip(marks, marks[1:], strict=False):
            state += d
            times[state] += t_next - t
        whole = sum(times[1:])
        words = ("compute", "communication", "memory")
        states = [{"state": " overlapping ".join(words[b] for b in range(3) if m >> b & 1),
                   "us": times[m], "pct": _share(times[m], whole)}
                  for m in range(1, 8) if times[m] > 0]
        return {"gpu": True, "kinds": kinds, "states": sorted(states, key=lambda s: -s["us"]),
                "top": tops}


def _same(got: Any, want: Any, where: str = "") -> None:
    """Equal structure; floats within 1e-6 relative (1e-6 absolute near 0)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert isinstance(got, float), where
        assert got == pytest.approx(want, rel=1e-6, abs=1e-6), where
    else:
        assert got == want and type(got) is type(want), where


@pytest.fixture(scope="module")
def loaded(traces_dir: Path, plain):
    cache: dict[str, tuple[Any, dict]] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = (load_trace(traces_dir / name), plain(traces_dir / name))
        return cache[name]

    return get


@pytest.mark.parametrize("name", GPU_TRACES + CPU_TRACES)
def test_figures_match_the_json(loaded, name: str) -> None:
    trace, doc = loaded(name)
    ref = _Reference(doc)
    _same(temporal_breakdown(trace), ref.temporal(), "temporal")
    _same(idle_time(trace), ref.idle(), "idle")
    _same(comm_comp_overlap(trace), ref.overlap(), "overlap")
    _same(kernel_breakdown(trace, top=5), ref.kernels(5), "kernels")


@pytest.mark.parametrize("name", GPU_TRACES)
def test_with_the_last_step(loaded, name: str) -> None:
    trace, doc = loaded(name)
    ref = _Reference(doc, include_last_step=True)
    figures = rank_figures(trace, top=3, include_last_step=True)
    # launches, queues and memory_bw: tests/runs/test_launches.py
    figures = {k: figures[k] for k in ("temporal", "idle", "overlap", "kernels")}
    _same(figures, {"temporal": ref.temporal(), "idle": ref.idle(),
                    "overlap": ref.overlap(), "kernels": ref.kernels(3)})


@pytest.mark.parametrize("name", GPU_TRACES + CPU_TRACES)
def test_rank_figures_are_the_four_and_json(loaded, name: str) -> None:
    collective_overlap = _as_json(runs.collective_overlap)
    launch_stats = _as_json(runs.launch_stats)
    memory_bandwidth = _as_json(runs.memory_bandwidth)
    queue_length = _as_json(runs.queue_length)

    trace, _ = loaded(name)
    figures = rank_figures(trace)
    assert figures == {"temporal": temporal_breakdown(trace), "idle": idle_time(trace),
                       "overlap": comm_comp_overlap(trace),
                       "kernels": kernel_breakdown(trace), "launches": launch_stats(trace),
                       "queues": queue_length(trace), "memory_bw": memory_bandwidth(trace),
                       "collective_overlap": collective_overlap(trace)}
    assert json.loads(json.dumps(figures, allow_nan=False)) == figures


def test_gpu_traces_have_figures(loaded) -> None:
    """The GPU traces have a timeline; those with NCCL an overlap."""
    for name in GPU_TRACES:
        trace, _ = loaded(name)
        t = temporal_breakdown(trace)
        assert t["gpu"] and t["span_us"] > 0, name
        assert t["idle_pct"] + t["compute_pct"] + t["non_compute_pct"] == pytest.approx(100)
        has_nccl = name.startswith(("a100_ddp", "sampled_rank"))
        assert (comm_comp_overlap(trace)["overlap_pct"] is not None) == has_nccl, name


@pytest.mark.parametrize("name", CPU_TRACES)
def test_cpu_only_trace_gives_none(loaded, name: str) -> None:
    trace, _ = loaded(name)
    t = temporal_breakdown(trace)
    assert t["gpu"] is False
    assert all(t[k] is None for k in t if k.endswith(("_us", "_pct")))
    assert idle_time(trace) == []
    assert comm_comp_overlap(trace)["overlap_pct"] is None
    assert comm_comp_overlap(trace)["communication_us"] is None
    k = kernel_breakdown(trace)
    assert k["kinds"] is None and k["states"] is None and k["top"] is None


def test_kinds_follow_hta_patterns() -> None:
    assert kind_of("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") \
        == KINDS.index("communication")
    assert kind_of("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") \
        == KINDS.index("communication")
    assert kind_of("void foo::ncclKernel_x()") == KINDS.index("communication")
    assert kind_of("Memcpy DtoD (Device -> Device)") == KINDS.index("memory")
    assert kind_of("Memset (Device)") == KINDS.index("memory")
    assert kind_of("void at::native::vectorized_elementwise_kernel<4>") == KINDS.index("compute")
    assert kind_of("triton_poi_fused_add_0") == KINDS.index("compute")
    assert kind_of("Stream Wait Event") == KINDS.index("other")
    assert kind_of("cudaLaunchKernel") == KINDS.index("other")


def _x(name, ts, dur, cat, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": pid,
            "tid": tid, "args": args}


def test_small_trace_by_hand() -> None:
    """Two devices with the same stream number stay two lanes; gaps by hand."""
    events = [
        _x("cudaLaunchKernel", 0, 5, "cuda_runtime", correlation=1),
        _x("cudaLaunchKernel", 6, 5, "cuda_runtime", correlation=2),
        _x("cudaLaunchKernel", 200, 5, "cuda_runtime", correlation=3),
        _x("cudaLaunchKernel", 7, 2, "cuda_runtime", correlation=4),
        _x("gemm", 10, 100, "kernel", pid=0, tid=7, device=0, stream=7, correlation=1),
        _x("ncclDevKernel_AllReduce", 120, 50, "kernel", pid=0, tid=7, device=0, stream=7,
           correlation=2),
        _x("gemm", 210, 40, "kernel", pid=0, tid=7, device=0, stream=7, correlation=3),
        _x("hipMemcpyDtoD", 130, 20, "gpu_memcpy", pid=1, tid=7, device=1, stream=7,
           correlation=4),
    ]
    trace = ingest_bytes(json.dumps({"traceEvents": events}).encode(), "hand.json")
    idle = idle_time(trace)
    assert [(r["device"], r["stream"], r["events"]) for r in idle] == [(0, 7, 3), (1, 7, 1)]
    # 110 -> 120: launched at 6, before 110: kernel wait (10 < 30 µs);
    # 170 -> 210: launched at 200, after 170: host wait
    assert idle[0]["kernel_wait_us"] == 10 and idle[0]["host_wait_us"] == 40
    assert idle[0]["other_us"] == 0 and idle[0]["idle_us"] == 50
    t = temporal_breakdown(trace)
    assert t["span_us"] == 240 and t["busy_us"] == 190 and t["compute_us"] == 140
    assert t["non_compute_us"] == 50 and t["idle_us"] == 50
    # the memcpy's category makes it memory, whatever HTA's ^hip would say
    k = kernel_breakdown(trace)
    assert k["kinds"]["memory"] == {"us": 20.0, "count": 1, "names": 1}
    assert k["kinds"]["communication"]["us"] == 50
    o = comm_comp_overlap(trace)
    assert o == {"gpu": True, "communication_us": 50.0, "overlapped_us": 0.0,
                 "overlap_pct": 0.0}


def test_speed_on_the_largest_trace(traces_dir: Path) -> None:
    """Times each figure on the largest shared trace (printed; no bound asserted)."""
    path = max(traces_dir.glob("*.json.gz"), key=lambda p: p.stat().st_size)
    t = time.perf_counter()
    trace = load_trace(path)
    load_s = time.perf_counter() - t
    timings = {}
    for fn in (temporal_breakdown, idle_time, comm_comp_overlap, kernel_breakdown,
               rank_figures):
        best = math.inf
        for _ in range(5):
            t = time.perf_counter()
            fn(trace)
            best = min(best, time.perf_counter() - t)
        timings[fn.__name__] = best
    print(f"\n{path.name}: {len(trace.events)} events, load {load_s * 1e3:.1f} ms; "
          + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in timings.items()))

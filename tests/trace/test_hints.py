"""Hints fire on the problems they name, with the figure, and stay quiet otherwise."""

from __future__ import annotations

import json

import pytest

from torchlens.analysis.trace.headline import summarize
from torchlens.analysis.trace.hints import find_hints
from torchlens.analysis.trace.ops import op_table
from torchlens.analysis.trace.steps import step_breakdown
from torchlens.formats.kineto import ingest_bytes, load_trace
from torchlens.model import Profile, TorchprofPayload
from torchlens.model.findings import Finding


def _x(name, ts, dur, cat="cpu_op", pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
            "ts": ts, "dur": dur, "args": args}


def _hints(events):
    trace = ingest_bytes(json.dumps({"traceEvents": events}).encode(), "h.json")
    return {h.title.split(":")[0]: h for h in
            find_hints(trace, op_table(trace), step_breakdown(trace))}


def test_dataloader_share_hint_with_its_figure():
    loader = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    hints = _hints([
        _x("ProfilerStep#1", 0, 1000, "user_annotation"),
        _x(loader, 0, 400, "user_annotation"),
        _x("aten::mm", 400, 600),
    ])
    hint = hints["Input pipeline takes a large share of each step"]
    assert hint.severity == "warning"
    assert hint.value("dataloader_share") == pytest.approx(0.4)
    assert "40%" in hint.sentence and "num_workers" in hint.advice


def test_gpu_idle_hint_and_no_hint_when_busy():
    events = [_x("ProfilerStep#1", 0, 1000, "user_annotation"),
              _x("cudaLaunchKernel", 10, 5, "cuda_runtime", correlation=1),
              _x("k", 100, 100, "kernel", pid=0, tid=7, correlation=1, stream=7),
              _x("cudaLaunchKernel", 20, 5, "cuda_runtime", correlation=2),
              _x("k", 700, 100, "kernel", pid=0, tid=7, correlation=2, stream=7)]
    hint = _hints(events)["GPU idle between launches"]
    assert hint.value("gpu_idle_share") == pytest.approx(0.8)
    assert hint.value("largest_gap_us") == pytest.approx(500)
    busy = events[:3] + [_x("k", 200, 790, "kernel", pid=0, tid=7, stream=7)]
    assert "GPU idle between launches" not in _hints(busy)


def test_syncs_inside_steps_are_counted_once():
    hints = _hints([
        _x("ProfilerStep#1", 0, 1000, "user_annotation"),
        _x("aten::item", 100, 50),
        _x("aten::_local_scalar_dense", 101, 48),
        _x("cudaStreamSynchronize", 300, 20, "cuda_runtime"),
        _x("Stream Sync", 301, 19, "cuda_sync", pid=0, tid=7),
        _x("aten::item", 2000, 50),  # after the loop: not counted
        _x("aten::_local_scalar_dense", 2001, 48),
    ])
    hint = hints["Host-device synchronizations inside the loop"]
    assert hint.value("syncs") == 2
    assert hint.value("by_name") == {"aten::_local_scalar_dense": 1,
                                        "cudaStreamSynchronize": 1}


def test_dominant_op_hint():
    hints = _hints([_x("aten::conv2d", 0, 3000), _x("aten::relu", 3000, 1000)])
    hint = hints["One op dominates CPU time"]
    assert hint.value("op") == "aten::conv2d"
    assert hint.value("self_cpu_share") == pytest.approx(0.75)
    assert "75%" in hint.sentence
    balanced = _hints([_x("aten::conv2d", 0, 2000), _x("aten::relu", 2000, 2000)])
    assert "One op dominates CPU time" not in balanced


def test_real_traces(traces_dir):
    def hints(name):
        trace = load_trace(traces_dir / name)
        return find_hints(trace, op_table(trace), step_breakdown(trace))

    # .item() in the step of no_distributed_info (5 aten::item calls), but the
    # trace has no GPU at all: reading a CPU tensor stalls nothing, no sync hint
    found = {h.title: h for h in hints("no_distributed_info.json.gz")}
    assert "Host-device synchronizations inside the loop" not in found
    # the A100 DDP step leaves the GPU idle most of the time (kernels ~ 24% busy)
    a100 = {h.title: h for h in hints("a100_ddp_resnet_rank0_nccl.json.gz")}
    idle = a100["GPU idle between launches"].value("gpu_idle_share")
    assert 0.6 < idle < 0.9
    assert all(isinstance(h, Finding) and h.figures and h.advice for h in a100.values())
    # CPU-only trace without GPU work: no GPU hint
    gloo = {h.title for h in hints("cpu_only_gloo_rank34.json.gz")}
    assert "GPU idle between launches" not in gloo
    assert "Host-device synchronizations inside the loop" not in gloo


def test_sync_hint_on_gpu_traces_only(traces_dir, plain):
    """.item() syncs count on a GPU trace (sampled rank: kernels and
    aten::_local_scalar_dense calls inside its steps), never on a CPU one."""
    sync = "Host-device synchronizations inside the loop"
    path = traces_dir / "sampled_rank-0.json.gz"
    raw = [e for e in plain(path)["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in raw
             if e["name"].startswith("ProfilerStep#")]
    reads = [e for e in raw if e["name"] == "aten::_local_scalar_dense"
             and any(s <= e["ts"] < t for s, t in steps)]
    assert any(e.get("cat") == "kernel" for e in raw) and len(reads) >= 1
    trace = load_trace(path)
    found = {h.title: h for h in find_hints(trace, op_table(trace), step_breakdown(trace))}
    assert found[sync].value("syncs") == len(reads)
    assert "until the GPU catches up" in found[sync].advice
    cpu = _hints([_x("ProfilerStep#1", 0, 1000, "user_annotation"),
                  _x("aten::item", 100, 50), _x("aten::_local_scalar_dense", 101, 48)])
    assert sync not in cpu


def test_summary_of_a_real_trace(traces_dir, plain):
    path = traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"
    trace = load_trace(path)
    profile = Profile(kind="torchprof", traces={"main": trace},
                      payload=TorchprofPayload(profiler_overhead_s=0.25))
    s = summarize(profile)
    raw = [e for e in plain(path)["traceEvents"] if e["ph"] != "M"]
    assert s.n_events == len(raw)
    assert s.n_ops == sum(1 for e in raw if e.get("cat") == "cpu_op")
    assert s.n_kernels == 2700 and s.gpu_present
    assert s.profiler_overhead_us == pytest.approx(250_000)
    span = max(e["ts"] + e.get("dur", 0) for e in raw) - min(e["ts"] for e in raw)
    assert s.wall_us == pytest.approx(span, abs=1e-3)
    assert s.top_op == op_table(trace).groupby("name").self_cpu_us.sum().idxmax()
    assert s.dropped == {}


def test_summary_cpu_only_and_empty():
    assert summarize(Profile(kind="torchprof", wall_time_s=1.5)).wall_us == 1.5e6
    trace = ingest_bytes(json.dumps({"traceEvents": [_x("aten::add", 0, 10)]}).encode(),
                         "x.json")
    s = summarize(Profile(kind="torchprof", traces={"main": trace}))
    assert (s.gpu_present, s.n_kernels, s.top_op, s.top_op_share) == (
        False, 0, "aten::add", 1.0)
    assert s.profiler_overhead_us is None


def test_counts_are_singular_when_one():
    """One sync in one step is said in the singular, never "1 syncs inside 1 steps"."""
    hints = _hints([
        _x("ProfilerStep#1", 0, 1000, "user_annotation"),
        _x("cudaLaunchKernel", 10, 5, "cuda_runtime", correlation=1),
        _x("k", 20, 900, "kernel", pid=0, tid=7, correlation=1, stream=7),
        _x("aten::item", 100, 50), _x("aten::_local_scalar_dense", 101, 48),
    ])
    detail = hints["Host-device synchronizations inside the loop"].sentence
    assert detail.startswith("1 sync inside 1 step (")
    assert "1 syncs" not in detail and "1 steps" not in detail


def _steps(durations_ms):
    events, t = [], 0
    for i, ms in enumerate(durations_ms):
        events += [_x(f"ProfilerStep#{i}", t, ms * 1000, "user_annotation"),
                   _x("aten::mm", t, ms * 1000)]
        t += ms * 1000
    return _hints(events)


def test_a_step_five_times_the_median_is_named():
    """A step that takes five times the median deserves a hint naming it."""
    hint = _steps([2, 2, 11, 2, 2])["Slow 1 step"]
    assert hint.title == "Slow 1 step: #2" and hint.severity == "warning"
    assert "5.5x the median step" in hint.sentence and "11.0 ms" in hint.sentence
    assert hint.value("slow_steps") == [2] and hint.value("ratio") == pytest.approx(5.5)
    first = _steps([20, 2, 2, 2])["Slow 1 step"]
    assert first.title.endswith("#0") and "first step" in first.advice
    assert not any(t.startswith("Slow") for t in _steps([2, 2, 9, 2, 2]))  # 4.5x
    assert not any(t.startswith("Slow") for t in _steps([20, 2]))  # no median of 2 steps
    assert _steps([12, 2, 2, 12, 2])["Slow 2 steps"].title == "Slow 2 steps: #0, #3"


def test_no_slow_step_hint_on_the_shared_traces(traces_dir):
    for name in ("a100_ddp_resnet_rank0_nccl.json.gz", "v100_ddp_sgd_annotations_rank0.json.gz",
                 "sampled_rank-0.json.gz"):
        trace = load_trace(traces_dir / name)
        steps = step_breakdown(trace)
        assert len(steps) >= 2
        assert not [h for h in find_hints(trace, op_table(trace), steps)
                    if h.title.startswith("Slow")]

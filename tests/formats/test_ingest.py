"""Ingest of every shared real trace, checked against a plain-json reading."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pytest

from torchlens.formats.kineto import ingest_bytes, load_trace
from torchlens.model import InputError

TRACE_FILES = [
    "a100_ddp_resnet_rank0_nccl.json.gz",
    "a100_simple_add.json.gz",
    "amd_mi250_rocm.json.gz",
    "cpu_only_gloo_rank34.json.gz",
    "no_distributed_info.json.gz",
    "sampled_rank-0.json.gz",
    "sampled_rank-1.json.gz",
    "triton_compile.json.gz",
    "v100_ddp_sgd_annotations_rank0.json.gz",
]

OLD_NAMES = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel",
             "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Trace": "trace"}


@pytest.mark.parametrize("name", TRACE_FILES)
def test_every_category_count_matches_plain_json(traces_dir, name, plain):
    path = traces_dir / name
    trace = load_trace(path)
    expected = Counter(
        OLD_NAMES.get(e.get("cat"), e.get("cat") or "other")
        for e in plain(path)["traceEvents"] if e["ph"] != "M"
    )
    assert Counter(trace.events.text("cat")) == expected
    assert len(trace.events) == sum(expected.values())
    assert trace.meta["dropped"] == {}


@pytest.mark.parametrize("name", TRACE_FILES)
def test_times_are_relative_to_the_earliest_event(traces_dir, name, plain):
    path = traces_dir / name
    trace = load_trace(path)
    rows = [e for e in plain(path)["traceEvents"] if e["ph"] != "M"]
    t0 = min(float(e["ts"]) for e in rows)
    assert trace.meta["t0_us"] == pytest.approx(t0)
    assert trace.events["ts"].min() == 0.0
    longest = max(rows, key=lambda e: e.get("dur") or 0)
    assert trace.events["dur"].max() == pytest.approx(longest["dur"])


def test_a100_ddp_nccl_kernels_and_their_message_sizes(traces_dir, plain):
    path = traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"
    trace = load_trace(path)
    ev = trace.events
    kernels = ev["cat"] == ev.categories["cat"].index("kernel")
    names = ev.text("name")
    nccl = kernels & np.char.startswith(names.astype(str), "nccl")
    assert nccl.sum() == 21
    # the figure from plain json: kernel args and record_param_comms agree
    raw = plain(path)["traceEvents"]
    kernel_sizes = [e["args"]["In msg nelems"] for e in raw
                    if e.get("cat") == "kernel" and e["name"].startswith("nccl")
                    and e["args"]["Collective name"] == "allreduce"]
    comms = [e["args"]["In msg nelems"] for e in raw
             if e.get("name") == "record_param_comms"
             and e["args"]["Collective name"] == "allreduce"]
    assert max(kernel_sizes) == max(comms) == 7_875_584
    # the 2,049,000 is the smallest DDP bucket, not the largest
    assert min(kernel_sizes) == 2_049_000
    is_allreduce = ev["collective"] == ev.categories["collective"].index("allreduce")
    assert ev["in_nelems"][nccl & is_allreduce].max() == 7_875_584
    assert ev["in_nelems"][nccl & is_allreduce].min() == 2_049_000
    assert sorted(set(ev["stream"][nccl])) == [40]
    assert trace.meta["distributedInfo"]["backend"] == "nccl"
    assert trace.meta["distributedInfo"]["world_size"] == 2
    assert trace.meta["trace_stats"]["Out-of-range"] == 4181


@pytest.mark.parametrize("name", TRACE_FILES)
def test_gpu_events_per_stream_match_plain_json(traces_dir, name, plain):
    path = traces_dir / name
    trace = load_trace(path)
    ev = trace.events
    expected = Counter(
        (e["cat"], e["args"].get("device", e["pid"]), e["args"].get("stream", e["tid"]))
        for e in plain(path)["traceEvents"]
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    cats = ev.text("cat")
    got = Counter(
        (c, int(d), int(s))
        for c, d, s in zip(cats, ev["device"], ev["stream"], strict=True)
        if c in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    assert got == expected


def test_known_kernel_memcpy_memset_counts(traces_dir, plain):
    a100 = load_trace(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz")
    counts = Counter(a100.events.text("cat"))
    assert (counts["kernel"], counts["gpu_memcpy"], counts["gpu_memset"]) == (2700, 960, 114)
    streams = Counter(a100.events["stream"][a100.events.text("cat") == "kernel"].tolist())
    assert streams == {7: 2679, 40: 21}
    memcpy = a100.events.text("cat") == "gpu_memcpy"
    raw_bytes = sum(e["args"]["bytes"] for e in plain(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz")["traceEvents"]
                    if e.get("cat") == "gpu_memcpy")
    assert a100.events["bytes"][memcpy].sum() == raw_bytes


def test_v100_has_gpu_user_annotations(traces_dir):
    trace = load_trace(traces_dir / "v100_ddp_sgd_annotations_rank0.json.gz")
    cats = trace.events.text("cat")
    names = set(trace.events.text("name")[cats == "gpu_user_annotation"])
    assert "Optimizer.step#SGD.step" in names
    assert (cats == "gpu_user_annotation").sum() == 15


def test_cpu_only_gloo_rank_has_no_kernels_but_distributed_info(traces_dir, plain):
    trace = load_trace(traces_dir / "cpu_only_gloo_rank34.json.gz")
    cats = set(trace.events.text("cat"))
    assert not cats & {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime"}
    info = trace.meta["distributedInfo"]
    assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", 34, 300)
    # string pids ("Spans", "Traces", "") become negative ids with labels
    labels = trace.meta["pid_labels"]
    assert set(labels.values()) == {"Spans", "Traces", ""}
    assert all(int(k) < 0 for k in labels)
    assert trace.meta["process_names"]["1074"] == "pyper:trainer:8:2"
    dims = trace.events.text("input_dims")[trace.events.text("name") == "gloo:all_reduce"]
    raw = [json.dumps(e["args"]["Input Dims"], separators=(",", ":"))
           for e in plain(traces_dir / "cpu_only_gloo_rank34.json.gz")["traceEvents"]
           if e.get("name") == "gloo:all_reduce"]
    assert list(dims) == raw and raw[0] == "[[321271]]"


def test_trace_without_distributed_info(traces_dir, plain):
    path = traces_dir / "no_distributed_info.json.gz"
    trace = load_trace(path)
    assert "distributedInfo" not in plain(path)
    assert trace.meta["distributedInfo"] is None
    stacks = trace.events.text("call_stack")
    assert len(stacks) == 2467


def test_amd_trace_loads_with_string_stream_args(traces_dir):
    trace = load_trace(traces_dir / "amd_mi250_rocm.json.gz")
    ev = trace.events
    kernels = ev.text("cat") == "kernel"
    assert kernels.sum() == 14
    assert set(ev["device"][kernels]) == {2}
    assert trace.meta["deviceProperties"][0]["name"] == "AMD Radeon Graphics"
    assert trace.meta["unparsed_values"] == {}  # "0x0" runtime streams are not GPU rows


def test_triton_trace_loads_with_driver_launch(traces_dir):
    trace = load_trace(traces_dir / "triton_compile.json.gz")
    names = trace.events.text("name")
    cats = trace.events.text("cat")
    assert list(names[cats == "kernel"]) == ["triton_poi_fused_add_cos_sin_0"]
    assert list(names[cats == "cuda_driver"]) == ["cuLaunchKernel"]


def test_old_category_names_are_normalized(tmp_path):
    doc = {"traceEvents": [
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1,
         "ts": 10, "dur": 5},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 11, "dur": 1, "args": {"correlation": 7}},
        {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 12,
         "dur": 3, "args": {"correlation": 7, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7,
         "ts": 16, "dur": 1, "args": {"bytes": 64}},
        {"ph": "X", "cat": "Memset", "name": "Memset", "pid": 0, "tid": 7, "ts": 18,
         "dur": 1},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 19,
         "args": {"Addr": 4096, "Bytes": -64, "Total Allocated": 0,
                  "Total Reserved": 0, "Device Type": 0, "Device Id": -1}},
        {"ph": "C", "name": "counter", "pid": 1, "tid": 1, "ts": 20},
    ]}
    trace = ingest_bytes(json.dumps(doc).encode(), "old.json")
    assert list(trace.events.text("cat")) == [
        "cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset",
        "cpu_instant_event"]
    assert trace.meta["dropped"] == {"unsupported ph 'C'": 1}
    assert list(trace.events["ts"]) == [0, 1, 2, 6, 8, 9]
    mem = trace.events.select(np.array([5]))
    assert (mem["addr"][0], mem["mem_bytes"][0], mem["device_id"][0]) == (4096, -64, -1)


def test_profiler_memory_events_from_a_real_cpu_run(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 record_shapes=True) as prof:
        x = torch.ones(256, 256)
        (x @ x).sum()
    out = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(out))
    raw = [e for e in json.loads(out.read_text())["traceEvents"]
           if e.get("name") == "[memory]"]
    trace = load_trace(out)
    mem = trace.events.text("name") == "[memory]"
    assert mem.sum() == len(raw) > 0
    assert sorted(trace.events["mem_bytes"][mem]) == sorted(e["args"]["Bytes"] for e in raw)
    assert set(trace.events["addr"][mem]) == {e["args"]["Addr"] for e in raw}
    mm = trace.events.text("name") == "aten::mm"
    assert trace.events.text("input_dims")[mm][0] == "[[256,256],[256,256]]"


# ---- bad input: each a one-line InputError naming the problem ----

def test_missing_path(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_trace(tmp_path / "nope.json.gz")


def test_truncated_gzip(tmp_path, traces_dir):
    data = (traces_dir / "a100_simple_add.json.gz").read_bytes()
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated or damaged gzip") as info:
        load_trace(bad)
    assert "\n" not in str(info.value)


def test_truncated_plain_json(tmp_path):
    bad = tmp_path / "cut.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    with pytest.raises(InputError, match="not valid JSON"):
        load_trace(bad)


def test_json_that_is_not_a_trace(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"lr": 0.1, "epochs": 3}))
    with pytest.raises(InputError, match=r"not a Kineto trace.*lr, epochs"):
        load_trace(bad)


def test_memory_timeline_raw_file_is_named(traces_dir):
    with pytest.raises(InputError, match="export_memory_timeline raw file"):
        load_trace(traces_dir / "memory_timeline.raw.gz")


def test_allocator_snapshot_json_is_named(tmp_path):
    bad = tmp_path / "snap.json"
    bad.write_text(json.dumps({"segments": [], "device_traces": []}))
    with pytest.raises(InputError, match="allocator memory snapshot"):
        load_trace(bad)


@pytest.mark.parametrize("doc", [{"traceEvents": []},
                                 {"traceEvents": [{"ph": "M", "name": "process_name",
                                                   "pid": 1, "args": {"name": "p"}}]}])
def test_empty_trace(tmp_path, doc):
    bad = tmp_path / "empty.json.gz"
    bad.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(InputError, match="no events"):
        load_trace(bad)


def test_events_with_odd_values_are_counted_not_fatal():
    doc = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "ok", "pid": 1, "tid": 1, "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "bad args", "pid": 1, "tid": 1, "ts": 2,
         "dur": 1, "args": ["not", "a", "dict"]},
        {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1},
    ]}
    trace = ingest_bytes(json.dumps(doc).encode(), "odd.json")
    assert list(trace.events.text("name")) == ["ok"]
    assert trace.meta["dropped"] == {"malformed event": 1, "no usable ts": 1}


def test_an_id_beyond_64_bits_is_counted_not_fatal():
    event = {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1.0,
             "args": {"Addr": 2**64 + 1, "Bytes": 64}}
    trace = ingest_bytes(json.dumps({"traceEvents": [event]}).encode(), "t")
    assert trace.meta["unparsed_values"] == {"addr": 1}
    assert trace.events.columns["addr"].tolist() == [-1]
    assert trace.events.columns["mem_bytes"].tolist() == [64]

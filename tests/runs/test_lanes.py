"""What each rank keeps for the run's joint timeline (``analysis.runs.lanes``),
checked against the raw JSON."""

from __future__ import annotations

from collections import defaultdict

import msgspec
import pytest

from torchlens.analysis.runs.lanes import LANE_EVENTS, lane_summary
from torchlens.formats.kineto import load_trace

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")


def test_each_stream_keeps_its_longest_events_and_every_nccl_kernel(traces_dir, plain):
    path = traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"
    doc = plain(path)
    by_lane: dict[str, list[float]] = defaultdict(list)
    nccl = 0
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            args = e.get("args") or {}
            by_lane[f"GPU {args.get('device', e['pid'])} · stream {args.get('stream', e['tid'])}"
                    ].append(e["dur"])
            nccl += e["name"].startswith("nccl")
    s = msgspec.to_builtins(lane_summary(load_trace(path)))  # as a saved run holds it
    assert s["lanes"][:-1] == sorted(by_lane, key=lambda n: int(n.rsplit(" ", 1)[1]))
    assert s["lanes"][-1] == "collectives"
    assert s["events"] == sum(len(v) for v in by_lane.values())
    for i, name in enumerate(s["lanes"][:-1]):
        kept = sorted((d for d, li, q in zip(s["d"], s["lane"], s["seq"], strict=True)
                       if li == i and q < 0), reverse=True)
        durs = sorted(by_lane[name], reverse=True)
        collective_members = sum(1 for li, q in zip(s["lane"], s["seq"], strict=True)
                                 if li == i and q >= 0)
        # the longest ones, to the 0.1 µs the summary keeps
        assert kept == pytest.approx(durs[:len(kept)], abs=0.051)
        assert len(kept) == min(LANE_EVENTS, len(durs) - collective_members)
    assert sum(1 for q, k in zip(s["seq"], s["kind"], strict=True) if q >= 0 and k == 1) >= nccl


def test_a_cpu_only_trace_has_a_lane_per_thread(traces_dir, plain):
    path = traces_dir / "cpu_only_gloo_rank34.json.gz"
    doc = plain(path)
    tids = {e["tid"] for e in doc["traceEvents"] if e.get("ph") == "X"
            and e.get("cat") in ("cpu_op", "user_annotation", "Operator")}
    s = msgspec.to_builtins(lane_summary(load_trace(path)))  # as a saved run holds it
    assert {n for n in s["lanes"] if n != "collectives"} == {f"thread {t}" for t in tids}
    assert set(s["kind"]) <= {3, 1}  # cpu, and the collectives' communication

"""Small synthetic traces built to the events-table contract (docs/TRACE_TABLE.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from torchlens.model import (
    OpDisplay,
    Profile,
    Table,
    TorchprofPayload,
    Trace,
    encode_text,
)

TEXT = ("name", "cat", "ph", "input_dims", "input_types", "call_stack",
        "collective", "dtype", "pg_name")
INTS = ("pid", "tid", "external_id", "correlation", "flow_id", "device", "stream",
        "bytes", "in_nelems", "out_nelems", "group_size", "addr", "mem_bytes",
        "total_allocated", "total_reserved", "device_type", "device_id")
HOSTILE = "<img src=x onerror=alert(1)>"


def make_trace(rows: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> Trace:
    """A Trace with every contract column; rows give name/cat/ts/dur/... ."""
    cols: dict[str, np.ndarray] = {}
    cats: dict[str, list[str]] = {}
    for name in TEXT:
        default = "X" if name == "ph" else None
        cols[name], cats[name] = encode_text([r.get(name, default) for r in rows])
    for name in INTS:
        cols[name] = np.array([r.get(name, -1) for r in rows], dtype=np.int64)
    cols["ts"] = np.array([r.get("ts", 0.0) for r in rows], dtype=np.float64)
    cols["dur"] = np.array([r.get("dur", 0.0) for r in rows], dtype=np.float64)
    cols["flops"] = np.array([r.get("flops", np.nan) for r in rows], dtype=np.float64)
    base = {"t0_us": 0.0, "pid_labels": {}, "tid_labels": {}, "dropped": {},
            "thread_names": {"1:1": "thread 1 (main)"}, "process_labels": {"1": "CPU"}}
    return Trace(Table(cols, cats), {**base, **(meta or {})})


def hostile_trace() -> Trace:
    """CPU ops, a kernel and an annotation whose names are HTML."""
    return make_trace([
        {"name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 1000,
         "pid": 1, "tid": 1},
        {"name": HOSTILE, "cat": "cpu_op", "ts": 10, "dur": 500, "pid": 1, "tid": 1,
         "input_dims": "[[2,3]]" + HOSTILE, "external_id": 7, "flops": 1e9,
         "call_stack": "</script><script>alert(2)</script>"},
        {"name": "aten::mm", "cat": "cpu_op", "ts": 600, "dur": 200, "pid": 1, "tid": 1,
         "input_dims": "[[4,4],[4,4]]", "external_id": 8},
        {"name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 20, "dur": 5,
         "pid": 1, "tid": 1, "correlation": 99, "external_id": 7},
        {"name": "k<b>bold</b>", "cat": "kernel", "ts": 40, "dur": 300, "pid": 0,
         "tid": 7, "device": 0, "stream": 7, "correlation": 99, "external_id": 7},
    ])


@pytest.fixture
def hostile_profile() -> Profile:
    return Profile(
        kind="torchprof", title=f"title {HOSTILE}", created_at=1_700_000_000.0,
        wall_time_s=0.01,
        environment={"torch": "2.13.0+cpu", "host": HOSTILE, "env": {"X": HOSTILE}},
        payload=TorchprofPayload(display=OpDisplay(top=10, sort="total_cpu_us", shapes=True,
                                                   flops=True, stack=True)),
        traces={"main": hostile_trace()},
        unmeasured=[f"CUDA memory {HOSTILE}"],
        error={"type": "RuntimeError", "message": HOSTILE, "traceback": HOSTILE},
    )

"""The one list of launch calls (``analysis.trace.events.LAUNCH_NAMES``).

Kineto draws a launch flow from the runtime and driver calls of libkineto's
``RuntimeActivity::flowStart`` / ``DriverActivity`` and names them by
``runtimeCbidName``; a GPU event launched by any of them is paired with its
launch, whichever API the library (cuBLAS, Triton, CUDA graphs) used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchlens.analysis.runs.launches import HTA_LAUNCH_STATS_NAMES, launch_stats
from torchlens.analysis.trace.events import LAUNCH_NAMES
from torchlens.formats.kineto import load_trace

#: Launch calls a GPU build of torch records, and the GPU event each launches.
CALLS = {
    "cudaLaunchKernel": "kernel", "cudaLaunchKernelExC": "kernel",
    "cuLaunchKernel": "kernel", "cuLaunchKernelEx": "kernel",
    "cudaGraphLaunch": "kernel", "cudaLaunchCooperativeKernel": "kernel",
    "cudaLaunchCooperativeKernelMultiDevice": "kernel",
    "cudaMemcpyAsync": "gpu_memcpy", "cudaMemcpy2DAsync": "gpu_memcpy",
    "cudaMemsetAsync": "gpu_memset",
}


def _trace(tmp_path: Path, calls: dict[str, str]) -> Path:
    events = []
    for i, (name, cat) in enumerate(calls.items()):
        t, corr = 100.0 * i, 1000 + i
        events.append({"ph": "X", "pid": 1, "tid": 1, "ts": t, "dur": 4.0,
                       "cat": "cuda_driver" if name.startswith("cu") and not
                       name.startswith("cuda") else "cuda_runtime",
                       "name": name, "args": {"correlation": corr}})
        events.append({"ph": "X", "pid": 0, "tid": 7, "ts": t + 10.0, "dur": 2.0 + i,
                       "cat": cat, "name": f"work_{name}",
                       "args": {"correlation": corr, "device": 0, "stream": 7}})
    path = tmp_path / "launches.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_every_launch_api_kineto_records_is_in_the_one_list():
    assert set(CALLS) <= set(LAUNCH_NAMES)
    assert len(set(LAUNCH_NAMES)) == len(LAUNCH_NAMES)
    # what is not a launch stays out (a sync or an event record has no GPU work of its own)
    assert not {"cudaStreamSynchronize", "cudaEventRecord", "cudaStreamWaitEvent"} & set(
        LAUNCH_NAMES)


def test_launch_stats_pair_each_api_with_its_gpu_work(tmp_path):
    trace = load_trace(_trace(tmp_path, CALLS))
    got = launch_stats(trace)
    assert got.launches == len(CALLS)
    assert got.apis == dict.fromkeys(CALLS, 1)
    assert got.delay_us is not None
    assert got.delay_us.max == pytest.approx(6.0)  # GPU start - launch end
    # HTA's narrower set misses the graph, driver, cooperative and 2D launches
    hta = launch_stats(trace, names=HTA_LAUNCH_STATS_NAMES)
    assert set(hta.apis or {}) == {"cudaLaunchKernel", "cudaLaunchKernelExC",
                                "cudaMemcpyAsync", "cudaMemsetAsync"}

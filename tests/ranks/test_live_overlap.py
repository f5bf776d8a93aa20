"""The live rank view's overlap of communication with compute (FSDP's
prefetch all_gathers): each profiled-step summary carries it, the view says it
per rank, and a CPU run is told it is not available."""

from __future__ import annotations

import json
from pathlib import Path

from markupsafe import escape

from ranks.rank_fixtures import T_START, make_run
from torchlens.analysis.ranks.overlap import profiled_overlap
from torchlens.analysis.ranks.summary import summarize
from torchlens.capture.channel import protocol
from torchlens.formats.kineto import ingest_bytes, load_trace
from torchlens.model.records import StepSummary
from torchlens.render.ranks.overlap import NO_GPU
from torchlens.render.ranks.view import RankProfileView

GEMM = "void cutlass::Kernel<cutlass_80_tensorop_sgemm>(Params)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
REDUCE_SCATTER = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _k(name: str, ts: float, dur: float, stream: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0,
            "tid": stream, "args": {"device": 0, "stream": stream}}


def _fsdp_step() -> bytes:
    """ProfilerStep#3 on the host at [0, 400); compute at [0, 100) and [150, 250)
    on stream 7, an all_gather at [50, 160) on 20, a reduce_scatter at [200, 300)
    on 21."""
    host = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0,
             "dur": 400, "pid": 1, "tid": 1, "args": {}}]
    gpu = [_k(GEMM, 0, 100, 7), _k(GEMM, 150, 100, 7), _k(ALL_GATHER, 50, 110, 20),
           _k(REDUCE_SCATTER, 200, 100, 21)]
    return json.dumps({"traceEvents": host + gpu}).encode()


def test_a_profiled_step_summary_carries_its_overlap_per_collective() -> None:
    s = summarize(ingest_bytes(_fsdp_step(), "s.json"), rank=0, step=3, trace_rel="s.json")
    assert s["overlap"] == {"gpu": True, "collectives": {
        "all_gather": {"communication_us": 110.0, "overlapped_us": 60.0},
        "reduce_scatter": {"communication_us": 100.0, "overlapped_us": 50.0}}}
    # the collector keeps it in the head, which is what the live view reads
    head, _ = protocol.unpack(protocol.pack_summary(1, s))
    assert head["overlap"] == s["overlap"]


def test_a_cpu_step_has_no_overlap(traces_dir: Path) -> None:
    trace = load_trace(traces_dir / "cpu_only_gloo_rank34.json.gz")
    s = summarize(trace, rank=34, step=0, trace_rel="t.json")
    assert s["overlap"] == {"gpu": False, "collectives": None}


def _with(sums: list[list[dict]], overlap: dict) -> list[list[dict]]:
    return [[dict(s, overlap=overlap) for s in rank] for rank in sums]


def _fed_view(steps: list, sums: list) -> RankProfileView:
    """A 2-rank live view given every step and summary, then flushed."""
    view = RankProfileView(2, every=5, modelled=True, t0=T_START)
    for r in range(2):
        view.push_steps(r, steps[r])
        for s in sums[r]:
            view.push_summary(r, s)
    view.flush(force=True)
    return view


def test_the_view_says_each_ranks_all_gather_overlap() -> None:
    steps, sums = make_run(world=2, steps=10, straggler=1)
    sums = _with(sums, {"gpu": True, "collectives": {
        "all_gather": {"communication_us": 4000.0, "overlapped_us": 3000.0}}})
    rows = profiled_overlap([[StepSummary.of(s) for s in rank] for rank in sums])
    step_us = sum(s["step_ms"] * 1000 for s in sums[0])
    got = rows[0].collectives["all_gather"]
    assert got.overlap_pct == 75.0 and got.exposed_us == 2 * 1000.0  # 2 profiled steps
    assert got.exposed_pct == 100 * 2000.0 / step_us
    view = _fed_view(steps, sums)
    text = view.panels.overlap_note.text
    assert "rank 0: all_gather 75% overlapped, 2.0 ms exposed" in text
    assert "rank 1: all_gather 75%" in text
    assert "parameter prefetch that compute did not hide" in text


def test_the_view_of_a_cpu_run_says_overlap_is_not_available() -> None:
    steps, sums = make_run(world=2, steps=10, straggler=1)
    sums = _with(sums, {"gpu": False, "collectives": None})
    view = _fed_view(steps, sums)
    assert view.panels.overlap_note.text == str(escape(NO_GPU))
    assert "measured from GPU kernels only" in NO_GPU and "not available" in NO_GPU

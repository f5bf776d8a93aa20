"""Communication overlapped by compute, split by collective (FSDP's
prefetch all_gathers): exact µs on traces built here, the real A100 DDP trace
against HTA's figure, the report's table and finding, and what a CPU run says."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from torchlens.analysis import runs
from torchlens.analysis.runs import collective_of
from torchlens.formats.kineto import ingest_bytes, load_trace
from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import load_run


def _as_json(fn: object) -> object:
    """``fn``'s figures as JSON builtins, as a saved run holds them (the
    figures are ``model.run_figures`` structs)."""
    return lambda *args, **kwargs: msgspec.to_builtins(fn(*args, **kwargs))


collective_overlap = _as_json(runs.collective_overlap)
comm_comp_overlap = _as_json(runs.comm_comp_overlap)


def _k(name: str, ts: float, dur: float, stream: int, scale: float = 1) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts * scale, "dur": dur * scale,
            "pid": 0,
            "tid": stream, "args": {"device": 0, "stream": stream}}


GEMM = "void cutlass::Kernel<cutlass_80_tensorop_sgemm>(Params)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
REDUCE_SCATTER = "ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
BROADCAST = "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


def _events(gather_end: float, scale: float = 1) -> list[dict]:
    """Compute on stream 7 at [0, 100) and [150, 250); an all_gather on stream 20
    at [50, gather_end); a reduce_scatter on 21 at [200, 300); a broadcast on
    20 at [260, 270). The GPU timeline is [0, 300). Times in µs, times ``scale``."""
    return [_k(GEMM, 0, 100, 7, scale), _k(GEMM, 150, 100, 7, scale),
            _k(ALL_GATHER, 50, gather_end - 50, 20, scale),
            _k(REDUCE_SCATTER, 200, 100, 21, scale), _k(BROADCAST, 260, 10, 20, scale)]


def _doc(rank: int, events: list[dict]) -> dict:
    host = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 300, "pid": 1,
             "tid": 1, "args": {}}]
    return {"distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"},
            "traceEvents": host + events}


def test_kernel_names_of_nccl_and_rccl() -> None:
    assert collective_of(ALL_GATHER) == "all_gather"
    assert collective_of("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)") == "all_gather"
    assert collective_of("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(x)") == "reduce_scatter"
    assert collective_of("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)") == "all_reduce"
    assert collective_of("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "other"
    assert collective_of(BROADCAST) == "other"
    # NCCL's generic kernel names no collective: it is not guessed
    assert collective_of("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)") == "other"


def test_exact_microseconds_per_collective() -> None:
    trace = ingest_bytes(json.dumps(_doc(0, _events(160))).encode(), "r.json")
    got = collective_overlap(trace)
    assert got["gpu"] is True
    assert got["collectives"] == {
        # [50, 160) against compute [0, 100) and [150, 160)
        "all_gather": {"communication_us": 110.0, "overlapped_us": 60.0, "exposed_us": 50.0,
                       "overlap_pct": pytest.approx(100 * 60 / 110)},
        # [200, 300) against compute [200, 250)
        "reduce_scatter": {"communication_us": 100.0, "overlapped_us": 50.0,
                           "exposed_us": 50.0, "overlap_pct": 50.0},
        "other": {"communication_us": 10.0, "overlapped_us": 0.0, "exposed_us": 10.0,
                  "overlap_pct": 0.0},
    }
    # HTA's figure lumps them: the broadcast lies inside the reduce_scatter
    total = comm_comp_overlap(trace)
    assert total["communication_us"] == 210.0 and total["overlapped_us"] == 110.0


def test_a_cpu_trace_has_no_split(traces_dir: Path) -> None:
    got = collective_overlap(load_trace(traces_dir / "cpu_only_gloo_rank34.json.gz"))
    assert got == {"gpu": False, "collectives": None}


def test_real_a100_ddp_trace_is_all_reduce_and_its_total_is_htas(traces_dir: Path) -> None:
    run = load_run(str(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"))
    total = comm_comp_overlap(load_trace(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"))
    rows = {r.collective: r for r in run.analysis().collective_overlap}
    assert "all_gather" not in rows and "reduce_scatter" not in rows
    assert rows["all collectives"].communication_us == total["communication_us"]
    assert rows["all collectives"].overlapped_us == total["overlapped_us"]
    # DDP's gradient all_reduce and the start's broadcast of the parameters
    assert set(rows) == {"all collectives", "all_reduce", "other"}
    assert 0 < rows["all_reduce"].communication_us <= total["communication_us"]
    assert rows["all_reduce"].overlapped_us <= rows["all_reduce"].communication_us


@pytest.fixture
def fsdp_run(tmp_path: Path) -> Path:
    """Rank 0's all_gather ends at 100 ms (all under compute), rank 1's at 160 ms."""
    run = tmp_path / "run"
    run.mkdir()
    for rank, end in ((0, 100), (1, 160)):
        (run / f"rank{rank}.json").write_text(json.dumps(_doc(rank, _events(end, 1000))))
    return run


def test_report_table_and_finding_name_the_exposed_all_gather(fsdp_run: Path, tmp_path: Path,
                                                                capsys) -> None:
    a = load_run(str(fsdp_run)).analysis()
    gathers = {r.rank: r for r in a.collective_overlap if r.collective == "all_gather"}
    assert gathers[0].exposed_us == 0.0 and gathers[0].overlap_pct == 100.0
    assert gathers[1].exposed_us == 50_000.0
    assert gathers[1].exposed_pct == pytest.approx(100 * 50 / 300)  # of the GPU timeline
    said = [f for f in a.findings if f.title == "exposed all_gather"]
    assert len(said) == 1
    assert said[0].sentence.startswith("rank 1: 50.0 ms of all_gather not hidden by compute")
    assert "17% of its GPU timeline" in said[0].sentence
    out = tmp_path / "run.html"
    assert main(["report", str(fsdp_run), "-o", str(out)]) == 0
    page = out.read_text()
    section = page[page.index('id="overlap"'):]
    section = section[:section.index("</section>")]
    for words in ("exposed (not overlapped)", "all_gather", "reduce_scatter",
                  "all collectives", "17%"):
        assert words in section, words


def test_a_cpu_run_says_overlap_is_not_available(tmp_path: Path) -> None:
    run = tmp_path / "cpu"
    run.mkdir()
    for rank in (0, 1):
        doc = _doc(rank, [])
        doc["distributedInfo"]["backend"] = "gloo"
        (run / f"rank{rank}.json").write_text(json.dumps(doc))
    out = tmp_path / "cpu.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text()
    # the page's one line for every GPU section a CPU run has no figure in
    assert "Not measured on this run" in page
    assert "communication overlapped by compute" in page and 'id="overlap"' not in page
    from torchlens.render.runs.report import text_report

    result = load_run(str(run))
    assert "not available for this run" in text_report(result.profile, result.analysis())

"""Collectives across ranks (``analysis.runs.collectives``).

The shared traces are checked against a plain-json reading written here from
the module docstring's definitions (each collective of these traces is one
outermost ``c10d::`` host op); a synthetic run built from minimal Kineto
JSON has a deliberately late rank.
"""

from __future__ import annotations

import json
import math
import pickle
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from torchlens.analysis.runs.collectives import (
    SAME_SIZE,
    busbw_factor,
    collective_rows,
    collective_table,
    rank_collectives,
    records,
)
from torchlens.analysis.runs.rows import CollectiveRow
from torchlens.analysis.runs.slow_ranks import findings, straggler_rows
from torchlens.formats.kineto import load_trace
from torchlens.frontends.cli.main import main
from torchlens.frontends.runs import api as run_api
from torchlens.frontends.runs.api import load_run
from torchlens.model.run_figures import Collective, TraceFigures

#: c10d op -> canonical kind, for the ops the shared traces hold
KIND = {"c10d::allreduce_": "allreduce", "c10d::broadcast_": "broadcast",
        "c10d::alltoall_base_": "alltoall", "c10d::_allgather_base_": "allgather"}
SIZE = {"float": 4, "long": 8, "byte": 1, "signed char": 1}


def _issues(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The outermost ``c10d::`` ops of a trace, by start: one per collective here."""
    c10d = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"
            and e["name"].startswith("c10d::")]
    outer = [e for e in c10d if not any(
        o is not e and o["tid"] == e["tid"] and o["ts"] <= e["ts"] < o["ts"] + o["dur"]
        for o in c10d)]
    return sorted(outer, key=lambda e: e["ts"])


def _inside(doc: dict[str, Any], op: dict[str, Any]) -> list[dict[str, Any]]:
    """Host events nested in ``op`` on its thread."""
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e is not op
            and e["pid"] == op["pid"] and e["tid"] == op["tid"]
            and op["ts"] <= e["ts"] < op["ts"] + op["dur"]]


def _nccl_kernels(doc: dict[str, Any], op: dict[str, Any]) -> list[dict[str, Any]]:
    """NCCL kernels whose launch (same correlation) lies in ``op``."""
    launched = {(e.get("args") or {}).get("correlation") for e in _inside(doc, op)
                if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"
            and e["name"].startswith("nccl") and (e.get("args") or {}).get("correlation")
            in launched]


# --------------------------------------------------------------- shared traces
def test_a100_ddp_collectives_agree_with_the_raw_json(traces_dir, plain):
    path = traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"
    doc = plain(path)
    got = rank_collectives(load_trace(path))
    want = _issues(doc)
    assert len(got) == len(want) == 21
    assert [c.name for c in got] == [KIND[e["name"]] for e in want]
    assert [c.name for c in got].count("allreduce") == 15
    assert [c.seq for c in got] == list(range(21))
    base_s = doc["baseTimeNanoseconds"] / 1e9
    for c, op in zip(got, want, strict=True):
        comms = [e for e in _inside(doc, op) if e["name"] == "record_param_comms"]
        args = comms[0]["args"]
        assert c.bytes == args["In msg nelems"] * SIZE[args["dtype"].lower()]
        kernels = _nccl_kernels(doc, op)
        assert len(kernels) == 1
        assert c.kernel_us == pytest.approx(kernels[0]["dur"])
        assert c.k0 == pytest.approx(base_s + kernels[0]["ts"] / 1e6, abs=1e-6)
        assert c.t0 == pytest.approx(base_s + op["ts"] / 1e6, abs=1e-6)
        end = max(op["ts"] + op["dur"], kernels[0]["ts"] + kernels[0]["dur"])
        assert c.dur_us == pytest.approx(end - op["ts"], abs=1e-3)
        assert c.t1 == pytest.approx(base_s + end / 1e6, abs=1e-6)
        assert (c.group, c.pg) == (2, "0")
    # the first bucket allreduce of DDP: 2049000 floats, its kernel 3.3 ms
    assert got[2].bytes == 2049000 * 4 and (got[2].kernel_us or 0) > 1000


def test_a_cpu_gloo_trace_has_no_kernel_time(traces_dir):
    got = rank_collectives(load_trace(traces_dir / "cpu_only_gloo_rank34.json.gz"))
    assert len(got) == 10 and {c.name for c in got} == {"allreduce"}
    assert all(c.kernel_us is None and c.bytes for c in got)
    assert all(c.dur_us > 100_000 for c in got)  # the gloo exchange, not the enqueue


def _expected_size(doc: dict[str, Any], op: dict[str, Any]) -> int | None:
    """Bytes by the docstring for the sampled traces (shapes only): the largest
    tensor argument of the op and the events in it."""
    best = None
    for e in [op] + _inside(doc, op):
        args = e.get("args") or {}
        for shape, dtype in zip(args.get("Input Dims") or [], args.get("Input type") or [],
                                strict=False):
            if dtype in SIZE and shape and all(isinstance(d, int) for d in shape):
                best = max(best or 0, math.prod(shape) * SIZE[dtype])
    return best


def test_two_sampled_ranks_match_by_seq_with_waits_from_the_raw_json(traces_dir, plain):
    """Two ranks of a 128-rank job: their sequences pair by seq, except where they
    disagree (then the row says so and pairs nothing). Every collective has its
    NCCL kernel, so a rank arrives when that kernel starts on its GPU, not when
    its host enqueued the call (NCCL is asynchronous)."""
    figures, raw = {}, {}
    for r in (0, 1):
        path = traces_dir / f"sampled_rank-{r}.json.gz"
        figures[r] = [TraceFigures(collectives=collective_table(load_trace(path)), trace=0)]
        doc = plain(path)
        assert "baseTimeNanoseconds" not in doc  # ts are unix µs
        raw[r] = [(KIND[e["name"]], min(k["ts"] for k in _nccl_kernels(doc, e)),
                   _expected_size(doc, e), e["ts"]) for e in _issues(doc)]
    assert len(raw[0]) == len(raw[1]) == 10
    rows = collective_rows(figures, world_size=128)
    assert [(r.trace, r.seq) for r in rows] == [(0, s) for s in range(10)]
    last_count = {0: 0, 1: 0}
    caused = {0: 0.0, 1: 0.0}
    mismatched = []
    for seq, row in enumerate(rows):
        (n0, ts0, b0, host0), (n1, ts1, b1, host1) = raw[0][seq], raw[1][seq]
        if n0 != n1 or (n0 in SAME_SIZE and b0 != b1):
            mismatched.append(seq)
            assert row.mismatch and row.last_rank is None and row.waits_us is None
            assert "rank 0" in row.mismatch and "rank 1" in row.mismatch
            continue
        assert row.mismatch is None and row.name == n0 and row.n == 128
        assert row.arrived_by == "kernel"
        assert row.issued == {0: pytest.approx(host0 / 1e6, abs=1e-6),
                                 1: pytest.approx(host1 / 1e6, abs=1e-6)}
        last = 0 if ts0 >= ts1 else 1
        assert row.last_rank == last
        assert row.waits_us[0] == pytest.approx(max(ts0, ts1) - ts0, abs=1.0)
        assert row.waits_us[1] == pytest.approx(max(ts0, ts1) - ts1, abs=1.0)
        assert row.arrivals == {0: pytest.approx(ts0 / 1e6, abs=1e-6),
                                   1: pytest.approx(ts1 / 1e6, abs=1e-6)}
        last_count[last] += 1
        caused[last] += abs(ts0 - ts1)
    assert mismatched == [3, 6, 7]  # a size at 3, then alltoall and allreduce swapped
    assert rows[6].mismatch == "names differ: alltoall on rank 0; allreduce on rank 1"
    assert rows[6].name is None and rows[3].name == "allreduce"
    stragglers = {s.rank: s for s in straggler_rows(figures, 128)}
    for r in (0, 1):
        assert stragglers[r].last == last_count[r] and stragglers[r].collectives == 7
        assert stragglers[r].caused_us == pytest.approx(caused[r], abs=10.0)
        assert stragglers[r].waited_us == pytest.approx(caused[1 - r], abs=10.0)
    # by the hosts' issue times rank 0 was last at 5 of the 7; on the GPUs rank 1's
    # kernels started last at 6: its host enqueued early while its GPU was still busy
    assert last_count == {0: 1, 1: 6}
    assert sum(row.issued[0] >= row.issued[1] for row in rows
               if row.issued) == 5
    # at most 2 of 3 per kind: too few to single a rank out
    (said,) = findings(figures, 128)
    sentence = said.sentence
    assert "disagree at 3 of 10" in sentence and "seq 3" in sentence


# ---------------------------------------------------------------- synthetic run
BASE_NS = 1_700_000_000 * 10**9
STEP_US = 100_000.0
LATE_US = 5_000.0
XFER_US = 1_000.0
NELEMS = 1 << 20  # floats: 4 MiB


def _collective(kind: str, t: float, end: float, corr: int, world: int,
                kernel_at: float | None = None) -> list[dict]:
    op = {"allreduce": ("c10d::allreduce_", "nccl:all_reduce", "AllReduce"),
          "broadcast": ("c10d::broadcast_", "nccl:broadcast", "Broadcast")}[kind]
    host = {"pid": 1, "tid": 1, "ph": "X"}
    return [
        {**host, "cat": "cpu_op", "name": op[0], "ts": t, "dur": 50},
        {**host, "cat": "cpu_op", "name": "record_param_comms", "ts": t + 1, "dur": 45,
         "args": {"Collective name": kind, "In msg nelems": NELEMS, "Out msg nelems": NELEMS,
                  "dtype": "Float", "Group size": world, "Process Group Name": "0"}},
        {**host, "cat": "user_annotation", "name": op[1], "ts": t + 2, "dur": 40},
        {**host, "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 10, "dur": 5,
         "args": {"correlation": corr}},
        {"ph": "X", "pid": 0, "tid": 7, "cat": "kernel",
         "name": f"ncclKernel_{op[2]}_RING_LL_Sum_float(ncclDevComm*)",
         "ts": t + 20 if kernel_at is None else kernel_at,
         "dur": end - (t + 20 if kernel_at is None else kernel_at),
         "args": {"correlation": corr, "device": 0, "stream": 7}},
    ]


def _write_run(folder: Path, world: int = 4, steps: int = 8, late_rank: int = 2,
               odd: tuple[int, int] | None = None) -> Path:
    """Per-rank traces: every rank issues an allreduce per step, ``late_rank``
    ``LATE_US`` after the others; each kernel ends ``XFER_US`` after the last
    rank's began. ``odd=(rank, step)``: that rank issues a broadcast there."""
    folder.mkdir()
    for rank in range(world):
        events = []
        for step in range(steps):
            t0 = 1_000.0 + step * STEP_US
            t = t0 + (LATE_US if rank == late_rank else 0.0)
            end = t0 + LATE_US + 20 + XFER_US
            kind = "broadcast" if odd == (rank, step) else "allreduce"
            events += _collective(kind, t, end, 100 + step, world)
            events.append({"ph": "X", "pid": 0, "tid": 7, "cat": "kernel", "name": "gemm",
                           "ts": t0 - 900, "dur": 800,
                           "args": {"correlation": 10_000 + step, "device": 0, "stream": 7}})
        doc = {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
               "baseTimeNanoseconds": BASE_NS, "traceEvents": events}
        (folder / f"rank{rank}.json").write_text(json.dumps(doc))
    return folder


def test_a_late_rank_is_named_by_stragglers_and_findings(tmp_path):
    run = load_run(str(_write_run(tmp_path / "run")), workers=1)
    rows = run.collectives()
    assert len(rows) == 8 and rows["mismatch"].isna().all()
    assert (rows["last_rank"] == 2).all() and (rows["name"] == "allreduce").all()
    first = rows.iloc[0]
    assert first["arrivals"][0] == pytest.approx(BASE_NS / 1e9 + 1_000 / 1e6)
    assert first["waits_us"] == {0: pytest.approx(LATE_US, abs=0.5),
                                 1: pytest.approx(LATE_US, abs=0.5),
                                 2: 0.0, 3: pytest.approx(LATE_US, abs=0.5)}
    assert first["total_wait_us"] == pytest.approx(3 * LATE_US, abs=2)
    # the late rank's kernel is the exchange alone: 1 ms for 4 MiB
    assert first["timed_by"] == "kernel" and first["dur_us"] == pytest.approx(XFER_US)
    assert first["bytes"] == NELEMS * 4 and first["n"] == 4
    algbw = NELEMS * 4 / 1e9 / (XFER_US / 1e6)
    assert first["algbw_GBps"] == pytest.approx(algbw)
    assert first["busbw_GBps"] == pytest.approx(algbw * 2 * 3 / 4)
    stragglers = run.stragglers()
    top = stragglers.iloc[0]
    assert top["rank"] == 2 and top["last"] == 8 and top["last_pct"] == 100.0
    assert top["caused_us"] == pytest.approx(8 * 3 * LATE_US, abs=20)
    # one other rank's wait, as the slow-rank sentence gives it (a walk read
    # the sum over the 3 waiting ranks there and 1/3 of it in the findings)
    assert top["caused_mean_us"] == pytest.approx(LATE_US, abs=1)
    assert list(stragglers.set_index("rank").loc[[0, 1, 3], "waited_us"]) == \
        pytest.approx([8 * LATE_US] * 3, abs=5)
    (sentence,) = run.findings()
    # no step breakdown in these traces: no part can explain it
    assert sentence.startswith("rank 2 is the slow rank: no measured part explains it; it "
                               "arrived last at 100% of allreduces (8 of 8; arrival = its NCCL "
                               "kernel's start on the GPU)")
    assert "120.0 ms in total" in sentence and "15.0 ms per allreduce" in sentence


def _rank_doc(rank: int, world: int, events: list[dict]) -> dict:
    return {"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "baseTimeNanoseconds": BASE_NS, "traceEvents": events}


def test_a_rank_whose_gpu_is_busy_arrives_late_though_its_host_issued_first(tmp_path):
    """NCCL is asynchronous: rank 1's host enqueues every allreduce first, but its
    GPU reaches them LATE_US after the others' (a longer backward kernel before
    them), so the others' kernels wait for it: rank 1 arrived last."""
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in range(2):
        events = []
        for step in range(8):
            t0 = 1_000.0 + step * STEP_US
            issue = t0 - 100.0 if rank == 1 else t0
            start = t0 + 20 + (LATE_US if rank == 1 else 0.0)
            end = t0 + 20 + LATE_US + XFER_US
            events += _collective("allreduce", issue, end, 100 + step, 2, kernel_at=start)
        (folder / f"rank{rank}.json").write_text(json.dumps(_rank_doc(rank, 2, events)))
    run = load_run(str(folder), workers=1)
    rows = run.collectives()
    assert (rows["arrived_by"] == "kernel").all() and (rows["last_rank"] == 1).all()
    first = rows.iloc[0]
    assert first["waits_us"] == {0: pytest.approx(LATE_US, abs=0.5), 1: 0.0}
    # the hosts' issue times alone would have named rank 0
    assert first["issued"][1] < first["issued"][0]
    assert first["dur_us"] == pytest.approx(XFER_US)
    (sentence,) = run.findings()
    assert sentence.startswith("rank 1 is the slow rank")
    assert "(8 of 8; arrival = its NCCL kernel's start on the GPU)" in sentence


def test_a_host_only_run_says_its_arrivals_are_host_issues():
    ranks = {r: [TraceFigures(collectives=[_rec(i, "allreduce", 10.0 * i
                                                + (0.005 if r == 3 else 0)) for i in range(8)],
                              trace=0)] for r in range(4)}
    rows = collective_rows(ranks, 4)
    assert {r.arrived_by for r in rows} == {"host"}
    (said,) = findings(ranks, 4, rows=rows)
    assert "(8 of 8; arrival = when its host issued the call)" in said.sentence


def test_a_kernel_whose_launch_is_not_in_the_trace_is_not_a_second_collective(tmp_path):
    """Two steps' allreduces whose launch calls the trace lacks: each kernel joins
    the host collective issued before it; a kernel running before any host
    collective (the trace began during it) is a collective by itself."""
    events = []
    for step in range(2):
        t = 1_000.0 + step * STEP_US
        events += [e for e in _collective("allreduce", t, t + 2_000, 100 + step, 4)
                   if e["name"] != "cudaLaunchKernel"]
    early = {"ph": "X", "pid": 0, "tid": 7, "cat": "kernel", "ts": 500.0, "dur": 100,
             "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
             "args": {"correlation": 99, "device": 0, "stream": 7}}
    trace = load_trace(_write(tmp_path / "t.json", {"baseTimeNanoseconds": BASE_NS,
                                                    "traceEvents": events + [early]}))
    got = rank_collectives(trace)
    assert [c.name for c in got] == ["allreduce"] * 3
    assert got[0].kernel_us == 100 and got[0].k0 == pytest.approx(
        BASE_NS / 1e9 + 500 / 1e6)
    for c, step in zip(got[1:], range(2), strict=True):
        t = 1_000.0 + step * STEP_US
        assert c.kernel_us == pytest.approx(2_000 - 20)
        assert c.k0 == pytest.approx(BASE_NS / 1e9 + (t + 20) / 1e6)
        assert c.t0 == pytest.approx(BASE_NS / 1e9 + t / 1e6)


def test_a_gloo_collective_never_takes_a_nccl_kernel(tmp_path):
    host = {"pid": 1, "tid": 1, "ph": "X"}
    events = [{**host, "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 100, "dur": 50},
              {**host, "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 110,
               "dur": 30},
              {"ph": "X", "pid": 0, "tid": 7, "cat": "kernel", "ts": 200, "dur": 10,
               "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)",
               "args": {"correlation": 5, "device": 0, "stream": 7}}]
    got = rank_collectives(load_trace(_write(tmp_path / "t.json", {"traceEvents": events})))
    assert [(c.kernel_us, c.k0 is None) for c in got] == [(None, True), (10, False)]


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_a_mismatch_at_one_seq_is_reported_not_paired(tmp_path):
    run = load_run(str(_write_run(tmp_path / "run", odd=(1, 3))), workers=1)
    rows = run.to_json()["collectives"]
    bad = [r for r in rows if r["mismatch"]]
    assert [r["seq"] for r in bad] == [3]
    assert bad[0]["mismatch"] == ("names differ: allreduce on ranks 0, 2-3; "
                                  "broadcast on rank 1")
    assert bad[0]["name"] is None and bad[0]["last_rank"] is None
    assert bad[0]["algbw_GBps"] is None and bad[0]["waits_us"] is None
    assert all(r["last_rank"] == 2 for r in rows if not r["mismatch"])
    top = run.stragglers().iloc[0]
    assert top["rank"] == 2 and top["last"] == 7 and top["collectives"] == 7
    found = run.findings()
    assert found[0].startswith("rank 2 is the slow rank: ")
    assert "it arrived last at 100% of allreduces (7 of 7; arrival" in found[0]
    assert "disagree at 1 of 8" in found[1] and "seq 3" in found[1]


def test_analyze_json_carries_collectives_stragglers_and_findings(tmp_path, capsys,
                                                                  monkeypatch):
    folder = _write_run(tmp_path / "run")
    monkeypatch.setattr(run_api, "MAX_JSON_COLLECTIVES", 5)
    assert main(["analyze", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # strict JSON
    assert doc["ranks"] == [0, 1, 2, 3] and doc["world_size"] == 4
    assert len(doc["collectives"]) == 5 and doc["collectives_left_out"] == 3
    assert doc["collectives"][0]["waits_us"]["2"] == 0.0
    assert doc["stragglers"][0]["rank"] == 2
    (found,) = doc["findings"]
    assert found["code"] == "slow_rank" and found["text"].startswith("rank 2 ")
    assert found["text"] == found["sentence"] + "; " + found["advice"]
    assert {"collectives", "collectives_left_out", "stragglers", "findings"} <= set(
        run_api.JSON_SCHEMA)
    row = doc["collectives"][0]
    assert row["arrived_by"] in ("kernel", "host") and set(row["issued"]) == set(row["arrivals"])
    assert "arrived_by (kernel:" in run_api.JSON_SCHEMA["collectives"]
    assert "issued {rank: unix s}" in run_api.JSON_SCHEMA["collectives"]
    assert main(["analyze", str(folder)]) == 0
    # the verdict leads, as the terminal of torchlens run says it
    assert "\nverdict: rank 2 is the slow rank" in capsys.readouterr().out


def test_an_even_run_has_no_findings(tmp_path):
    """Every rank issues at the same µs: ties go to the lowest rank, whose
    'lateness' made nobody wait, so nothing stands out."""
    run = load_run(str(_write_run(tmp_path / "run", late_rank=-1)), workers=1)
    assert (run.collectives()["total_wait_us"] == 0).all()
    assert run.findings() == []
    assert run.stragglers().iloc[0]["caused_us"] == 0


def _rows_last(lasts: list[int], world: int = 4, wait_us: float = 2_000.0) -> list[CollectiveRow]:
    """Allreduce rows where ``lasts[i]`` arrived last and each other rank waited ``wait_us``."""
    rows = []
    for i, last in enumerate(lasts):
        waits = {r: (0.0 if r == last else wait_us) for r in range(world)}
        rows.append(CollectiveRow(trace=0, step=None, seq=i, name="allreduce", mismatch=None,
                                  ranks=world, missing=[], last_rank=last, waits_us=waits,
                                  total_wait_us=sum(waits.values())))
    return rows


def test_the_chance_rule_counts_every_rank_that_could_have_been_named():
    # 4 even ranks: one of them last at 6 of 8 allreduces happens by chance
    # 4 x 0.42% of the time; at 7 of 8, 4 x 0.05%
    ranks = {r: [] for r in range(4)}
    assert findings(ranks, 4, rows=_rows_last([2, 2, 2, 0, 2, 2, 1, 2])) == []
    (said,) = findings(ranks, 4, rows=_rows_last([2, 2, 2, 0, 2, 2, 2, 2]))
    assert said.sentence.startswith("rank 2 is the slow rank: no measured part explains it; "
                                    "it arrived last at 88% of allreduces (7 of 8)")
    assert (said.severity, said.value("last"), said.value("compared")) == ("warning", 7, 8)


# ---------------------------------------------------------------- units
def test_busbw_factors_are_nccl_tests():
    n = 8
    assert busbw_factor("allreduce", n) == pytest.approx(2 * 7 / 8)
    for kind in ("allgather", "reducescatter", "alltoall"):
        assert busbw_factor(kind, n) == pytest.approx(7 / 8)
    assert busbw_factor("broadcast", n) == busbw_factor("reduce", n) == 1.0
    assert busbw_factor("barrier", n) is None
    assert busbw_factor("allreduce", 1) == 0.0


def _rec(seq: int, name: str, t0: float, nbytes: int | None = 1000) -> Collective:
    return Collective(seq=seq, name=name, t0=t0, t1=t0 + 1e-3, dur_us=1000.0, bytes=nbytes)


def test_traces_pair_by_their_place_and_short_ranks_are_missing():
    """Rank 1's first trace was unreadable: its second pairs with rank 0's second."""
    ranks = {0: [TraceFigures(collectives=[_rec(0, "broadcast", 1.0)], trace=0),
                 TraceFigures(collectives=[_rec(0, "allreduce", 2.0), _rec(1, "allreduce", 3.0)],
                              trace=1)],
             1: [TraceFigures(collectives=[_rec(0, "allreduce", 2.001)], trace=1)]}
    rows = collective_rows(ranks, world_size=2)
    assert [(r.trace, r.seq, r.ranks, r.missing) for r in rows] == [
        (0, 0, 1, []), (1, 0, 2, []), (1, 1, 1, [1])]
    assert rows[0].last_rank is None and rows[0].algbw_GBps == pytest.approx(1e-3)
    assert rows[1].last_rank == 1 and rows[1].waits_us[0] == pytest.approx(1000.0)
    assert rows[1].timed_by == "host"
    # a size that differs where every rank must pass the same count is a mismatch
    ranks[1][0].collectives[0].bytes = 999  # type: ignore[index]
    assert collective_rows(ranks)[1].mismatch == (
        "sizes differ: 1000 B on rank 0; 999 B on rank 1")


def test_the_columns_travel_smaller_than_dicts(traces_dir):
    trace = load_trace(traces_dir / "v100_ddp_sgd_annotations_rank0.json.gz")
    table = collective_table(trace)
    assert records(table) == rank_collectives(trace)
    assert len(table.name) == 35 and table.names == ["broadcast", "allreduce"]
    sent = len(pickle.dumps(table))
    assert sent < len(pickle.dumps(records(table))) and sent / 35 < 40
    # plain lists, JSON-able like the other figures
    json.dumps(msgspec.to_builtins(table), allow_nan=False)
    assert all(re.fullmatch(r"[a-z]+", n) for n in table.names)

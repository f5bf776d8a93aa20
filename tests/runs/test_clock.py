"""Clock alignment across ranks (``analysis.runs.clock``).

The ranks are one shared trace written again with every ``ts`` moved by a
known shift (as ``benchmarks/make_rank_set.py`` does): the clock offset found
must be that shift, and once aligned the copies arrive together.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import load_run

A100 = "a100_ddp_resnet_rank0_nccl.json.gz"


def _write_rank(doc: dict[str, Any], out: Path, rank: int, world: int,
                shift_us: float) -> None:
    copy = dict(doc)
    copy["distributedInfo"] = {**(doc.get("distributedInfo") or {}), "rank": rank,
                               "world_size": world}
    copy["traceEvents"] = [{**e, "ts": e["ts"] + shift_us} if "ts" in e else e
                           for e in doc["traceEvents"]]
    (out / f"rank{rank}.json").write_text(json.dumps(copy))


@pytest.fixture(scope="module")
def a100_doc(traces_dir, plain) -> dict[str, Any]:
    return plain(traces_dir / A100)


def _run(tmp_path: Path, doc: dict[str, Any], shifts: list[float]) -> Path:
    out = tmp_path / "run"
    out.mkdir()
    for rank, shift in enumerate(shifts):
        _write_rank(doc, out, rank, len(shifts), shift)
    return out


def _collectives(doc: dict[str, Any]) -> int:
    """Outermost ``c10d::`` host ops: one per collective in this trace."""
    c10d = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"
            and e["name"].startswith("c10d::")]
    return sum(not any(o is not e and o["tid"] == e["tid"]
                       and o["ts"] <= e["ts"] < o["ts"] + o["dur"] for o in c10d)
               for e in c10d)


def test_shifted_clocks_are_found_from_collective_ends_and_aligned(tmp_path, a100_doc):
    shifts = [0.0, 5000.0, -2500.5]
    run = load_run(str(_run(tmp_path, a100_doc, shifts)), workers=1)
    clocks = run.clocks().set_index("rank")
    n = _collectives(a100_doc)
    for rank, shift in enumerate(shifts):
        assert clocks.loc[rank, "offset_us"] == pytest.approx(shift, abs=2.0)
        assert clocks.loc[rank, "collectives"] == n
        assert clocks.loc[rank, "residual_max_us"] < 2.0  # same trace: ends agree exactly
        assert clocks.loc[rank, "reference"] == 0
    assert list(clocks["applied"]) == [False, True, True]

    rows = [r for r in run.to_json()["collectives"] if r["arrivals"]]
    assert len(rows) == n
    for r in rows:
        # raw: the clock offsets read as waiting (rank 1's clock is 7.5 ms ahead of rank 2's)
        assert r["max_wait_raw_us"] == pytest.approx(7500.5, abs=2.0)
        assert r["last_rank_raw"] == 1
        # aligned: the copies arrive together
        assert r["aligned"] and r["max_wait_us"] < 2.0
    stragglers = run.stragglers().set_index("rank")
    assert stragglers["caused_us"].max() < 4.0 * n
    assert any("clocks offset from rank 0" in f and "rank 1, 5.0 ms ahead of" in f
               for f in run.findings())


def test_offsets_within_the_jitter_of_one_host_are_shown_not_applied(tmp_path, a100_doc):
    run = load_run(str(_run(tmp_path, a100_doc, [0.0, 4.0])), workers=1)
    clocks = run.clocks().set_index("rank")
    assert clocks.loc[1, "offset_us"] == pytest.approx(4.0, abs=0.5)
    assert not clocks["applied"].any()
    rows = [r for r in run.to_json()["collectives"] if r["arrivals"]]
    # nothing moved: the raw 4 µs stay the waits, rank 1 arrives last
    assert all(not r["aligned"] and r["last_rank"] == 1
               and r["max_wait_us"] == pytest.approx(4.0, abs=0.5) for r in rows)
    assert not any("clocks offset" in f for f in run.findings())


def test_clocks_are_in_the_json_and_the_report(tmp_path, a100_doc, capsys):
    folder = _run(tmp_path, a100_doc, [0.0, 3000.0])
    assert main(["analyze", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["rank"] for c in doc["clocks"]] == [0, 1]
    assert doc["clocks"][1]["offset_us"] == pytest.approx(3000.0, abs=2.0)
    assert doc["clocks"][1]["applied"] is True
    out = tmp_path / "run.html"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "Clocks across ranks" in page and "3.0 ms" in page


def test_ranks_whose_traces_name_one_host_keep_their_clock(tmp_path, a100_doc):
    # the same 5 ms shift, but every trace says it was recorded on one machine:
    # one clock, so the offset is shown and the arrivals stay as recorded
    run = load_run(str(_run(tmp_path, {**a100_doc, "host_name": "node-a"}, [0.0, 5000.0])),
                   workers=1)
    clocks = run.clocks().set_index("rank")
    assert clocks.loc[1, "offset_us"] == pytest.approx(5000.0, abs=2.0)
    assert not clocks["applied"].any() and set(clocks["host"]) == {"node-a"}
    assert (run.collectives()["last_rank"] == 1).all()
    # on two hosts the same shift is a clock offset, and is applied
    out = tmp_path / "two"
    out.mkdir()
    for rank, (host, shift) in enumerate([("node-a", 0.0), ("node-b", 5000.0)]):
        _write_rank({**a100_doc, "host_name": host}, out, rank, 2, shift)
    clocks = load_run(str(out), workers=1).clocks().set_index("rank")
    assert clocks.loc[1, "applied"] and clocks.loc[1, "host"] == "node-b"

"""A run folder written by ``%ddp_check --profile`` (one trace per profiled step
per rank) on the run report's joint timeline and clock table."""

from __future__ import annotations

import json

import pytest

from torchlens.frontends.ddp.api import ddp_check
from torchlens.frontends.kinds import report_html
from torchlens.frontends.runs.api import load_run
from torchlens.render.runs.timeline import timeline_source

from . import profiled

pytestmark = pytest.mark.usefixtures("no_leftovers")


def test_each_profiled_step_of_each_rank_is_on_the_timeline(tmp_path):
    ddp_check(profiled.balanced, profile=True, run_dir=str(tmp_path / "run"), world_size=2,
              backend="gloo", live=False, steps=8, profile_every=4)
    folder = tmp_path / "run"
    manifest = json.loads((folder / "manifest.json").read_text())
    traces = {r: manifest["ranks"][r]["traces"] for r in (0, 1)}
    assert all(len(t) == 2 for t in traces.values())
    run = load_run(str(folder), workers=1)
    # one gloo allreduce per profiled step: the same collective on both ranks' traces
    issued = {}
    for r, paths in traces.items():
        for i, p in enumerate(paths):
            doc = json.loads((folder / p).read_text())
            issued[(r, i)] = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X"
                                 and e.get("name") == "c10d::allreduce_")
    ev, _busy, factors, _merged = timeline_source(run.profile, run.analysis())
    assert {g for g, _ in factors} == {"rank 0", "rank 1"}
    assert [lane for g, lane in factors if g == "rank 0"][-1] == "collectives"
    bars = {(rank, key) for rank, key, lane in zip(ev["rank"], ev["key"], ev["lane"],
                                                   strict=True) if key and lane == "collectives"}
    for r in (0, 1):
        for i in range(2):
            assert sum(1 for rank, key in bars if rank == r and key.startswith(f"{i}:")) \
                == issued[(r, i)] > 0
    clocks = run.clocks()
    assert list(clocks["rank"]) == [0, 1] and not clocks["applied"].any()  # one host
    # (the CLI's worker pool would outlive the test and trip no_leftovers: one process here)
    assert "Timeline of every rank" in report_html(run.profile)

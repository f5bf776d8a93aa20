"""The report of a run whose memory creeps draws each rank's memory over its
steps and gives, per rank, where it started, where it ended and how fast it
grew; the creep's finding says its step count is the steps measured (the
last ones, named), not the leak's whole length."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

import torchlens
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    CreepEntry,
    Manifest,
    RankEntry,
)
from torchlens.formats.run_folder.write import RankFiles, write_run_folder
from torchlens.model.records import StepMemory, StepRecord

MIB = 1 << 20
STEPS = 100


def _trace(rank: int) -> dict:
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}",
               "ts": s * 10_000, "dur": 9_000, "pid": 1, "tid": 1} for s in range(2)]
    return {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2}}


@pytest.fixture(scope="module")
def leak(tmp_path_factory) -> Path:
    """Two ranks whose C heap grows 1 MiB a step from 100 MiB for 99 steps and
    falls back at the last (the job lets go), and the collector's creeps: fitted
    over the last 51 steps before the newest."""
    root = tmp_path_factory.mktemp("leak")
    ranks = []
    for r in (0, 1):
        (root / f"rank{r}").mkdir()
        (root / f"rank{r}" / "trace.pt.trace.json").write_text(json.dumps(_trace(r)))
        recs, t = [], 1_800_000_000.0
        for s in range(STEPS):
            heap = 100 * MIB + (s if s < STEPS - 1 else 0) * MIB
            recs.append(StepRecord(step=s, t0=t, t1=t + 0.01, phases={"forward": 0.01},
                                   mem=StepMemory(rss=300 * MIB, source="rss", heap=heap)))
            t += 0.01
        ranks.append(RankFiles(RankEntry(rank=r, host="box"), recs))
    creeps = [CreepEntry(rank=r, bytes_per_step=float(MIB), total_bytes=50 * MIB, steps=51,
                         source="heap", words=f"rank {r}: memory creep") for r in (0, 1)]
    write_run_folder(str(root), Manifest(source=SOURCE_RUN, world_size=2,
                                         memory_creep=creeps), ranks)
    return root


def _page(run) -> str:
    page = run._repr_mimebundle_()["text/html"]
    while "&amp;" in page:  # the report sits in an iframe's srcdoc
        page = html.unescape(page)
    return page


def test_creep_finding_names_the_steps_it_measured(leak) -> None:
    run = torchlens.load(str(leak))
    creep = next(f for f in run.analysis().findings if f.code == "memory_creep")
    assert creep.sentence == ("ranks 0-1's memory creeps: +1.0 MiB per step on each rank "
                              "over steps 48-98, the last 51 measured")


def test_report_draws_memory_per_rank_with_start_end_and_growth(leak) -> None:
    run = torchlens.load(str(leak))
    m = run.profile.payload.memory
    assert m.source == "heap" and m.window == [48, 98]
    for r in m.ranks:
        assert (r.first_step, r.last_step) == (0, 98)
        assert (r.start_bytes, r.end_bytes) == (100 * MIB, 198 * MIB)
        assert r.growth_per_step == pytest.approx(MIB) and r.creeps
        assert len(r.step) == STEPS
    page = _page(run)
    assert "Memory per rank over the steps" in page
    assert "growth per step (steps 48-98)" in page
    # the section sits right after the findings, before every other section
    assert page.index('id="findings"') < page.index('id="memory-steps"') < page.index(
        'id="steps-over-time"')
    for cell in ("100.0 MiB", "198.0 MiB", "+1.0 MiB"):
        assert f">{cell}<" in page

"""``torchlens diff A B`` of two run folders whose step records differ on one
rank's data phase: the headline names the rank and the phase, with both
medians, before any op or annotation row; a change on every rank alike says
"every rank". The ``--json`` document carries it as ``headline``."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

import torchlens
from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest, RankEntry
from torchlens.formats.run_folder.write import RankFiles, write_run_folder
from torchlens.frontends.cli.main import main
from torchlens.model.records import StepRecord

STEPS = 40


def _trace(rank: int) -> dict:
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}",
               "ts": s * 10_000, "dur": 9_000, "pid": 1, "tid": 1} for s in range(2)]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": s * 10_000 + 100,
                "dur": 500, "pid": 1, "tid": 1} for s in range(2)]
    return {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2}}


def _folder(root: Path, data_ms: dict[int, float], backward_ms: dict[int, float],
            between_ms: dict[int, float] | None = None) -> Path:
    """A two-rank ``torchlens run`` folder: each step's data and backward
    phases (ms) per rank, forward and optimizer 1 ms each, and ``between_ms``
    outside every phase (a sleep no timer saw)."""
    ranks = []
    for r in (0, 1):
        (root / f"rank{r}").mkdir(parents=True)
        (root / f"rank{r}" / "trace.pt.trace.json").write_text(json.dumps(_trace(r)))
        t, recs = 1_800_000_000.0, []
        for s in range(STEPS):
            phases = {"data": data_ms[r] / 1e3, "forward": 1e-3,
                      "backward": backward_ms[r] / 1e3, "optimizer": 1e-3, "collective": 0.0}
            dur = sum(phases.values()) + (between_ms or {}).get(r, 0.0) / 1e3
            recs.append(StepRecord(step=s, t0=t, t1=t + dur, phases=phases))
            t += dur
        ranks.append(RankFiles(RankEntry(rank=r, host="box"), recs))
    write_run_folder(str(root), Manifest(source=SOURCE_RUN, world_size=2), ranks)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("headline")
    return {"healthy": _folder(root / "healthy", {0: 2.1, 1: 2.1}, {0: 5.0, 1: 5.0}),
            # rank 1 loads its data 14.8 ms longer; rank 0 waits in its backward
            "straggler": _folder(root / "straggler", {0: 2.1, 1: 16.9}, {0: 19.8, 1: 5.0}),
            "every": _folder(root / "every", {0: 16.9, 1: 16.9}, {0: 5.0, 1: 5.0}),
            # rank 1 sleeps 20 ms a step outside every phase; rank 0 waits in its backward
            "sleep": _folder(root / "sleep", {0: 2.1, 1: 2.1}, {0: 25.0, 1: 5.0},
                             {0: 0.0, 1: 20.0})}


def test_headline_names_the_rank_and_phase_before_any_op(runs, capsys) -> None:
    d = torchlens.load(str(runs["healthy"])).diff(str(runs["straggler"]))
    h = d.diff.headline
    assert (h.rank, h.phase, h.waiting_phase) == (1, "data", "backward")
    assert h.before_us == pytest.approx(2100) and h.after_us == pytest.approx(16900)
    said = ("rank 1's data phase +14.8 ms a step (2.1 ms -> 16.9 ms); the other rank "
            "waits for it in its backward phase (+14.8 ms a step")
    assert said in d.verdict
    # the op rows are the evidence, after the headline
    assert d.verdict.index("rank 1's data phase") < d.verdict.index("no op or kernel")
    assert main(["diff", str(runs["healthy"]), str(runs["straggler"])]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("diff: ") and said in first
    page = d._repr_mimebundle_()["text/html"]
    while "&amp;" in page:  # the report sits in an iframe's srcdoc
        page = html.unescape(page)
    assert "rank 1&#39;s data phase +14.8 ms a step" in page


def test_every_rank_when_each_changed_alike(runs) -> None:
    d = torchlens.load(str(runs["healthy"])).diff(str(runs["every"]))
    h = d.diff.headline
    assert h.rank is None and h.ranks == [0, 1] and h.phase == "data"
    assert "every rank's data phase +14.8 ms a step (2.1 ms -> 16.9 ms" in d.verdict
    assert "rank 0's" not in d.verdict and "rank 1's" not in d.verdict


def test_json_holds_the_structured_headline(runs, capsys) -> None:
    assert main(["diff", str(runs["healthy"]), str(runs["straggler"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    h = doc["headline"]
    assert (h["rank"], h["phase"]) == (1, "data")
    assert h["before_us"] == pytest.approx(2100) and h["after_us"] == pytest.approx(16900)
    # the keys scripts read before are all still there
    for key in ("schema", "a", "b", "step_time", "rank_steps", "ops", "kernels", "verdict",
                "verdict_code"):
        assert key in doc
    # the same run against itself: no phase changed, no headline
    assert torchlens.load(str(runs["healthy"])).diff(str(runs["healthy"])).diff.headline is None


def test_a_sleep_between_phases_is_said_as_time_between_phases(runs) -> None:
    """Time no phase timer saw is named as such, not as a phase called "other"
    nor as forward or optimizer work."""
    d = torchlens.load(str(runs["healthy"])).diff(str(runs["sleep"]))
    assert (d.diff.headline.rank, d.diff.headline.phase) == (1, "other")
    assert ("rank 1's time between phases (a sleep, logging or I/O no phase timer saw) "
            "+20.0 ms a step") in d.verdict
    assert "other phase" not in d.verdict and "forward" not in d.verdict

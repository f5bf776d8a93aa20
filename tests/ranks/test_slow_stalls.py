"""A rank that stalls outside its collectives now and then (a checkpoint it
saves alone, an evaluation, a sleep) while the others wait inside theirs is
the slow rank, though the medians of its steps look like everyone's; the
ranks that wait are never named, and a loaded machine's odd hiccup is no
stall (``analysis.ranks.stalls``)."""

from __future__ import annotations

import json
from pathlib import Path

from torchlens.analysis.ranks.slow import slow_rank
from torchlens.analysis.runs.verdict import folder_slow_rank
from torchlens.model.findings import PASSED, SLOW_RANK, WARNING
from torchlens.model.records import StepRecord

T0 = 1795804276.0


def _step(step: int, t: float, *, data: float = 0.1, forward: float = 0.5,
          backward: float = 8.0, optimizer: float = 0.6, other: float = 0.3,
          collective: float = 0.0) -> StepRecord:
    """A step record from its phases in ms (``other``: outside every phase)."""
    ms = data + forward + backward + optimizer + collective + other
    phases = {"data": data / 1e3, "forward": forward / 1e3, "backward": backward / 1e3,
              "optimizer": optimizer / 1e3, "collective": collective / 1e3}
    return StepRecord(step=step, t0=t, t1=t + ms / 1e3, phases=phases)


def _jitter(rank: int, step: int) -> float:
    """A few ms of deterministic noise in the wait, as a loaded machine gives."""
    return ((step * 7 + rank * 3) % 11) * 0.4


def _run(steps: int = 100, ranks: int = 2, stall_rank: int | None = 0, every: int = 10,
         stall_ms: float = 100.0, at: tuple[int, ...] | None = None, part: str = "other",
         waited: bool = True) -> list[list[StepRecord]]:
    """``ranks`` ranks of ``steps`` steps; ``stall_rank`` spends ``stall_ms``
    more in ``part`` in the steps ``at`` (default: every ``every``-th) and,
    when ``waited``, the others wait that long in their next step's backward."""
    stalled = set(at if at is not None else
                  (s for s in range(steps) if s % every == every - 1)) if stall_rank is not None \
        else set()
    out = []
    for r in range(ranks):
        t, recs = T0, []
        for s in range(steps):
            kw: dict[str, float] = {"backward": 8.0 + _jitter(r, s)}
            if r == stall_rank and s in stalled:
                kw[part] = kw.get(part, {"data": 0.1, "forward": 0.5, "other": 0.3}[part]) + stall_ms
            if r != stall_rank and waited and s - 1 in stalled:
                kw["backward"] += stall_ms
            rec = _step(s, t, **kw)
            recs.append(rec)
            t = rec.t1
        out.append(recs)
    return out


def test_a_rank_that_stalls_every_10_steps_is_the_slow_rank():
    v = slow_rank(_run())
    assert (v.rank, v.cause) == (0, "stall")
    f = v.finding
    assert f.code == SLOW_RANK and f.severity == WARNING
    assert f.value("rank") == 0 and f.value("cause") == "stall"
    # steps 49-89: the stall in the last step has no next step to wait in yet
    assert f.value("period_steps") == 10 and f.value("stalls") == 5
    assert f.value("steps_compared") == 60
    assert 95 <= f.value("stall_ms") <= 105 and 95 <= f.value("waited_ms") <= 105
    # what was measured, said plainly: not a guess at what the rank did
    assert f.sentence.startswith("rank 0 is the slow rank: every 10 steps it spends 100")
    assert "outside every training phase" in f.sentence
    assert "others wait" in f.sentence and "backward" in f.sentence
    assert "checkpoint" in f.advice


def test_the_stalling_rank_is_named_not_the_ranks_that_wait_for_it():
    for r in (1, 2, 3):
        v = slow_rank(_run(ranks=4, stall_rank=r))
        assert (v.rank, v.cause) == (r, "stall"), r


def test_a_stall_in_data_loading_names_data():
    v = slow_rank(_run(stall_rank=1, part="data"))
    assert (v.rank, v.cause) == (1, "data")


def test_stalls_at_irregular_steps_are_named_without_a_period():
    v = slow_rank(_run(at=(41, 50, 63, 70, 88)))
    assert v.rank == 0 and v.finding.value("period_steps") is None
    assert "5 stalls of the last 60 steps" in v.finding.sentence


def test_no_stall_on_an_even_run():
    v = slow_rank(_run(stall_rank=None))
    assert v.rank is None and v.finding.severity == PASSED


def test_two_hiccups_are_no_stall():
    """A loaded machine holds a rank back once or twice a run."""
    assert slow_rank(_run(at=(55, 80))).rank is None


def test_a_burst_of_slow_steps_is_no_recurring_stall():
    assert slow_rank(_run(at=(70, 71, 72, 73))).rank is None


def test_a_rank_busy_alone_while_nobody_waits_is_no_stall():
    """Own time that grows while the others do not wait (no collective
    holds them) costs the job nothing."""
    assert slow_rank(_run(waited=False)).rank is None


def test_hiccups_on_every_rank_name_none():
    runs = _run(ranks=2, stall_rank=0, at=(45, 65, 85))
    other = _run(ranks=2, stall_rank=1, at=(50, 70, 90))
    mixed = [[a if a.t1 - a.t0 > b.t1 - b.t0 else b for a, b in zip(x, y, strict=True)]
             for x, y in zip(runs, other, strict=True)]
    assert slow_rank(mixed).rank is None


def test_a_run_folder_is_judged_on_enough_steps_to_see_the_stalls(tmp_path: Path):
    """``torchlens analyze`` reads the folder's last steps: as many as the stall rule needs."""
    for r, recs in enumerate(_run(steps=200)):
        (tmp_path / f"rank{r}").mkdir()
        (tmp_path / f"rank{r}" / "steps.jsonl").write_text(
            "".join(json.dumps(rec.to_dict()) + "\n" for rec in recs))
    v = folder_slow_rank(str(tmp_path), [0, 1])
    assert v is not None and (v.rank, v.cause) == (0, "stall")
    assert v.finding.value("stalls") == 5

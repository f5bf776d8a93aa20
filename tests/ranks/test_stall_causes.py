"""What a stall or a slow rank's extra time was: a checkpoint save and an
evaluation are named from their phases (``save``, ``eval``), a plain sleep
stays a stall, and time no phase timer saw is never blamed on the forward
and optimizer of a rank whose forward was timed."""

from __future__ import annotations

from torchlens.analysis.ranks.slow import slow_rank
from torchlens.model.records import StepRecord

T0 = 1795804276.0
BASE = {"data": 0.1, "forward": 0.5, "optimizer": 0.6, "save": 0.0, "eval": 0.0}


def _step(step: int, t: float, backward: float, other: float = 0.3, **extra: float) -> StepRecord:
    phases = {**BASE, **extra, "backward": backward, "collective": 0.0}
    ms = sum(phases.values()) + other
    return StepRecord(step=step, t0=t, t1=t + ms / 1e3,
                      phases={k: v / 1e3 for k, v in phases.items()})


def _run(stalls: dict[str, float], other_ms: float = 0.0, every: int = 10,
         steps: int = 100, each_step: bool = False) -> list[list[StepRecord]]:
    """Rank 0 spends ``stalls`` (phase -> ms) plus ``other_ms`` outside every
    phase in every ``every``-th step (every step with ``each_step``); rank 1
    waits that long in its backward of the same or next step."""
    total = sum(stalls.values()) + other_ms
    out = []
    for r in range(2):
        t, recs = T0, []
        for s in range(steps):
            hit = each_step or s % every == every - 1
            jitter = ((s * 7 + r * 3) % 11) * 0.4
            if r == 0:
                extra = {k: BASE.get(k, 0.0) + v for k, v in stalls.items()} if hit else {}
                rec = _step(s, t, 8.0 + jitter, 0.3 + (other_ms if hit else 0.0), **extra)
            else:
                waited = each_step or (s - 1) % every == every - 1
                rec = _step(s, t, 8.0 + jitter + (total if waited and s else 0.0))
            recs.append(rec)
            t = rec.t1
        out.append(recs)
    return out


def test_a_stall_mostly_in_torch_save_is_a_checkpoint():
    v = slow_rank(_run({"save": 60.0}, other_ms=20.0))
    assert (v.rank, v.cause) == (0, "checkpoint")
    assert "saving a checkpoint" in v.finding.sentence
    assert "async_save" in v.finding.advice


def test_a_checkpoint_whose_copy_to_storage_is_untimed_is_still_a_checkpoint():
    """torch.save 20 ms, then 100 ms making and copying the file (no timer sees it)."""
    v = slow_rank(_run({"save": 20.0}, other_ms=100.0))
    assert (v.rank, v.cause) == (0, "checkpoint")


def test_a_stall_in_an_evaluation_is_an_evaluation():
    v = slow_rank(_run({"eval": 80.0}))
    assert (v.rank, v.cause) == (0, "evaluation")
    assert "evaluat" in v.finding.advice


def test_a_plain_sleep_stays_a_stall():
    v = slow_rank(_run({}, other_ms=100.0))
    assert (v.rank, v.cause) == (0, "stall")
    assert "forward and optimizer" not in v.finding.sentence


def test_a_little_save_in_a_long_sleep_is_no_checkpoint():
    v = slow_rank(_run({"save": 5.0}, other_ms=95.0))
    assert (v.rank, v.cause) == (0, "stall")


def test_a_sleep_in_every_step_is_not_blamed_on_forward_and_optimizer():
    """The per-step rule: the rank's extra time is outside every phase, its forward timed."""
    v = slow_rank(_run({}, other_ms=30.0, each_step=True))
    assert (v.rank, v.cause) == (0, "stall")
    sentence = v.finding.sentence
    assert "time outside every timed phase" in sentence
    assert "forward, optimizer" not in sentence and "forward and optimizer" not in sentence
    assert "sleep" in v.finding.advice


def test_a_save_in_every_step_is_a_checkpoint():
    v = slow_rank(_run({"save": 30.0}, each_step=True))
    assert (v.rank, v.cause) == (0, "checkpoint")


def test_extra_forward_work_in_every_step_is_still_compute():
    v = slow_rank(_run({"forward": 30.0}, each_step=True))
    assert (v.rank, v.cause) == (0, "compute")
    assert "its forward, optimizer and other work took" in v.finding.sentence

"""Memory creep is judged on each rank's own growth: a leak on every rank names
every rank, a step up once or allocator noise names none."""

from __future__ import annotations

import dataclasses
import random

import pytest

from torchlens.analysis.ranks.steps import memory_creep
from torchlens.analysis.ranks.verdict import creep_finding
from torchlens.model.records import StepMemory, StepRecord

MiB = 1 << 20
STEPS = 150


def _mem(source: str, value: int, rss: int) -> StepMemory:
    if source == "cuda":
        return StepMemory(allocated=value, reserved=value + 64 * MiB, rss=rss, source="cuda")
    return StepMemory(rss=rss, heap=value, source="rss")


def _run(per_step: list[int], source: str, *, step_up_at: int | None = None,
         noise: int = 0, seed: int = 0) -> list[list[StepRecord]]:
    """Records of len(per_step) ranks; rank r keeps per_step[r] bytes a step."""
    rng = random.Random(seed)
    out = []
    for grow in per_step:
        recs = []
        for i in range(STEPS):
            value = (117 << 20) + i * grow + rng.randint(-noise, noise)
            if step_up_at is not None and i >= step_up_at:
                value += 200 * MiB  # optimizer state, made once and kept
            rss = (387 << 20) + i * max(grow, MiB) + rng.randint(0, 1 << 16)
            recs.append(StepRecord(step=i, t0=i * 0.1, t1=i * 0.1 + 0.05,
                                   mem=_mem(source, value, rss)))
        out.append(recs)
    return out


@pytest.mark.parametrize("source", ["heap", "cuda"])
def test_a_leak_on_every_rank_names_every_rank(source):
    creep = memory_creep(_run([4 * MiB, 4 * MiB], source), [])
    assert [c.rank for c in creep] == [0, 1]
    assert all(c.source == source and c.bytes_per_step == pytest.approx(4 * MiB, rel=0.01)
               for c in creep)
    finding = creep_finding(creep[0], creep[1:])
    # alike on both ranks: one figure for each, and the steps are the last ones measured
    assert finding.sentence.startswith("ranks 0-1's memory creeps: +4.0 MiB per step on each "
                                       "rank over steps 29-148, the last 120 measured")
    # at different rates, the fastest is named
    faster = dataclasses.replace(creep[1], bytes_per_step=8 * MiB)
    assert creep_finding(creep[0], [faster]).sentence.startswith(
        "ranks 0-1's memory creeps: up to +8.0 MiB per step (rank 1) over steps ")


@pytest.mark.parametrize("source", ["heap", "cuda"])
def test_a_leak_on_one_rank_names_that_rank(source):
    creep = memory_creep(_run([0, 4 * MiB], source), [])
    assert [c.rank for c in creep] == [1]
    assert creep_finding(creep[0]).sentence.startswith("rank 1's memory creeps")


@pytest.mark.parametrize("source", ["heap", "cuda"])
@pytest.mark.parametrize("at", [1, 40, 75, 110])
def test_a_step_up_once_then_flat_is_no_creep(source, at):
    assert memory_creep(_run([0, 0], source, step_up_at=at), []) == []


@pytest.mark.parametrize("source", ["heap", "cuda"])
@pytest.mark.parametrize("seed", range(5))
def test_healthy_noise_is_no_creep(source, seed):
    assert memory_creep(_run([0, 0], source, noise=3 * MiB, seed=seed), []) == []


@pytest.mark.parametrize("source", ["heap", "cuda"])
def test_a_leak_read_back_at_the_job_end_is_still_a_leak(source):
    """The last step closes as the job ends, after the loop let go of what it
    kept: its figure drops back. Over the collector's newest 64 steps that one
    drop hid a leak of 1 MiB a step on every rank."""
    from torchlens.capture.ranks.collector import KEEP_STEPS

    runs = _run([MiB, MiB], source)
    for recs in runs:
        last = recs[-1]
        back = _mem(source, 117 << 20, last.mem.rss)
        recs[-1] = StepRecord(step=last.step, t0=last.t0, t1=last.t1, mem=back)
    creep = memory_creep([recs[-KEEP_STEPS:] for recs in runs], [])
    assert [c.rank for c in creep] == [0, 1]
    assert all(c.bytes_per_step == pytest.approx(MiB, rel=0.05) for c in creep)


def test_a_creep_on_several_ranks_carries_every_rank_it_names():
    """A script reading ``analyze --json`` gets the ranks the sentence names,
    not a count that reads as a rank number."""
    creep = memory_creep(_run([MiB, 2 * MiB, 0], "heap"), [])
    finding = creep_finding(creep[0], creep[1:])
    assert finding.details["ranks"] == [0, 1]
    assert "rank" not in {f.name for f in finding.figures}
    assert finding.to_dict()["details"]["ranks"] == [0, 1]


def test_the_creep_names_the_window_it_compared_in_every_view():
    """"over 51 steps" read as a leak that lasted 51 steps: the terminal's
    memory line, its verdict and a run folder's manifest say which steps the
    rule compared (the last ones measured), not a length."""
    import msgspec

    from torchlens.analysis.runs.verdict import creep_of
    from torchlens.formats.run_folder.manifest import CreepEntry, Manifest

    creep = memory_creep(_run([MiB, MiB], "heap"), [])
    assert creep[0].words.startswith(
        "rank 0: memory creep, +1.0 MiB per step over steps 29-148, the last 120 measured")
    said = "+1.0 MiB per step on each rank over steps 29-148, the last 120 measured"
    assert said in creep_finding(creep[0], creep[1:]).sentence
    # the manifest keeps the window: a report read without the step records says it too
    manifest = Manifest(world_size=2, memory_creep=[
        msgspec.convert(dataclasses.asdict(c), CreepEntry) for c in creep])
    manifest = msgspec.json.decode(msgspec.json.encode(manifest), type=Manifest)
    finding = creep_of(manifest)
    assert finding is not None and said in finding.sentence

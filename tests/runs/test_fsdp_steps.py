"""The FSDP memory of a ``torchlens run`` folder, from hand-made step records:
what each rank's row and sentence say (``analysis.runs.fsdp``), the report's
section and text view, and the rank-side tracker's per-step figures
(``FsdpMemory.take``). The real job is in test_fsdp_run."""

from __future__ import annotations

import msgspec
import pytest

from torchlens.analysis.runs.analyze import analyze
from torchlens.analysis.runs.fsdp import FsdpSteps, fsdp_lines, fsdp_rows
from torchlens.capture.ranks import fsdp_memory
from torchlens.model import Profile
from torchlens.model.payloads import RunPayload
from torchlens.model.records import FsdpStep, StepMemory, StepRecord
from torchlens.render.runs.report import report_parts, text_report

CPU = StepMemory(rss=1 << 30, source="rss")
GPU = StepMemory(rss=1 << 30, allocated=1 << 20, source="cuda")


def _rec(step: int, mem: StepMemory, **fsdp) -> StepRecord:
    return StepRecord(step=step, t0=step, t1=step + 1, mem=mem,
                      **({"fsdp": FsdpStep(**fsdp)} if fsdp else {}))


def _figures() -> dict:
    seen = FsdpSteps()
    shards = {"sharded_bytes": 172, "unsharded_bytes": 344}
    for rec in (_rec(0, CPU, **shards, gathered_peak_bytes=200,
                     gathered_peak_modules=["layers.0", "layers.2"]),
                _rec(1, CPU, **shards, gathered_peak_bytes=304,
                     gathered_peak_modules=["layers.1", "layers.0"],
                     optimizer_state_bytes=368, optimizers=["Adam"]),
                _rec(2, CPU, **shards, gathered_peak_bytes=160,
                     gathered_peak_modules=["layers.0"], optimizer_state_bytes=368,
                     optimizers=["Adam"])):
        seen.add(0, rec)
    seen.add(1, _rec(0, GPU, **shards, gathered_error="AttributeError: no _orig_size",
                     optimizer_state_bytes=368, optimizers=["Adam"]))
    seen.add(2, _rec(0, CPU))  # a rank without FSDP
    return seen.figures()


def test_each_rank_gets_its_highest_gathered_step_and_its_last_shards_and_state():
    rows = {r.rank: r for r in fsdp_rows(_figures())}
    assert set(rows) == {0, 1}  # rank 2 had no FSDP: no row
    zero = rows[0]
    assert (zero.fsdp_sharded, zero.fsdp_unsharded, zero.optimizer_state) == (172, 344,
                                                                                      368)
    assert (zero.fsdp_gathered, zero.gathered_step) == (304, 1)
    assert zero.gathered_modules == "layers.1 + layers.0"
    assert zero.fsdp_gathered_how == "measured" and zero.allocator_peak is None
    lines = fsdp_lines(list(rows.values()))
    assert lines[0] == (
        "rank 0: FSDP: 172 B sharded of 344 B gathered, gathered at once 304 B (measured: "
        "gathered parameters alive at once; 2 modules together, layers.1 + layers.0: a "
        "prefetch, or a module kept gathered), allocator peak not measured on CPU, optimizer "
        "state 368 B (measured: Adam's state tensors after its step)")
    # the count failed on rank 1 (a GPU rank): said, with why; no allocator peak per step
    assert "gathered at once not measured (the count failed: AttributeError" in lines[1]
    assert "allocator peak not measured (torchlens run leaves the job's CUDA peak" in lines[1]
    assert rows[1].fsdp_gathered is None
    # ranks that read alike share one line, as in %ddp_check's memory line
    alike = [zero, msgspec.structs.replace(zero, rank=1), msgspec.structs.replace(zero, rank=2)]
    assert fsdp_lines(alike) == ["ranks 0-2: FSDP: " + lines[0].split(": FSDP: ")[1]]


def _profile(fsdp: dict) -> Profile:
    return Profile(kind="run", title="t", source="x",
                   payload=RunPayload(root="x", world_size=3, fsdp=fsdp))


def test_the_report_has_an_fsdp_section_only_for_an_fsdp_run():
    profile = _profile(_figures())
    a = analyze(profile)
    _, parts = report_parts(profile, a, [])
    page = "".join(map(str, parts))
    assert "FSDP memory per rank" in page and "modules gathered at once" in page
    assert "layers.1 + layers.0" in page and "all parameters gathered" in page
    assert "allocator peak not measured on CPU" in page
    assert "rank 0: FSDP: 172 B sharded of 344 B gathered" in text_report(profile, a)
    plain = _profile({})
    a = analyze(plain)
    _, parts = report_parts(plain, a, [])
    assert "FSDP" not in "".join(map(str, parts)) and "FSDP" not in text_report(plain, a)


def test_a_step_record_without_fsdp_keeps_its_json():
    rec = _rec(3, CPU)
    assert "fsdp" not in rec.to_json()
    assert StepRecord.from_json(rec.to_json()) == rec
    with_fsdp = _rec(3, CPU, sharded_bytes=8)
    assert '"fsdp": {"sharded_bytes": 8}' in with_fsdp.to_json()  # unset figures left out
    assert StepRecord.from_json(with_fsdp.to_json()) == with_fsdp


@pytest.fixture
def tracker():
    held = fsdp_memory.FsdpMemory(fsdp_only=True)
    held.start(None)
    yield held
    held.finish()


def test_a_job_without_fsdp_gets_no_figures_and_its_optimizer_state_is_never_read(tracker):
    import torch

    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.Adam([p])
    p.grad = torch.ones(4)
    opt.step()
    assert tracker.take() is None and tracker.optimizers == {}


def test_each_step_takes_its_own_gathered_peak_and_carries_shards_and_state(tracker):
    import torch

    tracker.shards[1] = (100, 200)  # as the first unshard of an FSDP module records them
    tracker.gathered(1, "layers.0", 200)
    tracker.gathered(2, "layers.1", 200)
    tracker.gathered(2, "layers.1", 0)
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.Adam([p])
    p.grad = torch.ones(4)
    opt.step()
    first = tracker.take()
    assert first.gathered_peak_bytes == 400 and first.sharded_bytes == 100
    assert first.optimizer_state_bytes == 2 * 16 + 4
    # the next step: layers.0 is still gathered when it starts, nothing else is
    walks = []
    real = fsdp_memory.state_bytes
    fsdp_memory.state_bytes = lambda o: walks.append(o) or real(o)
    try:
        opt.step()
    finally:
        fsdp_memory.state_bytes = real
    second = tracker.take()
    assert walks == []  # no parameter gained state: the state dict is not walked again
    assert second.gathered_peak_bytes == 200 and second.gathered_peak_modules == [
        "layers.0"]
    assert second.optimizer_state_bytes == first.optimizer_state_bytes
    assert second.unsharded_bytes == 200


def test_an_nn_sequentials_numbered_modules_do_not_read_as_a_sum():
    """The walk: "2 modules together, 2 + 1" for an nn.Sequential's children."""
    seen = FsdpSteps()
    seen.add(0, _rec(0, CPU, sharded_bytes=8, unsharded_bytes=16, gathered_peak_bytes=12,
                     gathered_peak_modules=["2", "1"]))
    row = fsdp_rows(seen.figures())[0]
    assert row.gathered_modules == "module 2 + module 1"
    assert "2 modules together, module 2 + module 1: a prefetch" in row.text

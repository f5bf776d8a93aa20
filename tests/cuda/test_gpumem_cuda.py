"""``%%gpumem`` on a CUDA training loop: its figures are torch's own.

Each figure the report shows is compared with what the caching allocator
itself says (``torch.cuda.memory_stats``), read in the same process right
after the cell.
"""

from __future__ import annotations

from pathlib import Path

import torch

import torchlens

from .conftest import keep_snapshot


def _loop(steps: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.Adam(model.parameters())
    for _ in range(steps):
        x = torch.randn(128, 512, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return model


def test_timeline_matches_allocator_stats(artifacts: Path, figures: dict) -> None:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_stats()
    with torchlens.gpumem() as r:
        model = _loop()
    after = torch.cuda.memory_stats()
    a = r.analysis()
    tl = a.timeline
    assert a.measured_on == "cuda"
    assert tl.start_allocated == before["allocated_bytes.all.current"]
    assert tl.end_allocated == after["allocated_bytes.all.current"]
    assert tl.peak_allocated == after["allocated_bytes.all.peak"]
    assert tl.reserved[-1] == after["reserved_bytes.all.current"]
    assert a.frag.reserved == after["reserved_bytes.all.current"]
    assert a.frag.inactive_split == after["inactive_split_bytes.all.current"]
    keep_snapshot(artifacts / "cuda_gpumem_train.pickle", r.snapshot(), before, after)
    r.export(str(artifacts / "cuda_gpumem_train.html"))
    figures.update(start=tl.start_allocated, peak=tl.peak_allocated, end=tl.end_allocated,
                   reserved=a.frag.reserved, inactive_split=a.frag.inactive_split,
                   entries=len(a.trace))
    del model


def test_side_stream_record_stream(artifacts: Path, figures: dict) -> None:
    """A tensor used on a side stream and freed on the main one: its block stays
    reserved until the side stream's work is done, but it stops counting as
    allocated at the free, as torch's allocated_bytes does."""
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_stats()
    with torchlens.gpumem() as r:
        for _ in range(6):
            x = torch.randn(4096, 4096, device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = x @ x
            x.record_stream(side)
            del x
            z = torch.empty(4096, 4096, device="cuda")  # allocated while x's free is pending
            del z, y
        torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    keep_snapshot(artifacts / "cuda_gpumem_side_stream.pickle", r.snapshot(), before, after)
    tl = r.analysis().timeline
    figures.update(timeline_peak=tl.peak_allocated, torch_peak=after["allocated_bytes.all.peak"])
    assert tl.peak_allocated == after["allocated_bytes.all.peak"]
    assert tl.end_allocated == after["allocated_bytes.all.current"]


def test_allocator_model_replays_real_snapshot(figures: dict) -> None:
    """The allocator model replays the snapshot just taken: every address equal;
    and a what-if (a smaller capacity) runs on it."""
    from torchlens.analysis.memory.allocator.fidelity import check_fidelity

    torch.cuda.empty_cache()  # start from no segments: the replay starts from empty too
    with torchlens.gpumem(simulate=True, capacity="2GiB") as r:
        _loop(3)
    report = check_fidelity(r.snapshot(), "cuda training loop")
    assert report is not None
    figures.update(address_match=report.address_match, layout_equal=report.layout_equal,
                   notes=report.notes)
    assert report.address_match == 1.0, report
    assert report.layout_equal and report.final_bytes_equal, report
    assert r.analysis().comparison, "the what-if produced no comparison"

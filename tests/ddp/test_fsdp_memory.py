"""The FSDP memory figures' labels: what was measured and how, what was modelled.

The CUDA allocator's peak is read through two thin functions faked here
(no GPU on the test machine); the CPU measurements run on real FSDP in
test_fsdp_check.
"""

from __future__ import annotations

from torchlens.analysis.ddp.fsdp import memory_text, rank_row
from torchlens.capture.ranks import fsdp_memory
from torchlens.model.collectives import Fingerprint
from torchlens.model.rank_report import report_from


def _rank(r, memory=None):
    step = {"step": 0, "modules": [{"name": "returned #0 (Stack)", "params": [],
                                    "fsdp": {"sharded_bytes": 432, "unsharded_bytes": 864}}]}
    if memory:
        step["fsdp_memory"] = memory
    return report_from({"rank": r, "steps": [step]})  # as the launcher decodes a result


def test_cuda_allocator_peak_is_read_over_the_step_and_labelled(monkeypatch):
    calls = []
    monkeypatch.setattr(fsdp_memory, "reset_allocator_peak",
                        lambda d: calls.append(("reset", d)) or True)
    monkeypatch.setattr(fsdp_memory, "allocator_peak", lambda d: calls.append(("read", d)) or 5 << 20)
    held = fsdp_memory.FsdpMemory()
    held.start("cuda:1")
    held.gathered(1, "layers.0", 288)
    held.gathered(2, "layers.1", 288)
    held.gathered(1, "layers.0", 0)
    record: dict = {}
    held.finish_into(record)
    assert calls == [("reset", "cuda:1"), ("read", "cuda:1")]  # reset at the start, read at end
    got = record["fsdp_memory"]
    assert got["allocator_peak_bytes"] == 5 << 20
    assert got["gathered_peak_bytes"] == 576 and got["gathered_peak_modules"] == ["layers.0",
                                                                                  "layers.1"]
    text, figures = memory_text([_rank(0, got)], [[]])
    assert "allocator peak 5.0 MiB over the step (measured: allocator peak" in text, text
    assert "gathered at once 576 B (measured: gathered parameters alive at once" in text
    assert rank_row(figures[0])["fsdp_gathered_how"] == "measured"


def test_without_a_measurement_the_largest_all_gather_is_given_as_modelled():
    fps = [Fingerprint(op="all_gather_into_tensor", module="layers.0", shapes=[[72]],
                       dtypes=["float32"])]
    text, figures = memory_text([_rank(0)], [fps])
    assert ("largest module gathered at once 288 B (modelled: the largest all_gather output"
            in text), text
    assert "optimizer state not measured" in text
    assert rank_row(figures[0])["fsdp_gathered_how"] == "modelled"


def test_a_cpu_device_reads_no_allocator_peak():
    held = fsdp_memory.FsdpMemory()
    held.start(None)
    assert held.finish() is None  # nothing gathered, no optimizer stepped, no GPU


def test_fsdp_internals_that_moved_stop_the_count_and_say_so_without_failing_the_job():
    class Group:  # an FSDP whose group lacks the attributes this torch's has
        def unshard(self):
            return "ran"

    fsdp_memory._wrap(Group, ("unshard",), fsdp_memory._fsdp2_after)
    held = fsdp_memory.FsdpMemory()
    held.start(None)
    assert Group().unshard() == "ran"  # the job's call went through
    got = held.finish()
    assert "AttributeError" in got.gathered_error
    fps = [Fingerprint(op="all_gather_into_tensor", module="layers.0", shapes=[[72]],
                       dtypes=["float32"])]
    text, _ = memory_text([_rank(0, got.to_dict())], [fps])
    assert "(modelled: the largest all_gather output; not measured: the count failed: " \
           "AttributeError" in text, text


def test_optimizer_state_is_read_at_its_first_step_and_again_when_it_grows():
    import torch

    a, b = (torch.nn.Parameter(torch.ones(4)) for _ in range(2))
    opt = torch.optim.Adam([a, b])
    held = fsdp_memory.FsdpMemory()
    held.start(None)
    a.grad = torch.ones(4)  # only a has a gradient: only a gets state
    opt.step()
    first = held.finish().optimizer_state_bytes
    held.start(None)
    opt.step()
    b.grad = torch.ones(4)
    opt.step()
    assert held.finish().optimizer_state_bytes == 2 * first == 2 * (2 * 16 + 4)

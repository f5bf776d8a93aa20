"""``--categories torch`` on the CUDA path, on a CPU machine: the CUDA boundary faked
with a real snapshot (``test_cuda_boundary_fake.fake_cuda``) and the profiler's start
faked with one whose ``_memory_profile()`` is built from torch's own key and category
types, so matching its records to the allocator history's entries runs for real."""

from __future__ import annotations

import types

import pytest
import torch
from test_cuda_boundary_fake import fake_cuda  # noqa: F401 - the fixture

from torchlens.analysis.memory.analyze import analyze
from torchlens.capture.memory import torch_categories as tc
from torchlens.capture.memory.capture import MemoryCapture
from torchlens.model import MemoryOptions

mp = pytest.importorskip("torch.profiler._memory_profiler")


def _fake_profiler(allocs):
    """A profiler whose memory profile names ``allocs``: (addr, time_us, size) ->
    parameter; the second becomes a gradient 5 us later (a version bump); one record
    on the CPU and one 5 ms off the history's time must match nothing."""
    cuda = torch.device("cuda", 0)
    line, cats = [], {}
    for i, (addr, t_us, size) in enumerate(allocs):
        key = mp.TensorKey(cuda, i, mp._Storage(addr, i))
        line.append((t_us * 1000 + 400, mp.Action.CREATE, (key, 0), size))
        cats[(key, 0)] = mp.Category.PARAMETER
        if i == 1:
            line.append(((t_us + 5) * 1000, mp.Action.INCREMENT_VERSION, (key, 0), size))
            cats[(key, 1)] = mp.Category.GRADIENT
    addr, t_us, size = allocs[2]
    cpu_key = mp.TensorKey(torch.device("cpu"), 90, mp._Storage(addr, 90))
    far_key = mp.TensorKey(cuda, 91, mp._Storage(allocs[0][0], 91))
    line += [(t_us * 1000, mp.Action.CREATE, (cpu_key, 0), size),
             ((allocs[0][1] - 5000) * 1000, mp.Action.CREATE, (far_key, 0), size)]
    cats[(cpu_key, 0)] = cats[(far_key, 0)] = mp.Category.ACTIVATION
    profile = types.SimpleNamespace(timeline=sorted(line, key=lambda x: x[0]),
                                    _categories=types.SimpleNamespace(
                                        get=lambda k, v: cats.get((k, v))))
    return types.SimpleNamespace(_memory_profile=lambda: profile, stopped=False)


def test_cuda_capture_takes_torchs_categories_beside_the_history(fake_cuda,  # noqa: F811
                                                                  monkeypatch):
    from gpumem_fixtures import SNAPSHOTS

    from torchlens.model.snapshot import load_snapshot

    trace = load_snapshot(SNAPSHOTS / "eor_nn_with_snapshot_actions.pickle").device_traces[0]
    # the first allocations still alive at the end (so alive at the peak, wherever it is)
    freed = {e.addr for e in trace if e.action == "free_completed"}
    allocs = [(e.addr, e.time_us, e.size) for e in trace
              if e.action == "alloc" and e.addr not in freed][:3]
    prof = _fake_profiler(allocs)
    monkeypatch.setattr(tc, "start_profiler", lambda: prof)
    monkeypatch.setattr(tc, "stop_profiler", lambda p: setattr(p, "stopped", True))
    with MemoryCapture(MemoryOptions(categories="torch")) as cap:
        pass
    assert prof.stopped
    assert cap.profile.payload.categories_error == ""
    kept = cap.profile.snapshots["device0"].device_traces[0]
    named = {e.addr: e.torch_category for e in kept if e.torch_category is not None}
    t0, t1 = allocs[0][1], allocs[1][1]
    assert named == {allocs[0][0]: [[t0, "parameter"]],
                     allocs[1][0]: [[t1, "parameter"], [t1 + 5, "gradient"]],
                     allocs[2][0]: [[allocs[2][1], "parameter"]]}
    pk = analyze(cap.profile).peak
    by_addr = {kept[b.index].addr: b for b in pk.blocks if b.index is not None}
    assert by_addr[allocs[1][0]].category == "gradient"  # the version current at the peak
    assert by_addr[allocs[0][0]].source == by_addr[allocs[1][0]].source == "torch"
    assert pk.category_from == "from torch's memory profiler, the rest inferred from stacks"


def test_profiler_that_cannot_start_on_cuda_is_one_line(fake_cuda, monkeypatch):  # noqa: F811
    def refuse():
        raise RuntimeError("Profiler is already enabled on this thread")

    monkeypatch.setattr(tc, "start_profiler", refuse)
    with MemoryCapture(MemoryOptions(categories="torch")) as cap:
        pass
    why = cap.profile.payload.categories_error
    assert why.startswith("torch's profiler could not start (RuntimeError: Profiler is")
    pk = analyze(cap.profile).peak
    assert pk.category_from == "inferred from stacks"
    assert any(why in m and "inferred from stacks" in m for m in pk.missing)

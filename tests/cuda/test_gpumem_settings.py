"""``%%gpumem`` under the allocator's other settings, each in a fresh process
(the allocator reads PYTORCH_CUDA_ALLOC_CONF once): expandable segments,
cudaMallocAsync, a history that wrapped, and an out-of-memory error."""

from __future__ import annotations

from pathlib import Path

from .conftest import run_snippet

_LOOP = """
import json, pickle, sys, torch, torchlens
def loop(n=4):
    m = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.Adam(m.parameters())
    for _ in range(n):
        m(torch.randn(128, 512, device='cuda')).square().mean().backward()
        opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return m
"""


def test_expandable_segments(artifacts: Path, figures: dict) -> None:
    out = artifacts / "cuda_gpumem_expandable.pickle"
    got = run_snippet(_LOOP + f"""
from tests.cuda.conftest import keep_snapshot
torch.cuda.reset_peak_memory_stats()
before = torch.cuda.memory_stats()
with torchlens.gpumem() as r:
    m = loop()
st = torch.cuda.memory_stats(); a = r.analysis()
keep_snapshot(__import__('pathlib').Path({str(out)!r}), r.snapshot(), before, st)
print(json.dumps(dict(peak=a.timeline.peak_allocated, torch_peak=st['allocated_bytes.all.peak'],
    end=a.timeline.end_allocated, torch_end=st['allocated_bytes.all.current'],
    reserved=a.frag.reserved, torch_reserved=st['reserved_bytes.all.current'],
    split=a.frag.inactive_split, torch_split=st['inactive_split_bytes.all.current'],
    expandable=a.frag.n_expandable_segments, notes=a.notes)))
""", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    figures.update(got)
    assert got["expandable"] >= 1
    assert got["peak"] == got["torch_peak"] and got["end"] == got["torch_end"]
    assert got["reserved"] == got["torch_reserved"]
    assert got["split"] == got["torch_split"]


def test_cuda_malloc_async_falls_back(figures: dict) -> None:
    got = run_snippet(_LOOP + """
with torchlens.gpumem() as r:
    m = loop()
p = r.profile
print(json.dumps(dict(unmeasured=p.unmeasured, text=repr(r)[:2000],
     after=p.payload.stats_after.get('allocated_bytes.all.current'))))
""", PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    figures.update(got)
    said = " ".join(got["unmeasured"]).lower()
    assert "cudamallocasync" in said and "history" in said, got


def test_wrapped_history_is_reported(figures: dict) -> None:
    got = run_snippet("""
import json, torch
from torchlens.capture.memory.capture import MemoryCapture
from torchlens.frontends.kinds import analyze
from torchlens.model import MemoryOptions
keep = [torch.empty(1024, device='cuda') for _ in range(50)]  # alive before the cell
with MemoryCapture(MemoryOptions(max_entries=1000)) as cap:
    for i in range(3000):
        t = torch.empty(4096, device='cuda'); del t
    del keep[:25]
torch.cuda.synchronize()
a = analyze(cap.profile); st = torch.cuda.memory_stats()
print(json.dumps(dict(entries=len(a.trace), notes=a.notes, unmeasured=cap.profile.unmeasured,
    end=a.timeline.end_allocated, torch_end=st['allocated_bytes.all.current'])))
""")
    figures.update({k: v for k, v in got.items() if k != "notes"})
    words = " ".join(got["notes"] + got["unmeasured"]).lower()
    assert "wrap" in words or "oldest" in words or "missing" in words, got
    assert got["end"] == got["torch_end"], got


def test_oom_diagnosis(artifacts: Path, figures: dict) -> None:
    snap = artifacts / "cuda_oom.pickle"
    got = run_snippet(f"""
import json, pickle, torch, torchlens
torch.cuda.set_per_process_memory_fraction(0.02)
total = torch.cuda.get_device_properties(0).total_memory
kept = []
try:
    with torchlens.gpumem() as r:
        while True:
            kept.append(torch.empty(int(total * 0.004), dtype=torch.uint8, device='cuda'))
except torch.OutOfMemoryError as e:
    message = str(e)
d = r.diagnosis()
pickle.dump(r.snapshot(), open({str(snap)!r}, 'wb'))
print(json.dumps(dict(message=message[:600], requested=d.requested, device_free=d.device_free,
     capacity=d.capacity, reserved=d.reserved, source=d.source, total=total,
     error=r.profile.error and r.profile.error.get('type'))))
""")
    figures.update(got)
    assert got["requested"] and got["requested"] > 0, got
    assert got["device_free"] is not None, got
    assert got["capacity"] and got["reserved"], got
    # the limit this process ran into is the 2% it was allowed, not the whole GPU
    assert got["capacity"] <= 0.03 * got["total"], got

"""A rank's CUDA reads on hardware this machine does not have, through a fake
of exactly the torch.cuda boundary (``fake_cuda``): the right GPU is read from
any thread, a rank whose job is on the CPU never starts CUDA, per-rank
``CUDA_VISIBLE_DEVICES`` keeps CUDA memory, and an out-of-memory leaves a
snapshot or says why it could not.
"""

from __future__ import annotations

import pickle
import signal
import sys
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.ddp.memory import sample
from torchlens.capture.ranks import attach, cuda_device
from torchlens.capture.ranks.oom import is_cuda_oom, save_oom_snapshot
from torchlens.capture.ranks.stepper import RankProfiler
from torchlens.model.messages import OomOutcome

from .fake_cuda import FakeCuda, Gpu, MiB, one_visible_gpu


def _in_thread(fn):
    """``fn()`` on a new thread, as the heartbeat runs: its current device is 0."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def _two_gpus() -> list[Gpu]:
    # rank 1 of a node: its own GPU 1 holds its model; GPU 0 is rank 0's
    return [Gpu(uuid="GPU-aaaa", allocated=0, reserved=0, free_blocks=[512 * MiB]),
            Gpu(uuid="GPU-bbbb", allocated=300 * MiB, reserved=400 * MiB,
                inactive_split=6 * MiB, free_blocks=[32 * MiB, 8 * MiB])]


def test_heartbeat_thread_reads_the_ranks_gpu_not_gpu_0(monkeypatch) -> None:
    fake = FakeCuda(_two_gpus()).install(monkeypatch)
    fake.set_device(1)  # the training thread's torch.cuda.set_device(local_rank)
    mem = _in_thread(lambda: sample(with_tensors=False, device=torch.device("cuda", 1)))
    assert mem.cuda_allocated == 300 * MiB and mem.cuda_reserved == 400 * MiB
    assert sample(with_tensors=False, device=None).cuda_allocated is None  # before init_group


def test_step_records_read_the_named_gpu_once_per_step(tmp_path, monkeypatch) -> None:
    fake = FakeCuda(_two_gpus()).install(monkeypatch)
    fake.set_device(1)
    rp = RankProfiler(rank=1, run_dir=str(tmp_path), device=torch.device("cuda", 1), every=None)
    rp.start()
    fake.calls.clear()
    _in_thread(lambda: [rp.step() for _ in range(3)])  # a thread on device 0
    rp.finish()
    steps = [r for r in rp.records if not r.window]
    assert [(r.mem.source, r.mem.allocated, r.mem.reserved, r.mem.inactive_split)
            for r in steps] == [("cuda", 300 * MiB, 400 * MiB, 6 * MiB)] * 3
    reads = [name for name, _ in fake.calls if name.startswith("memory_stats")]
    assert reads == ["memory_stats_as_nested_dict"] * 3  # no flattened memory_stats


def test_device_follows_the_allocations_when_the_script_never_set_one(monkeypatch) -> None:
    fake = FakeCuda(_two_gpus()).install(monkeypatch)
    fake._lazy_init("model.to('cuda:1')")  # current device stays 0
    assert cuda_device.script_device() == torch.device("cuda", 1)


def test_largest_free_block_is_the_ranks_own_and_skips_the_history(monkeypatch) -> None:
    fake = FakeCuda(_two_gpus()).install(monkeypatch)
    fake.set_device(1)
    assert cuda_device.largest_free(torch.device("cuda", 1)) == 32 * MiB  # not GPU 0's 512
    assert ("memory_snapshot", False) in fake.calls
    fake.backend = "cudaMallocAsync"
    assert cuda_device.largest_free(torch.device("cuda", 1)) is None  # not measured, not 0


# -- torchlens run: the rank attached in this process ----------------------------------
@pytest.fixture
def attached(tmp_path, monkeypatch):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    key = RunKey.new()
    monkeypatch.setattr(attach, "HEARTBEAT_S", 60.0)  # this test reads the records itself
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    term = signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv(attach.ENV_RUN_DIR, str(tmp_path))
    made = []

    def make(rank: int, local_rank: int) -> attach.Attachment:
        for k, v in (("RANK", rank), ("WORLD_SIZE", 2), ("LOCAL_RANK", local_rank)):
            monkeypatch.setenv(k, str(v))
        a = attach.Attachment(key, "127.0.0.1", store.port)
        a.start()
        made.append(a)
        return a

    def hello(a: attach.Attachment) -> dict:
        return protocol.Channel(store, key).get(protocol.slot_key(key.run_id, a.slot, "hello"))

    yield make, hello
    for a in made:
        a.close("exit")
    signal.signal(signal.SIGTERM, term)


class _Profile:
    """torch.profiler.profile, recording the activities it was asked for."""

    asked: list[list] = []

    def __init__(self, activities, **_) -> None:
        _Profile.asked.append(list(activities))

    def start(self) -> None: ...
    def stop(self) -> None: ...

    def export_chrome_trace(self, path: str) -> None:
        with open(path, "w") as fh:
            fh.write('{"traceEvents": []}')


def test_per_rank_visible_devices_keep_cuda_memory_and_activity(attached, monkeypatch) -> None:
    """Slurm --gpus-per-task: rank 1 (LOCAL_RANK=1) sees one GPU, cuda:0."""
    fake = FakeCuda(one_visible_gpu("GPU-bbbb", allocated=256 * MiB)).install(monkeypatch)
    fake.set_device(0)  # the script's own choice, before its first torchlens.step()
    monkeypatch.setattr(torch.profiler, "profile", _Profile)
    _Profile.asked.clear()
    make, hello = attached
    a = make(rank=1, local_rank=1)
    for _ in range(5):  # step 4 is profiled
        a.profiler.step()
    assert hello(a)["device"] == "cuda:0"
    assert {(r.mem.source, r.mem.allocated) for r in a.profiler.records} == {("cuda", 256 * MiB)}
    assert _Profile.asked and torch.profiler.ProfilerActivity.CUDA in _Profile.asked[0]


def test_cpu_job_on_a_gpu_host_never_starts_cuda(attached, monkeypatch) -> None:
    fake = FakeCuda(_two_gpus()).install(monkeypatch)
    make, hello = attached
    a = make(rank=0, local_rank=0)
    for _ in range(6):  # step 4 runs the real torch.profiler (CPU activity)
        a.profiler.step()
    assert {r.mem.source for r in a.profiler.records} == {"rss"}
    a.close("exit")  # the profiled step's summary, profile.__exit__ and all
    assert hello(a)["device"] == "cpu"
    assert fake.inits == [] and not fake.initialized  # no context on GPU 0


# -- out of memory ---------------------------------------------------------------------
@pytest.mark.parametrize("exc", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
                 "reported"),  # cuBLAS handle creation
    RuntimeError("NCCL communicator was aborted"),  # raised from the OOM below
])
def test_oom_of_any_origin_leaves_a_snapshot(exc, tmp_path, monkeypatch) -> None:
    fake = FakeCuda(_two_gpus()).install(monkeypatch)
    fake.set_device(1)
    if "NCCL" in str(exc):
        exc.__cause__ = RuntimeError("NCCL error: unhandled cuda error, NCCL version 2.21.5\n"
                                     "Cuda failure 2 'out of memory'")
    (tmp_path / "rank1").mkdir()
    out = save_oom_snapshot(exc, str(tmp_path), 1)
    assert out == OomOutcome(path=str(tmp_path / "rank1" / "oom.pickle"))
    with open(out.path, "rb") as fh:
        assert {s["device"] for s in pickle.load(fh)["segments"]} == {0, 1}


def test_an_error_that_is_no_oom_takes_no_snapshot(tmp_path, monkeypatch) -> None:
    FakeCuda(_two_gpus()).install(monkeypatch)._lazy_init("test")
    assert not is_cuda_oom(RuntimeError("CUDA error: an illegal memory access"))
    assert save_oom_snapshot(ValueError("bad shape"), str(tmp_path), 0) is None


def test_cuda_malloc_async_says_why_there_is_no_snapshot(attached, monkeypatch, capsys) -> None:
    fake = FakeCuda(one_visible_gpu("GPU-cccc", 64 * MiB), backend="cudaMallocAsync")
    fake.install(monkeypatch).set_device(0)
    make, _ = attached
    a = make(rank=0, local_rank=0)
    try:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    except torch.cuda.OutOfMemoryError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)  # the rank's uncaught exception
    err = capsys.readouterr().err
    assert "no allocator snapshot saved" in err and "cudaMallocAsync" in err
    assert any("cudaMallocAsync" in e for e in a.profiler.errors)  # sent in its bye


def test_a_failed_snapshot_is_reported_not_swallowed(tmp_path, monkeypatch) -> None:
    fake = FakeCuda(_two_gpus()).install(monkeypatch)
    fake.set_device(1)
    fake.snapshot_error = RuntimeError("CUDA error: out of memory")  # the snapshot itself
    (tmp_path / "rank1").mkdir()
    out = save_oom_snapshot(RuntimeError("CUDA error: out of memory"), str(tmp_path), 1)
    assert out.path is None and "snapshot failed" in out.why and "out of memory" in out.why
    assert not (tmp_path / "rank1" / "oom.pickle").exists()

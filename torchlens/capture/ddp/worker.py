"""One spawned rank: ``python -m torchlens.capture.ddp.worker HOST PORT RANK WORLD``.

Connects to the kernel's TCPStore, loads the job the kernel wrote there
(cloudpickle: notebook functions travel by value), starts the process group on
the same store, and then, each step from the same seeds, runs the user's code
under the ``CollectiveRecorder``. A heartbeat thread publishes progress and
memory several times a second; ``SIGUSR1`` makes faulthandler write every
thread's Python stack to a per-rank file (the hang report). Everything the
worker learns goes back as JSON in ``result/<rank>``.

Everything it writes is sealed with the run's key and everything it reads is
opened first (``protocol.Channel``); the key comes from the environment the
launcher set (``signing.RunKey.from_env``), never from argv. The payload is
unpickled only after its signature checks out: anyone who can reach the
store's port could otherwise make every rank run their code.

Under torch's elastic agent (``%ddp_check --nnodes``: ``torchrun ... -m
torchlens.capture.ddp.worker --elastic HOST PORT DIR``) the rank, world size,
local rank, node (``GROUP_RANK``) and restart count come from the agent's
environment and the process group from ``init_method="env://"`` (the agent's
MASTER_ADDR/PORT); the kernel's store carries only the torchlens channel.
Heartbeats and the result then say which node and host the rank is on.

The user's code may call ``init_process_group`` / ``destroy_process_group``
itself (as it would under torchrun): the group already exists, so those
calls are made no-ops for the default group.
"""

from __future__ import annotations

import contextlib
import faulthandler
import inspect
import os
import random
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import msgspec

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import ENV_SECRET, Forged, RunKey
from torchlens.capture.ddp.checksums import record_modules, track_ddp
from torchlens.capture.ddp.elastic import AgentPlace, rank_args
from torchlens.capture.ddp.options import EXPORT_PHASE, DdpJob
from torchlens.capture.ranks.fsdp_memory import FsdpMemory
from torchlens.model import error_record
from torchlens.model.messages import DdpHeartbeat, MemoryReading, RankPlace
from torchlens.model.rank_report import (
    Bandwidth,
    CommCheck,
    Determinism,
    ProfileTold,
    RankError,
    RankResult,
    WorkerStep,
)

_T_START = time.time()  # interpreter up, before torch: the start of the rank's timeline
ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
HEARTBEAT_S = 0.2
# float32 elements: 16 KiB (latency-bound) and 1 MiB (bandwidth-bound). Two
# sizes x BANDWIDTH_REPS timed calls, no warm-up (the known-answer all_reduce
# already opened the pairs): enough for an order of magnitude, and the probe
# costs milliseconds instead of a 4 MiB x 4 run on the critical path.
BANDWIDTH_SIZES = (1 << 12, 1 << 18)
BANDWIDTH_REPS = 2


class PayloadRefused(Forged):
    """The job in the store is not signed with this run's key: it is not unpickled."""


def _env() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in ENV_KEYS}


def _seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


class Worker:
    """Runs the job on this rank and reports through the store."""

    def __init__(self, host: str, port: int, rank: int, world_size: int,
                 summarize: Any = None, *, key: RunKey,
                 elastic: AgentPlace | None = None) -> None:
        import torch.distributed as dist

        self.timings: dict[str, float] = {"start": _T_START, "torch": time.time()}
        self.rank, self.world_size, self.host, self.port = rank, world_size, host, port
        self.parent = os.getppid()
        raw = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=120))
        self.key = key
        self.store = protocol.Channel(dist.PrefixStore(protocol.PREFIX, raw), key)
        self.raw_store = raw
        self.timings["store"] = time.time()
        self.phase = "starting"
        self.device: Any = None  # the rank's device, once the group is up
        #: whose memory the heartbeat reads: named, since the heartbeat thread's
        #: current device is 0; set by the main thread (gloo: where the code ran)
        self.mem_device: Any = None
        self.recorder: Any = None
        self.stepper: Any = None  # --profile: the RankProfiler
        self.summarize = summarize
        self._send_lock = threading.Lock()
        self._sent = [0, 0]  # step batches, summaries
        self.peak = MemoryReading()
        self.result = RankResult(rank=rank, pid=os.getpid(), env_start=_env())
        #: --nnodes: node, local_rank, restart, hostname (from the agent's environment)
        self.elastic = elastic
        self.where = RankPlace()
        if elastic is not None:
            self.where = RankPlace(node=elastic.node, host=elastic.hostname, pid=os.getpid())
            self.result.node, self.result.local_rank = elastic.node, elastic.local_rank
            self.result.restart, self.result.hostname = elastic.restart, elastic.hostname

    # -- heartbeat ---------------------------------------------------------
    def _heartbeat(self) -> None:
        import torch.distributed as dist

        from torchlens.capture.ddp.memory import sample

        store = protocol.Channel(dist.PrefixStore(protocol.PREFIX, dist.TCPStore(
            self.host, self.port, is_master=False, timeout=timedelta(seconds=30))), self.key)
        beat = 0
        while True:
            if os.getppid() != self.parent:  # the kernel died: take our group down
                os.killpg(os.getpgid(0), signal.SIGKILL)
            # No live-tensor scan here: gc.get_objects() from a second thread can
            # grab a tuple under construction and make the main thread's
            # _PyTuple_Resize fail (SystemError). Tensors are counted between steps.
            mem = sample(with_tensors=False, device=(
                self.stepper.device if self.stepper is not None else self.mem_device))
            self.peak.raise_to(mem)
            # A rank deep in a lazy import (torch._dynamo: seconds) runs no op
            # but is not hung: the growing module count says so.
            # torch.profiler's stop and export run in the training thread: a
            # step of many events keeps it there for seconds, busy, not hung
            exporting = self.stepper is not None and self.stepper.exporting
            hb = DdpHeartbeat(t=time.time(), beat=beat,
                              phase=EXPORT_PHASE if exporting else self.phase,
                              modules=len(sys.modules), **msgspec.structs.asdict(mem),
                              **msgspec.structs.asdict(self.where))
            if self.recorder:
                hb = msgspec.structs.replace(
                    hb, **msgspec.structs.asdict(self.recorder.status()))
            if self.stepper is not None:
                hb = msgspec.structs.replace(
                    hb, **msgspec.structs.asdict(self.stepper.status()))
                with contextlib.suppress(Exception):  # parent gone: the ppid check ends us
                    self._send_profiling(store)
            try:
                store.set(protocol.heartbeat_key(self.rank), hb.row(wire=True))
            except Exception:  # noqa: BLE001 - parent gone; the ppid check ends us
                pass
            beat += 1
            time.sleep(HEARTBEAT_S)

    # -- phases --------------------------------------------------------------
    def run(self) -> int:
        import cloudpickle

        threading.Thread(target=self._heartbeat, daemon=True, name="tl-heartbeat").start()
        try:
            # torch._dynamo is not imported up front: only user code that
            # needs it (DDP.__init__ does) pays its seconds. Meanwhile the
            # heartbeat's module count shows the rank is busy importing.
            job = cloudpickle.loads(self._payload())
            self.job = job
            self.timings["payload"] = time.time()
            self._init_group(job)
            self.timings["group"] = time.time()
            self._comm_check()
            self.timings["comm_check"] = time.time()
            self._steps(job)
            self.timings["steps"] = time.time()
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported, then the rank exits
            self.result.error = RankError(
                **(error_record(exc) or {}), phase=self.phase, t=time.time(),
                diagnosis=getattr(exc, "diagnosis", None))
            code = 1
        self.phase = "done" if code == 0 else "failed"
        self._publish()
        return code

    def _payload(self) -> bytes:
        """The launcher's pickled job, after its signature is checked (before unpickling)."""
        try:
            return self.store.get_bytes(protocol.PAYLOAD)
        except Forged as exc:
            raise PayloadRefused(
                f"rank {self.rank} refused the job in the store at {self.host}:{self.port}: "
                f"{exc}. Nothing was unpickled. Only the launcher of this run holds its "
                "secret; something else (a leftover of an earlier run, or another user "
                "who can reach this port) wrote the payload.") from None

    def _send_profiling(self, store: protocol.Channel) -> None:
        """New step records (one batch) and summaries, each under a numbered key."""
        with self._send_lock:
            records, summaries = self.stepper.drain()
            if records:
                store.set(protocol.steps_key(self.rank, self._sent[0]), records)
                self._sent[0] += 1
                store.add(protocol.steps_count_key(self.rank), 1)
            for summary in summaries:
                store.set(protocol.summary_key(self.rank, self._sent[1]), summary)
                self._sent[1] += 1
                store.add(protocol.summary_count_key(self.rank), 1)

    def _publish(self) -> None:
        if self.stepper is not None:
            with contextlib.suppress(Exception):
                self._send_profiling(self.store)
        result = self.result
        result.env_end = _env()
        result.peak = msgspec.structs.replace(self.peak)
        result.timings = dict(self.timings)
        if self.recorder is not None:
            result.collectives = list(self.recorder.records)
            result.determinism = Determinism(first_op=self.recorder.first_divergent_op)
            if self.recorder.board is not None:
                result.strict = dict(self.recorder.strict_stats)
        result.dropped = dict(self.store.dropped)  # peers' values that failed
        # a value msgspec does not know (a diagnosis object, a str subclass such as
        # torch's version) goes as its text, as the channel's encoder writes one
        self.store.set(protocol.result_key(self.rank),
                       msgspec.to_builtins(result, enc_hook=str))
        self.store.add(protocol.done_key(), 1)  # after the result: the kernel reads it next

    def _init_group(self, job: DdpJob) -> None:
        import torch
        import torch.distributed as dist

        self.phase = "init"
        backend = job.backend
        local = self.elastic.local_rank if self.elastic is not None else self.rank
        if backend == "nccl":
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
        else:
            self.device = torch.device("cpu")
        self.mem_device = self.device
        timeout = timedelta(seconds=max(60.0, 3 * job.timeout_s))
        if self.elastic is not None:  # the agent's rendezvous: MASTER_ADDR/PORT
            dist.init_process_group(backend, init_method="env://", rank=self.rank,
                                    world_size=self.world_size, timeout=timeout)
        else:
            dist.init_process_group(
                backend, store=dist.PrefixStore(protocol.PG_PREFIX, self.raw_store),
                rank=self.rank, world_size=self.world_size, timeout=timeout)
        real_init, real_destroy = dist.init_process_group, dist.destroy_process_group

        def init_once(*args: Any, **kwargs: Any) -> None:
            if not dist.is_initialized():
                real_init(*args, **kwargs)

        def destroy_others(group: Any = None) -> None:
            if group is not None:
                real_destroy(group)

        dist.init_process_group = init_once  # type: ignore[assignment]
        dist.destroy_process_group = destroy_others  # type: ignore[assignment]
        cuda = torch.version.cuda
        nccl = None
        if torch.cuda.is_available():
            try:
                nccl = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # noqa: BLE001 - NCCL not built in
                nccl = None
        from torchlens.capture.ranks.cuda_device import device_uuid

        # the GPU's identity: under per-rank CUDA_VISIBLE_DEVICES every rank is cuda:0
        self.result.device = str(self.device)
        self.result.device_uuid = device_uuid(self.device)
        self.result.hostname = os.uname().nodename
        self.result.versions = {"torch": str(torch.__version__), "cuda": cuda, "nccl": nccl,
                                "python": sys.version.split()[0]}

    def _comm_check(self) -> None:
        """Known-answer all_reduce, then bus bandwidth for a few sizes."""
        import torch
        import torch.distributed as dist

        self.phase = "comm_check"
        n = self.world_size
        t = torch.tensor([float(self.rank + 1)], device=self.device)
        dist.all_reduce(t)
        comm = CommCheck(sent=self.rank + 1, got=float(t.item()),
                         expected=float(n * (n + 1) // 2))
        for size in BANDWIDTH_SIZES:
            x = torch.ones(size, device=self.device)
            seconds = float("inf")
            for _ in range(BANDWIDTH_REPS):  # the fastest call: the least disturbed
                start = time.perf_counter()
                dist.all_reduce(x)
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                seconds = min(seconds, time.perf_counter() - start)
            nbytes = size * 4
            busbw = nbytes / seconds * 2 * (n - 1) / n / 1e9
            comm.bandwidth.append(Bandwidth(bytes=nbytes, seconds=seconds, busbw_gbps=busbw))
        self.result.comm = comm

    def _steps(self, job: DdpJob) -> None:
        import torch

        from torchlens.capture.ddp.recorder import CollectiveRecorder

        ddp_modules = track_ddp()
        held = FsdpMemory()
        if job.profile:
            self._profiled_run(job, ddp_modules, held)
            return
        call = self._callable(job)
        board = None
        if job.strict:
            from torchlens.capture.ddp.board import FingerprintBoard

            assert job.board is not None  # the launcher makes one for --strict
            board = FingerprintBoard(job.board, self.rank, self.world_size)
        rec = CollectiveRecorder(self.store, self.rank, self.world_size,
                                 job.strict, job.timeout_s, board=board, cells=job.cells)
        self.recorder = rec
        steps = int(job.steps)
        for step in range(steps):
            self.phase = f"step {step}"
            _seed_all(job.seed)
            if steps >= 2 and step in (0, 1):
                rec.reference, rec.current = (rec.current if step == 1 else None), []
            else:
                rec.current = None
            rec.step = step
            ddp_modules.clear()
            record = WorkerStep(step=step, start=time.time())
            self.result.steps.append(record)
            held.start(self.mem_device)
            with rec:
                out = call()
            record.end = time.time()
            record.fsdp_memory = held.finish()
            from torchlens.capture.ddp.memory import (
                sample,  # live tensors at the step's end, before they go
            )

            if self.device.type != "cuda":  # gloo: the code may still use a GPU
                from torchlens.capture.ranks.cuda_device import script_device

                self.mem_device = script_device()
            self.peak.raise_to(sample(with_tensors=True, device=self.mem_device))
            self.phase = f"checksums {step}"
            record_modules(record, ddp_modules, out)
            del out
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        rec.current = None

    def _profiled_run(self, job: DdpJob, ddp_modules: list[Any],
                      held: FsdpMemory) -> None:
        """--profile: the function is the training loop; it runs once, timed per step."""
        from torchlens.capture.ranks.oom import oom_line, save_oom_snapshot
        from torchlens.capture.ranks.stepper import RankProfiler, StepLimit

        opts = job.profile
        assert opts is not None  # _steps runs this for --profile only
        rec = None
        if job.strict:
            from torchlens.capture.ddp.board import FingerprintBoard
            from torchlens.capture.ddp.recorder import CollectiveRecorder

            assert job.board is not None  # the launcher makes one for --strict
            rec = CollectiveRecorder(self.store, self.rank, self.world_size, True,
                                     job.timeout_s,
                                     board=FingerprintBoard(job.board, self.rank,
                                                            self.world_size),
                                     cells=job.cells)
            self.recorder = rec
        limit = opts.max_steps
        call = self._callable(job, steps=limit)
        if limit and job.fn is not None and "steps" in inspect.signature(job.fn).parameters:
            # its loop is told steps=N and returns its model after step N: stopping it
            # there would cut that return; one step more only if it ignores steps
            limit += 1
        stepper = RankProfiler(
            rank=self.rank, run_dir=opts.run_dir,
            device=self.device if self.device.type == "cuda" else None,
            every=opts.every, budget=opts.budget,
            window_s=opts.window_s, max_steps=limit,
            summarize=self.summarize, agree=self._agree, fsdp=held)
        self.stepper = stepper
        record = WorkerStep(step=0, start=time.time())
        self.result.steps.append(record)
        self.phase = "training"
        stepper.start()  # starts ``held`` too: each step's FSDP figures in its record
        try:
            with rec if rec is not None else contextlib.nullcontext():
                try:
                    out = call()
                except StepLimit:  # --steps ended the loop: the function never returned
                    out = None
                    record.step_limit = opts.max_steps
        except BaseException as exc:
            oom = save_oom_snapshot(exc, opts.run_dir, self.rank)
            if oom is not None:  # where the snapshot went, or why there is none
                self.result.oom_snapshot = oom
                stepper.errors.append(oom_line(self.rank, oom))
                print(stepper.errors[-1], file=sys.stderr, flush=True)
            raise
        finally:
            stepper.finish()
            self.result.profile = ProfileTold(
                every=stepper.every, steps=stepper.index, windows=stepper.windows,
                real_steps=stepper.real_steps, steps_by=stepper.steps_by,
                errors=stepper.errors[:20], own_s=stepper.own_s,
                budget=stepper.budget_figures)
        record.end = time.time()
        record.fsdp_memory = held.finish()
        self.phase = "checksums 0"
        record_modules(record, ddp_modules, out)

    def _agree(self, mine: int) -> int:
        """Every rank's proposed profiling interval, through the store; the largest wins."""
        from torchlens.capture.ranks.stepper import AGREE_WAIT_S

        self.store.set(protocol.every_key(self.rank), mine)
        keys = [protocol.every_key(r) for r in range(self.world_size)]
        self.store.store.wait(keys, timedelta(seconds=AGREE_WAIT_S))
        proposals = [v for v in self.store.multi_get(keys) if isinstance(v, int)]
        return max(proposals + [mine])  # a forged proposal is dropped, not taken

    def _callable(self, job: DdpJob, steps: int | None = None) -> Any:
        """The user's code as a no-argument callable (one step, or with --profile the loop)."""
        names = {"rank": self.rank, "world_size": self.world_size, "device": self.device}
        if steps is not None:
            names["steps"] = steps
        fn = job.fn
        if job.kind == "cell" or fn is None:
            code = compile(job.source, job.filename, "exec")

            def run_cell() -> None:
                ns = {"__name__": "__main__", **job.globals, **names}
                exec(code, ns)  # noqa: S102 - the user's own cell

            return run_cell
        params = inspect.signature(fn).parameters
        kwargs = {k: v for k, v in names.items() if k in params}
        positional = [p for p in params.values() if p.name not in kwargs
                      and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                      and p.default is p.empty]
        args = [names[k] for k in ("rank", "world_size")][: len(positional)]
        return lambda: fn(*args, **kwargs)


def main(argv: list[str], summarize: Any = None) -> int:
    elastic = None
    if argv and argv[0] == "--elastic":
        argv, elastic = rank_args(argv[1:])
    host, port, rank, world_size, stack_dir = argv
    sys.path[:0] = [p for p in os.environ.get("TORCHLENS_SYS_PATH", "").split(os.pathsep) if p]
    try:
        key = RunKey.from_env()
    except (OSError, ValueError) as exc:
        key, why = None, str(exc)
    else:
        why = f"{ENV_SECRET} is not set: ranks are started by %ddp_check, which sets it"
    if key is None:  # nothing can be signed or checked: do not even fetch the payload
        print(f"torchlens rank {rank}: no run key ({why}); refusing to run", file=sys.stderr)
        sys.stderr.flush()
        os._exit(2)
    # The user's code runs in this process and may print or pass on its
    # environment (a subprocess, a logged os.environ): the secret leaves it.
    os.environ.pop(ENV_SECRET, None)
    stack_file = open(os.path.join(stack_dir, f"stack-rank{rank}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    code = Worker(host, int(port), int(rank), int(world_size), summarize, key=key,
                  elastic=elastic).run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: gloo threads can stall it


if __name__ == "__main__":
    main(sys.argv[1:])

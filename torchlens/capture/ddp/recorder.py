"""Sees every collective a worker issues, including DDP's own bucket all_reduces.

Why a ``TorchDispatchMode``: torch 2.13 has no ``ProcessGroup.register_pre_hook``,
and patching ``torch.distributed.all_reduce`` would miss the collectives DDP's
C++ reducer issues during ``backward``. Every collective, from Python or C++,
goes through the dispatcher as a ``c10d::`` op, and a dispatch mode sees it
before it runs (checked on this machine: init broadcasts, bucket all_reduces,
user calls). The same mode counts ops (the hang detector's notion of progress)
and, during the determinism check, checksums each op's output so the first op
whose result differs between two seeded runs can be named.

``--strict``: before a collective runs, its fingerprint (op, shapes, dtypes) is
compared with every other rank's. A mismatch raises ``CollectiveMismatch`` on
every rank, before gloo can abort with SIGABRT or NCCL can hang. The usual
case goes through shared memory (``board``: a 64-bit digest per rank and
collective); the store is consulted only when digests differ (the full
fingerprints there name the difference) or a peer is late (did it finish,
stop, or pass --timeout?).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import msgspec
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchlens.capture.channel import protocol
from torchlens.capture.ddp.board import FingerprintBoard, digest
from torchlens.capture.ranks.fsdp import fsdp_module
from torchlens.formats.fingerprints import describe_collective, first_difference
from torchlens.formats.locations import CellNames, is_user_file, location_label
from torchlens.model.collectives import Fingerprint
from torchlens.model.messages import LastCollective, RecorderStatus
from torchlens.model.rank_report import DivergentOp

_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional")
_MAX_CHECKSUM_OPS = 50_000  # bounds memory of the determinism check
_OP_NAMES: dict[Any, str] = {}  # OpOverload -> "all_reduce": named once, not per call
# --strict: how long a rank waits on the board for a late peer before it asks
# the store why (finished? stopped? --timeout?): short, so a peer that ended
# is noticed quickly; long enough that a merely slow peer costs no round trip.
LATE_S = 0.25


class CollectiveMismatch(RuntimeError):
    """Ranks were about to run different collectives (raised on every rank)."""

    def __init__(self, message: str, diagnosis: MismatchDiagnosis) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


class MismatchDiagnosis(msgspec.Struct, frozen=True):
    """What a --strict stop found at collective ``index``: each rank's
    fingerprint there (rank -> fingerprint) and the ranks that issued none."""

    index: int
    fingerprints: dict[int, Fingerprint]
    missing: list[int]


#: c10d's internal op names (``c10d::_allgather_base_`` ...) -> the public
#: ``torch.distributed`` function a user calls for that collective. The c10d
#: op, not the Python function, decides what runs (``all_gather_single`` and
#: ``all_gather_into_tensor`` are the same ``_allgather_base_``), so ranks are
#: compared by it; only its name is the public one.
PUBLIC_NAMES = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather", "_allgather_base": "all_gather_into_tensor",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all_single",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier", "monitored_barrier": "monitored_barrier",
    "send": "send", "recv": "recv", "recv_any_source": "recv",
}


def public_name(schema_name: str) -> str:
    """``c10d::_allgather_base_`` -> ``all_gather_into_tensor``.

    The functional ops (``_c10d_functional::all_reduce``) already carry the
    public name; an op this table does not know keeps its own name.
    """
    name = schema_name.split("::")[-1].rstrip("_")
    if schema_name.startswith("c10d::"):
        return PUBLIC_NAMES.get(name, name)
    return name


_USER_FILES: dict[str, bool] = {}  # co_filename -> is the user's: decided once per file


def user_line(cells: CellNames | None = None, frame: Any = None) -> str:
    """Where the user's code issued the call: the innermost frame of their own.

    Frames of torch, torchlens, site-packages (typing_extensions' deprecation
    wrapper around ``all_gather_into_tensor``), the standard library and
    IPython are skipped (``formats.locations``). For DDP's bucket
    all_reduces it is the ``loss.backward()`` line. A notebook cell reads
    ``cell [N] line L`` (``cells``: the kernel's file name -> N).
    """
    frame = sys._getframe(1) if frame is None else frame
    while frame is not None:
        name = frame.f_code.co_filename
        mine = _USER_FILES.get(name)
        if mine is None:
            mine = _USER_FILES[name] = is_user_file(name)
        if mine:
            return location_label(name, frame.f_lineno, cells)
        frame = frame.f_back
    return ""


def _fingerprint(value: Any) -> Fingerprint | None:
    """A peer's fingerprint as read from the store, None when it is not one."""
    try:
        return msgspec.convert(value, Fingerprint) if isinstance(value, dict) else None
    except msgspec.ValidationError:
        return None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        # A DTensor (FSDP2's sharded parameters) is summed as this rank's
        # shard: summing the DTensor itself would run a collective (or fail
        # to, on a Partial sum) inside the op being recorded.
        return [getattr(value, "_local_tensor", value)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _checksum(value: Any) -> float | None:
    total = 0.0
    found = False
    for t in _tensors(value):
        if t.is_complex() or t.device.type == "meta" or t.numel() == 0:
            continue
        found = True
        total += float(torch.sum(t.detach(), dtype=torch.float64))
    return total if found else None


class CollectiveRecorder(TorchDispatchMode):
    """Records collectives (and, optionally, per-op checksums) of one rank."""

    def __init__(self, store: protocol.Channel, rank: int, world_size: int, strict: bool,
                 timeout_s: float, board: FingerprintBoard | None = None,
                 cells: CellNames | None = None) -> None:
        super().__init__()
        if strict and board is None:
            raise ValueError("--strict needs the launcher's fingerprint board")
        self.store, self.rank, self.world_size = store, rank, world_size
        self.strict, self.timeout_s, self.board = strict, timeout_s, board
        self.cells = dict(cells or {})  # the kernel's cell file names -> In[N]
        self.peers = [r for r in range(world_size) if r != rank]
        # how the --strict comparisons went; tests and the benchmark read it
        self.strict_stats = {"compared": 0, "late": 0, "via_store": 0}
        self.records: list[Fingerprint] = []
        self.ops = 0
        self.step = -1
        self.in_flight: Fingerprint | None = None
        self.lock = threading.Lock()
        # determinism: checksums of step 0, compared live during step 1
        self.reference: list[tuple[str, float | None]] | None = None
        self.current: list[tuple[str, float | None]] | None = None
        self.first_divergent_op: DivergentOp | None = None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # The default wraps __torch_dispatch__ in torch._disable_dynamo, whose
        # first call imports torch._dynamo: 2-6 s per worker on this machine.
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.ops += 1
        if func.namespace in _COLLECTIVE_NAMESPACES:
            return self._collective(func, args, kwargs)
        out = func(*args, **kwargs)
        if self.current is not None and len(self.current) < _MAX_CHECKSUM_OPS:
            self._track(str(func), out)
        return out

    def _track(self, name: str, out: Any) -> None:
        value = _checksum(out)
        index = len(self.current)  # type: ignore[arg-type]
        self.current.append((name, value))  # type: ignore[union-attr]
        ref = self.reference
        if (ref is not None and self.first_divergent_op is None and index < len(ref)
                and ref[index][0] == name and ref[index][1] != value):
            self.first_divergent_op = DivergentOp(op=name, op_index=index,
                                                  line=user_line(self.cells), step=self.step,
                                                  first=ref[index][1], second=value)

    def _collective(self, func: Any, args: Any, kwargs: Any) -> Any:
        tensors = _tensors(list(args) + list(kwargs.values()))
        fp = Fingerprint(
            index=len(self.records),
            op=_OP_NAMES.get(func) or _OP_NAMES.setdefault(func, public_name(func._schema.name)),
            shapes=[list(t.shape) for t in tensors],
            dtypes=[str(t.dtype).replace("torch.", "") for t in tensors],
            line=user_line(self.cells), step=self.step, t=time.time())
        module = fsdp_module(sys._getframe(1))
        if module is not None:  # FSDP: equal layers issue equal buffers; the module differs
            fp.module = module
        # TCPStore.set does not wait for a reply (microseconds) and the bytes
        # are in the kernel's socket before the collective runs, so the
        # fingerprint survives a gloo SIGABRT on a shape mismatch.
        self.store.set(protocol.fingerprint_key(self.rank, fp.index), fp)
        with self.lock:
            self.in_flight = fp
            self.records.append(fp)
        if self.strict:
            self._compare(fp)
        start = time.perf_counter()
        out = func(*args, **kwargs)
        fp.call_s = time.perf_counter() - start
        with self.lock:
            self.in_flight = None
        return out

    def _compare(self, fp: Fingerprint) -> None:
        """Wait (bounded) for every rank's fingerprint of this index and compare.

        The usual case never leaves this process: the digest goes on the
        board and the peers' digests of the same index are read back from
        it. A differing digest is checked against the full fingerprints in
        the store (they name what differs). A peer still absent after
        ``LATE_S`` makes the rank look at why, through the store: a peer
        finished without this collective, a peer stopped on a mismatch, or
        --timeout passed; otherwise it goes back to waiting.
        """
        index, board = fp.index, self.board
        assert board is not None  # __init__ refuses --strict without one
        value = digest(index, fp.op, fp.shapes, fp.dtypes, fp.module_name)
        board.publish(index, value)
        self.strict_stats["compared"] += 1
        store = self.store
        deadline = time.monotonic() + self.timeout_s
        pending, differ = board.wait(index, value, self.peers, LATE_S)
        if pending:
            self.strict_stats["late"] += 1
        while pending:
            # check() opens what it finds: a forged result or stop is not a reason to stop
            finished = [r for r in pending if store.check(protocol.result_key(r))]
            if finished or store.check(protocol.stop_key()) or time.monotonic() > deadline:
                self._raise(index, {self.rank: fp}, pending, finished)
            pending, more = board.wait(index, value, pending, LATE_S)
            differ += more
        if not differ:
            return
        self.strict_stats["via_store"] += 1
        keys = [protocol.fingerprint_key(r, index) for r in self.peers]
        fps = {self.rank: fp}
        # set before the peers' board entries, so these keys exist or are in flight
        forged = []
        for r, value in zip(self.peers, store.multi_get(keys), strict=True):
            got = _fingerprint(value)
            if got is not None:
                fps[r] = got
            elif r in differ:  # overwritten by a forger: the board's digest still differs
                forged.append(r)
        if first_difference(fps) is not None or forged:
            self._raise(index, fps, forged, [], forged=forged)

    def _raise(self, index: int, fps: dict[int, Fingerprint], missing: list[int],
               finished: list[int], forged: tuple[int, ...] | list[int] = ()) -> None:
        self.store.set(protocol.stop_key(), self.rank)
        lines = [f"rank {r}: {describe_collective(fps[r])}" for r in sorted(fps)]
        for r in missing:
            if r in forged:
                lines.append(f"rank {r}: a different collective #{index}; its fingerprint in "
                             "the store failed its signature (overwritten by a forger)")
                continue
            why = "finished without it" if r in finished else "did not reach it"
            lines.append(f"rank {r}: never issued collective #{index} ({why})")
        message = (f"--strict: ranks disagree at collective #{index}; it was stopped "
                   "before it ran.\n  " + "\n  ".join(lines))
        raise CollectiveMismatch(message, MismatchDiagnosis(index=index, fingerprints=fps,
                                                            missing=missing))

    def status(self) -> RecorderStatus:
        """What the heartbeat reports: op and collective counts, current collective."""
        with self.lock:
            last = self.in_flight or (self.records[-1] if self.records else None)
            return RecorderStatus(
                ops=self.ops, collectives=len(self.records), step=self.step,
                in_collective=self.in_flight is not None,
                last=LastCollective(index=last.index, op=last.op, line=last.line,
                                    module=last.module_name)
                if last else None)

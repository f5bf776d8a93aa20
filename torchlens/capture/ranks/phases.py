"""The phases of a training step, timed on a rank of ``%ddp_check --profile``
or ``torchlens run`` (``PhaseClock``).

Why phase timers and not per-op hooks: the checker's ``TorchDispatchMode``
costs about 11 us per op (+37% on a 6.5 ms step). Here five Python wrappers
run a few times per step (DataLoader batches, ``DistributedDataParallel.forward``,
``backward``, ``Optimizer.step`` through torch's global optimizer hooks, and
the ``torch.distributed`` collectives the user calls), so a step costs a few
microseconds.

Two phases are no training work, timed so that a rank that stalls the others
can be told apart from one that sleeps (``analysis.ranks.stalls``):

- ``save``: ``torch.save`` (and ``torch.distributed.checkpoint``'s ``save`` and
  ``async_save`` once the job imports it), called outside another phase.
- ``eval``: a ``torch.no_grad()`` or ``torch.inference_mode()`` block, entered
  outside another phase, in which some module's forward ran (a global module
  forward pre-hook, registered only while such a block is open, says so). The
  block's time counts, less what phases timed inside it waited for (its
  batches in ``data``, its collectives, a save), which stay where the
  slow-rank and input-bound rules look for them; DDP's forward inside it
  moves into ``eval``. A block that ran no module (gradient clipping, an EMA
  update, a parameter edit) or ran a backward or an optimizer step leaves
  its time where it was. A forward outside such a block (``model.eval()``
  alone, grad on) is not seen: telling it from training would need a hook on
  every module call; a frozen model run under ``no_grad`` inside the training
  step (a frozen encoder) counts as ``eval`` too.

Neither cuts a step found from the optimizer (``autostep``) itself: like
logging after ``optimizer.step()``, a save stays in the step it follows; a
phase timed inside an evaluation (DDP's forward) cuts it as any phase does,
and the evaluation's time from there on is the next step's.
Both hooks fail open: an error of torchlens' own in them is counted
(``PhaseClock.hook_errors``) and the user's call goes on untouched; only the
user's own exception leaves them. On a GPU rank their time is host time (the
GPU timer does not bracket them; ``analysis.ranks.slow`` reads it from the host
record). DDP's wait for a late rank happens inside ``backward`` (C++),
which is why the late rank is found by comparing phases across ranks
(``analysis.ranks.steps``), not by watching collectives. FSDP waits for a late
rank in the all_gathers of its forward (Python ``all_gather_single`` calls):
those count as collective, not forward, so the rank the others wait for has
the least sync there too. FSDP's classes are timed once the job imports them.

Under ``torch.compile`` dynamo traces the Python it compiles, a wrapper around
DDP's forward included: each wrapper and hook here, asked while dynamo traces
(``compiling()``), only calls what it wraps, so the compiled graph holds the
model's work and nothing of torchlens (a timer's counters in the graph would
be guards that fail every step, and torch's recompile limit would leave the
model running eagerly). The forward of a module compiled whole is timed at
its ``OptimizedModule``'s call instead, which runs outside the compiled code.

On a rank whose job runs on a GPU the host timers alone mislead: NCCL work is
enqueued and the CPU moves on, so a wait for a late rank shows in whichever
phase next blocks on the GPU (a ``loss.item()`` in "other", the next step's
forward). ``GpuPhaseTimer`` records a CUDA event on the device's current
stream at each phase boundary and at each step's end, and reads the times
between them once ``query()`` says the GPU got past them (at a later step,
never by waiting): the GPU's own time in each phase, the wait included where
the stream waits for NCCL (DDP's end of backward, a synchronous collective).
About 2 event records per phase entry (a few µs each) and one query and one
``elapsed_time`` per event read; the events come from a pool and are reused.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from torchlens.capture.ranks import cuda_device
from torchlens.capture.ranks.fsdp_memory import when_imported
from torchlens.capture.trace.compiled import never_compiled
from torchlens.model.records import DdpStep

PHASES = ("data", "forward", "backward", "optimizer", "collective", "save", "eval")
_FORWARD, _OPTIMIZER, _COLLECTIVE = (PHASES.index(p) for p in ("forward", "optimizer", "collective"))
_SAVE, _EVAL = PHASES.index("save"), PHASES.index("eval")
_DCP = "torch.distributed.checkpoint"
_TRAINING = (PHASES.index("backward"), _OPTIMIZER)
_KEPT = (PHASES.index("data"), _COLLECTIVE, _SAVE)
#: ``*_single``: what FSDP2 calls for its own all_gathers and reduce_scatters
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
               "reduce_scatter_single", "all_to_all", "all_to_all_single",
               "broadcast", "broadcast_object_list", "reduce", "gather", "scatter", "barrier",
               "send", "recv", "isend", "irecv", "monitored_barrier")
_FSDP2 = "torch.distributed.fsdp._fully_shard._fully_shard"
_FSDP1 = "torch.distributed.fsdp.fully_sharded_data_parallel"
_DYNAMO = "torch._dynamo.eval_frame"


def ddp_forward(cls: Any) -> str:
    """The DDP method the forward phase wraps: ``_run_ddp_forward``, the call of
    the wrapped module, where torch has it; else ``forward``. Not ``forward``
    itself where it can be helped: ``torch.compile(ddp_model)`` asks whether
    DDP's ``forward`` is torch's own code (dynamo's trace rules) to choose how
    to compile it, and a ``forward`` of torchlens' made it compile another
    frame than it does without torchlens (a model of torch's modules no longer
    recompiled where it did)."""
    return "_run_ddp_forward" if "_run_ddp_forward" in cls.__dict__ else "forward"


def compiling() -> bool:
    """Whether dynamo is tracing the caller (``torch.compiler.is_compiling``)."""
    check = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(check()) if check is not None else False


#: synced DDP forwards before the bucket layout is read: DDP rebuilds its
#: buckets in gradient order after its first backward, and its logging figures
#: say so a few iterations later; past ``BUCKETS_GIVE_UP`` the first layout is taken
BUCKETS_AFTER = 3
BUCKETS_GIVE_UP = 50


def bucket_layout(module: Any, final: bool = False) -> tuple[int | None, list[int]] | None:
    """A DDP module's bucket cap and bucket sizes (bytes), from the figures DDP
    keeps for its own logging: the rebuilt buckets; None while DDP has not
    rebuilt them yet, unless ``final`` (then the buckets it started with)."""
    data = module._get_ddp_logging_data()
    cap = data.get("bucket_cap_bytes")
    sizes = data.get("rebuilt_bucket_sizes") if data.get("has_rebuilt_buckets") else None
    if not sizes and not final:
        return None
    sizes = sizes or data.get("bucket_sizes") or ""
    return (int(cap) if cap is not None else None,
            [int(s) for s in str(sizes).replace(" ", "").split(",") if s.isdigit()])


#: steps between two sums of a DDP module's parameters (a pass over them: one
#: optimizer step's reading, and a device sync on a GPU, once in this many steps)
PARAM_EVERY = 25


def param_sum(module: Any) -> float:
    """The sum of a module's parameters in float64: equal on ranks that hold
    equal parameters (the same values summed in the same order)."""
    with torch.no_grad():
        sums = [p.detach().sum(dtype=torch.float64) for p in module.parameters()]
        return float(torch.stack(sums).sum().item()) if sums else 0.0


class PhaseClock:
    """Accumulates the time spent in each phase; the outermost phase counts."""

    def __init__(self) -> None:
        self.spent = [0.0] * len(PHASES)
        self.active = -1
        self.entries = 0  # progress for the hang detector: grows inside long steps
        self.first: float | None = None  # when the first phase began (unix s)
        self.tick: Callable[[], None] | None = None
        #: called before an outermost phase begins: where a step found from the
        #: optimizer is cut (``autostep``), so the new phase is the next step's
        self.enter: Callable[[], None] | None = None
        self.gpu: GpuPhaseTimer | None = None  # set on a rank whose job uses CUDA
        self._undo: list[Callable[[], None]] = []
        self._fsdp_undone = False
        self._opt_t0 = 0.0
        #: errors of torchlens' own in the fail-open hooks (save, eval): counted, never raised
        self.hook_errors = 0
        self.hook_error: str | None = None
        self._thread = threading.get_ident()
        self._no_grad_depth = 0
        #: the open evaluation block: [start (perf_counter), spent at its start, a forward seen, hook]
        self._block: list[Any] | None = None
        #: per DDP module (its id): its forwards in this step that will all-reduce
        #: their gradients; the bucket layout once read (``take_ddp``)
        self._syncs: dict[int, int] = {}
        self._synced = 0
        self._buckets: tuple[int | None, list[int]] | None = None
        self._no_layout = False
        #: the DDP module whose parameters are summed, the sum at a step's end
        #: and whether they had changed by the next forward
        self._module: weakref.ref[Any] | None = None
        self._check: float | None = None
        self._summed: float | None = None
        self._moved: bool | None = None
        self._opt_steps = 0
        #: torchlens' wrappers: frames dynamo must not compile (``_time_compiled``)
        self._dynamo_alone: set[Callable[..., Any]] = set()

    def take(self) -> dict[str, float]:
        out = {p: round(s, 7) for p, s in zip(PHASES, self.spent, strict=True)}
        self.spent = [0.0] * len(PHASES)
        block = self._block
        if block is not None:  # a step ended inside an evaluation block: its rest is the next step's
            block[0], block[1] = time.perf_counter(), list(self.spent)
        return out

    def take_ddp(self) -> DdpStep | None:
        """How the step since the last call synchronised DDP's gradients, with
        the bucket layout once read (None: no DDP forward ran in it); the
        parameters' sum after its optimizer step every ``PARAM_EVERY`` optimizer
        steps, and in the step after, whether they had moved by its first forward."""
        syncs, self._syncs = self._syncs, {}
        moved, self._moved = self._moved, None
        total, self._summed = self._summed, None
        if not syncs:
            return None
        figures: dict[str, Any] = {"syncs": max(syncs.values())}
        if self._buckets is not None:
            cap, sizes = self._buckets
            figures.update(bucket_cap_bytes=cap, buckets=len(sizes), bucket_bytes=sum(sizes))
        if moved is not None:
            figures["params_moved"] = moved
        if total is not None:
            figures["param_sum"] = total
        return DdpStep(**figures)

    def _param_check(self) -> None:
        """After an optimizer step: every ``PARAM_EVERY``-th, the last DDP
        module's parameter sum, for the step's record and to compare with its
        sum at the next forward (fails open)."""
        self._opt_steps += 1
        module = self._module() if self._module is not None else None
        if module is None or self._opt_steps % PARAM_EVERY:
            return
        try:
            self._check = self._summed = param_sum(module)
        except Exception as exc:  # noqa: BLE001 - torchlens' own error: the step goes on
            self._failed(exc)
            self._check = self._summed = None

    def _count_ddp(self, cls: Any, name: str) -> None:
        """Count each DDP forward that will all-reduce its gradients (grad on,
        not under ``no_sync()``), and read the module's bucket layout once DDP
        has rebuilt its buckets (after its first backward). ``name``: the method
        that runs the forward (``ddp_forward``). Fails open."""
        original = cls.__dict__.get(name)
        if original is None:
            return
        clock = self

        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling():  # traced by dynamo: only DDP's forward (module docstring)
                return original(module, *args, **kwargs)
            try:
                if clock._check is not None:  # the parameters' sum at the last step's end
                    before, clock._check = clock._check, None
                    clock._moved = param_sum(module) != before
                if module.require_backward_grad_sync and torch.is_grad_enabled():
                    clock._module = weakref.ref(module)
                    key = id(module)
                    clock._syncs[key] = clock._syncs.get(key, 0) + 1
                    clock._synced += 1
                    if (clock._buckets is None and clock._synced > BUCKETS_AFTER
                            and not clock._no_layout):
                        clock._buckets = bucket_layout(module, clock._synced > BUCKETS_GIVE_UP)
            except Exception as exc:  # noqa: BLE001 - torchlens' own error: the forward runs
                clock._no_layout = True  # not asked again: DDP's figures are not as expected
                clock._failed(exc)
            return original(module, *args, **kwargs)

        setattr(cls, name, forward)
        self._dynamo_alone.add(forward)
        self._undo.append(lambda: setattr(cls, name, original))

    # -- fail-open hooks (save, eval) ----------------------------------------
    def _failed(self, exc: BaseException) -> None:
        self.hook_errors += 1
        if self.hook_error is None:
            self.hook_error = f"{type(exc).__name__}: {exc}"

    def _save_begin(self) -> float | None:
        """The start of a save phase, or None when another phase holds the clock."""
        if self.active >= 0 or threading.get_ident() != self._thread:
            return None
        self.active, self.entries = _SAVE, self.entries + 1
        if self.first is None:
            self.first = time.time()
        return time.perf_counter()

    def _save_end(self, t: float) -> None:
        self.spent[_SAVE] += time.perf_counter() - t
        self.active = -1
        if self.tick is not None:
            self.tick()

    def _fail_open(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed as a save; torchlens' own errors never reach the caller."""
        clock = self

        def saving(*args: Any, **kwargs: Any) -> Any:
            try:
                t = clock._save_begin()
            except Exception as exc:  # noqa: BLE001 - fail open: the user's call goes on
                clock._failed(exc)
                t = None
            if t is None:
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                try:
                    clock._save_end(t)
                except Exception as exc:  # noqa: BLE001 - fail open
                    clock._failed(exc)
                    clock.active = -1

        saving.__wrapped__ = fn  # type: ignore[attr-defined]
        saving._torchlens_save = True  # type: ignore[attr-defined]
        saving.__name__ = getattr(fn, "__name__", "save")
        saving.__doc__ = getattr(fn, "__doc__", None)
        return saving

    def _patch_save(self, owner: Any, name: str) -> None:
        original = getattr(owner, name, None)
        if original is None or getattr(original, "_torchlens_save", False):
            return
        setattr(owner, name, self._fail_open(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def _time_dcp(self, module: Any) -> None:
        if not self._fsdp_undone:
            for name in ("save", "async_save"):
                self._patch_save(module, name)

    def _block_enter(self) -> None:
        """A no_grad / inference_mode block begins (module docstring)."""
        if threading.get_ident() != self._thread:
            return
        self._no_grad_depth += 1
        if self._no_grad_depth > 1 or self.active >= 0 or self._block is not None:
            return
        from torch.nn.modules.module import register_module_forward_pre_hook

        block: list[Any] = [time.perf_counter(), list(self.spent), False, None]

        def seen(*_: Any) -> None:
            if not compiling():
                block[2] = True

        block[3] = register_module_forward_pre_hook(seen)
        self._block = block

    def _block_exit(self) -> None:
        if threading.get_ident() != self._thread:
            return
        self._no_grad_depth = max(0, self._no_grad_depth - 1)
        block = self._block
        if self._no_grad_depth or block is None:
            return
        self._block = None
        block[3].remove()
        if not block[2] or any(self.spent[i] > block[1][i] for i in _TRAINING):
            return  # no module ran, or a training step did (backward, optimizer): no evaluation
        # the block's time is the evaluation's, less the waits timed inside it (its
        # batches, its collectives, a save): those stay where every rule looks for them
        waits = sum(max(0.0, self.spent[i] - block[1][i]) for i in _KEPT)
        self.spent[_FORWARD] = min(self.spent[_FORWARD], block[1][_FORWARD])
        self.spent[_EVAL] += max(0.0, time.perf_counter() - block[0] - waits)
        self.entries += 1

    def _patch_block(self, cls: Any) -> None:
        """``cls``'s ``__enter__``/``__exit__`` (a grad-mode context) open and close
        an evaluation block; the originals run first on entry and last on exit."""
        enter, leave = cls.__dict__.get("__enter__"), cls.__dict__.get("__exit__")
        if enter is None or leave is None:
            return
        clock = self

        def entered(ctx: Any) -> Any:
            out = enter(ctx)
            if compiling():  # traced by dynamo: the block is timed where it runs eagerly
                return out
            try:
                clock._block_enter()
            except Exception as exc:  # noqa: BLE001 - fail open
                clock._failed(exc)
            return out

        def exited(ctx: Any, *exc_info: Any) -> Any:
            if compiling():
                return leave(ctx, *exc_info)
            try:
                clock._block_exit()
            except Exception as exc:  # noqa: BLE001 - fail open
                clock._failed(exc)
            return leave(ctx, *exc_info)

        entered.__wrapped__, exited.__wrapped__ = enter, leave  # type: ignore[attr-defined]
        self._dynamo_alone.update((entered, exited))
        cls.__enter__, cls.__exit__ = entered, exited

        def undo() -> None:
            cls.__enter__, cls.__exit__ = enter, leave
            block, self._block, self._no_grad_depth = self._block, None, 0
            if block is not None:
                block[3].remove()

        self._undo.append(undo)

    def _wrap(self, index: int, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if compiling():  # module docstring: dynamo traces only the call
                return fn(*args, **kwargs)
            if clock.active == _OPTIMIZER and index != _OPTIMIZER:
                return clock._inside_optimizer(index, fn, args, kwargs)
            if clock.active == _FORWARD and index == _COLLECTIVE:
                return clock._inside_forward(fn, args, kwargs)
            if clock.active >= 0:
                return fn(*args, **kwargs)
            clock._phase_begin(index)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock._phase_end(index, t)

        clock._dynamo_alone.add(timed)
        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        timed.__name__ = getattr(fn, "__name__", "timed")
        timed.__doc__ = getattr(fn, "__doc__", None)
        return timed

    def _phase_begin(self, index: int) -> None:
        """An outermost phase begins (``clock.enter`` may end the step first)."""
        if self.enter is not None:
            self.enter()
        self.active, self.entries = index, self.entries + 1
        if self.first is None:
            self.first = time.time()
        if self.gpu is not None:
            self.gpu.enter(index)

    def _phase_end(self, index: int, t: float) -> None:
        """The outermost phase ``index``, begun at ``t`` (perf_counter), ends."""
        self.spent[index] += time.perf_counter() - t
        if self.gpu is not None:
            self.gpu.leave()
        self.active = -1
        if self.tick is not None:
            self.tick()

    def _optimizer_end(self) -> None:
        """The optimizer step (the outermost phase) ends: the parameters' check
        (``_param_check``) comes before the tick that may end the step."""
        self.spent[_OPTIMIZER] += time.perf_counter() - self._opt_t0
        if self.gpu is not None:
            self.gpu.leave()
        self.active = -1
        self._param_check()
        if self.tick is not None:
            self.tick()

    def _inside_optimizer(self, index: int, fn: Callable[..., Any], args: Any,
                          kwargs: Any) -> Any:
        """A phase the optimizer's closure runs (Lightning's training step, LBFGS):
        forward and backward inside ``Optimizer.step`` count as themselves, and
        DDP's wait for a late rank stays in backward, where it is looked for."""
        opt, gpu = self.active, self.gpu
        if gpu is not None:
            gpu.leave()
            gpu.enter(index)
        self.active, self.entries = index, self.entries + 1
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - t
            self.spent[index] += spent
            self._opt_t0 += spent  # the optimizer's own time leaves it out
            if gpu is not None:
                gpu.leave()
                gpu.enter(opt)
            self.active = opt

    def _inside_forward(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """A collective the forward runs: FSDP's all_gathers of the parameters. The
        wait for a late rank is there (not in backward, as DDP's), so it counts as
        collective, where ``analysis.ranks.slow`` looks for it."""
        gpu = self.gpu
        if gpu is not None:
            gpu.leave()
            gpu.enter(_COLLECTIVE)
        self.active, self.entries = _COLLECTIVE, self.entries + 1
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - t
            self.spent[_COLLECTIVE] += spent
            self.spent[_FORWARD] -= spent  # the forward's timer, still running, counts it too
            if gpu is not None:
                gpu.leave()
                gpu.enter(_FORWARD)
            self.active = _FORWARD

    def _time_fsdp2(self, module: Any) -> None:
        """An FSDP2 module's call (the root's: the outermost counts) as the forward:
        ``fully_shard`` gives each module a class deriving from ``FSDPModule``
        first, so a ``__call__`` put there runs before ``nn.Module``'s."""
        fsdp_module = module.FSDPModule
        if "__call__" in fsdp_module.__dict__ or self._fsdp_undone:
            return

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return super(fsdp_module, self).__call__(*args, **kwargs)

        fsdp_module.__call__ = self._wrap(_FORWARD, call)
        self._undo.append(lambda: delattr(fsdp_module, "__call__"))

    def _time_compiled(self, module: Any) -> None:
        """Dynamo came in: a compiled module's call is timed as the forward, and
        torchlens' frames inside compiled calls stay out of what it compiles."""
        if self._fsdp_undone:
            return
        if isinstance(getattr(module, "OptimizedModule", None), type):
            self._patch(module.OptimizedModule, "__call__", "forward")
        never_compiled(self._dynamo_alone | {PhaseClock._inside_optimizer,
                                             PhaseClock._inside_forward},
                       (compiling, param_sum, bucket_layout, PhaseClock._block_enter,
                        PhaseClock._block_exit, PhaseClock._failed, PhaseClock._save_begin,
                        PhaseClock._save_end, PhaseClock._phase_begin, PhaseClock._phase_end,
                        PhaseClock._optimizer_end))

    def _time_fsdp1(self, module: Any) -> None:
        if not self._fsdp_undone:
            self._patch(module.FullyShardedDataParallel, "forward", "forward")

    def _patch(self, owner: Any, name: str, phase: str) -> None:
        original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if original is None:
            return
        setattr(owner, name, self._wrap(PHASES.index(phase), original))
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
        from torch.utils.data import dataloader

        self._patch(dataloader._BaseDataLoaderIter, "__next__", "data")
        run = ddp_forward(DistributedDataParallel)
        self._patch(DistributedDataParallel, run, "forward")
        self._count_ddp(DistributedDataParallel, run)
        # FSDP's forward, timed once the job imports it (importing it here costs
        # most of a second for a job without FSDP)
        self._fsdp_undone = False
        when_imported(_FSDP2, self._time_fsdp2)
        when_imported(_FSDP1, self._time_fsdp1)
        self._patch(torch.Tensor, "backward", "backward")
        self._patch(torch.autograd, "backward", "backward")
        for module in (dist, distributed_c10d):
            for name in COLLECTIVES:
                if callable(getattr(module, name, None)):
                    self._patch(module, name, "collective")
        optimizer = PHASES.index("optimizer")

        def pre(*_: Any) -> None:
            if self.active < 0 and not compiling():
                self._phase_begin(optimizer)
                self._opt_t0 = time.perf_counter()

        def post(*_: Any) -> None:
            if self.active == optimizer and not compiling():
                self._optimizer_end()

        # a save and an evaluation (module docstring), each failing open
        self._thread = threading.get_ident()
        self._patch_save(torch, "save")
        self._patch_save(torch.serialization, "save")
        when_imported(_DCP, self._time_dcp)
        from torch.autograd import grad_mode

        self._patch_block(grad_mode.no_grad)
        self._patch_block(grad_mode.inference_mode)

        self._dynamo_alone.update((pre, post))
        for handle in (register_optimizer_step_pre_hook(pre),
                       register_optimizer_step_post_hook(post)):
            self._undo.append(handle.remove)
        # a compiled module's call, where it runs (dynamo does not trace it): the
        # forward of a model compiled whole, DDP's wrapper and all
        when_imported(_DYNAMO, self._time_compiled)

    def remove(self) -> None:
        self._fsdp_undone = True  # an FSDP import after this is not timed
        while self._undo:
            self._undo.pop()()


#: Steps whose events may wait unread (the host ahead of the GPU); past this
#: the oldest step's GPU times are given up, so a job that never waits for its
#: GPU does not hold events without end.
MAX_PENDING = 64


class GpuPhaseTimer:
    """CUDA events at the phase boundaries of one rank's steps (module docstring).

    ``enter``/``leave`` bracket the outermost phase (``PhaseClock``), ``mark(step)``
    ends a step, ``ready()`` returns ``(step, step_s, phases)`` of each ended step
    whose events have all completed, oldest first, and gives their events back
    to the pool. A step with a phase boundary that could not be recorded (a
    stream being captured into a CUDA graph) has no GPU times. A CUDA error
    stops the timer (``error`` says why); the job goes on with host timers.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.error: str | None = None
        self.dropped = 0  # steps given up (MAX_PENDING)
        self._pool: list[Any] = []
        self._start: Any = None  # the event at the current step's start
        self._open: tuple[int, Any] | None = None  # (phase, event) of the phase now running
        self._spans: list[tuple[int, Any, Any]] = []  # the current step's (phase, start, end)
        self._broken = False  # a boundary of the current step was not recorded
        # (step, start, end, spans, whether its end is pooled with it: not when it
        # is also the next step's start)
        self._pending: deque[list[Any]] = deque()

    def _record(self) -> Any:
        """A pooled event recorded now, or None (not recordable: see ``cuda_device.record``)."""
        if self.error is not None:
            return None
        try:
            ev = self._pool.pop() if self._pool else cuda_device.timing_event()
        except Exception as exc:  # noqa: BLE001 - timing must never end the job
            self.error = f"a CUDA event could not be made: {type(exc).__name__}: {exc}"
            return None
        try:
            if cuda_device.record(ev, self.device):
                return ev
        except Exception as exc:  # noqa: BLE001 - timing must never end the job
            self.error = f"a CUDA event could not be recorded: {type(exc).__name__}: {exc}"
        self._pool.append(ev)
        return None

    def enter(self, phase: int) -> None:
        ev = self._record()
        if ev is None:
            self._broken = True
        self._open = (phase, ev) if ev is not None else None

    def leave(self) -> None:
        opened, self._open = self._open, None
        if opened is None:
            return
        ev = self._record()
        if ev is None:
            self._broken = True
            self._pool.append(opened[1])
            return
        self._spans.append((opened[0], opened[1], ev))

    def mark(self, step: int) -> None:
        """The end of ``step``: its last boundary (also the next step's first)."""
        end = self._record()
        spans, self._spans = self._spans, []
        if self._start is None or end is None or self._broken:
            # the start is still the end of the step before when that one waits unread
            if self._pending and self._pending[-1][2] is self._start:
                self._pending[-1][4] = True
                self._give_back(None, spans)
            else:
                self._give_back(self._start, spans)
        else:
            self._pending.append([step, self._start, end, spans, False])
            if len(self._pending) > MAX_PENDING:
                self._done(self._pending.popleft())
                self.dropped += 1
        self._start, self._broken = end, False

    def begin(self) -> None:
        """Forget every step (step indices start again) and time the next one from now."""
        while self._pending:
            self._done(self._pending.popleft())
        self._give_back(self._start, self._spans)
        self._spans, self._open, self._broken = [], None, False
        self._start = self._record()

    def ready(self) -> list[tuple[int, float, list[float]]]:
        """The ended steps whose events have all completed, in order; never waits."""
        out: list[tuple[int, float, list[float]]] = []
        if self.error is not None:
            return out
        try:
            while self._pending:
                step, first, end, spans, _ = self._pending[0]
                if not (cuda_device.completed(end)
                        and all(cuda_device.completed(b) for _, _, b in spans)):
                    break
                per_phase = [0.0] * len(PHASES)
                for phase, a, b in spans:
                    per_phase[phase] += cuda_device.elapsed_s(a, b)
                out.append((step, cuda_device.elapsed_s(first, end), per_phase))
                self._done(self._pending.popleft())
        except Exception as exc:  # noqa: BLE001 - timing must never end the job
            self.error = f"CUDA event times could not be read: {type(exc).__name__}: {exc}"
        return out

    def _done(self, entry: list[Any]) -> None:
        """A pending step read or given up: its events back to the pool."""
        self._give_back(entry[1], entry[3])
        if entry[4]:
            self._pool.append(entry[2])

    def _give_back(self, first: Any, spans: list[tuple[int, Any, Any]]) -> None:
        if first is not None:
            self._pool.append(first)
        for _, a, b in spans:
            self._pool.extend((a, b))

"""What an FSDP step holds beyond its shards, measured in the rank: the
gathered parameters alive at once, and the optimizer state.

Why FSDP's own unshard and reshard are wrapped: a CPU build keeps no
allocator peak, and the shapes of the all_gathers alone cannot say how many
modules were gathered at once (FSDP2 prefetches the next module's all_gather
in backward, so two are). Each FSDP2 ``FSDPParamGroup`` counts as gathered
from its ``unshard`` (the all_gather issued) until its ``reshard``, each FSDP1
``FlatParamHandle`` while its padded unsharded flat parameter has storage;
the peak is the most bytes gathered at once, with the modules that made it.
The all_gather's own buffer, alive during FSDP2's copy-out into the
parameters, is not in that figure. On CUDA the allocator's peak over the
step is read as well (``allocator_peak``: everything the step allocated).

The wrappers are put on FSDP's classes once per process, when the class is
imported (importing FSDP for a job that never uses it costs most of a
second), and count only while a ``FsdpMemory`` is started.

Why the optimizer state is read in torch's global optimizer post-hook: the
optimizer is usually a local of the user's function, gone when the step
ends. Its ``state`` tensors are summed (a DTensor counts its local shard)
at its first step, and again only when more parameters have state: the walk
over the state dict costs milliseconds for a thousand parameters, and the
tensors in it keep their sizes.

``torchlens run`` keeps one tracker started for the rank's whole job and
``take``s its figures at each step's end (``capture.ranks.stepper``): the
gathered peak starts again from what is gathered then, the optimizer state
and the shard bytes (read once per FSDP module, at its first unshard) carry
over, and the allocator's peak is left alone (the job may read it itself).
With ``fsdp_only`` the optimizer state is read only once an FSDP module has
unsharded: a job without FSDP pays one dict lookup per optimizer step.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

import msgspec

from torchlens.capture.ranks.fsdp import fsdp_module
from torchlens.model.records import FsdpStep

_FSDP2 = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
_FSDP1 = "torch.distributed.fsdp._flat_param"

#: the tracker counting now (one step of one rank at a time), or None
_ACTIVE: FsdpMemory | None = None


def reset_allocator_peak(device: Any) -> bool:
    """Start ``device``'s allocator peak afresh; False where there is none to read
    (not a GPU, or CUDA not initialised: nothing is initialised here)."""
    import torch

    if getattr(device, "type", None) != "cuda" or not torch.cuda.is_initialized():
        return False
    torch.cuda.reset_peak_memory_stats(device)
    return True


def allocator_peak(device: Any) -> int | None:
    """``device``'s allocator peak since ``reset_allocator_peak`` (None: not a GPU in use)."""
    import torch

    if getattr(device, "type", None) != "cuda" or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.max_memory_allocated(device))


def state_bytes(optimizer: Any) -> int:
    """Bytes of every tensor in ``optimizer.state`` (a DTensor's local shard)."""
    import torch

    total = 0
    for per_param in getattr(optimizer, "state", {}).values():
        values = per_param.values() if isinstance(per_param, dict) else (per_param,)
        for t in values:
            if isinstance(t, torch.Tensor):
                t = getattr(t, "_local_tensor", t)
                total += t.numel() * t.element_size()
    return total


class FsdpMemory:
    """One step's gathered-parameter peak and optimizer state on this rank."""

    def __init__(self, fsdp_only: bool = False) -> None:
        self._hook: Any = None
        self.fsdp_only = fsdp_only
        self.reset()

    def reset(self) -> None:
        self.live: dict[int, tuple[str, int]] = {}
        self.now = self.peak = self.run_peak = 0
        self.peak_modules: list[str] = []
        #: the most gathered at once since ``start`` (``take`` restarts ``peak``)
        self.run_peak_modules: list[str] = []
        self.optimizers: dict[int, tuple[str, int]] = {}
        self.entries: dict[int, int] = {}  # id(optimizer) -> len(state) when last read
        #: id(FSDP module's group or handle) -> (its shards' bytes, the same gathered)
        self.shards: dict[int, tuple[int, int]] = {}
        self.device: Any = None
        self.cuda = False
        #: why counting stopped (FSDP's internals not as this torch's): said, not guessed
        self.broken: str | None = None
        self.broken_state: str | None = None

    def start(self, device: Any = None) -> None:
        global _ACTIVE
        self.reset()
        _watch_fsdp()
        if self._hook is None:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hook = register_optimizer_step_post_hook(_stepped)
        self.device = device
        self.cuda = reset_allocator_peak(device)
        _ACTIVE = self

    def finish(self) -> FsdpStep | None:
        """The step's figures; None when it had no FSDP module and no optimizer."""
        global _ACTIVE
        _ACTIVE = None
        if self.run_peak > self.peak:  # steps were taken: the whole span's peak
            self.peak, self.peak_modules = self.run_peak, self.run_peak_modules
        out = self._figures()
        if self.cuda:
            out = msgspec.structs.replace(out, allocator_peak_bytes=allocator_peak(self.device))
        return None if out == FsdpStep() else out

    def take(self) -> FsdpStep | None:
        """The figures since the last ``take`` (one step of ``torchlens run``), with
        the shard bytes; None without FSDP. Counting goes on: the next step's
        gathered peak starts from what is gathered now."""
        if not self.shards and self.broken is None:
            return None  # no FSDP module has unsharded: the cost of a job without FSDP
        out = self._figures()
        if self.shards:
            out = msgspec.structs.replace(
                out, sharded_bytes=sum(s for s, _ in self.shards.values()),
                unsharded_bytes=sum(u for _, u in self.shards.values()))
        self.peak, self.peak_modules = self.now, [n for n, _ in self.live.values()]
        return out

    def _figures(self) -> FsdpStep:
        gathered: FsdpStep = FsdpStep()
        if self.broken:
            gathered = FsdpStep(gathered_error=self.broken)
        elif self.peak:
            gathered = FsdpStep(gathered_peak_bytes=self.peak,
                                gathered_peak_modules=list(self.peak_modules))
        if self.broken_state:
            return msgspec.structs.replace(gathered, optimizer_state_error=self.broken_state)
        if self.optimizers:
            return msgspec.structs.replace(
                gathered, optimizer_state_bytes=sum(b for _, b in self.optimizers.values()),
                optimizers=[n for n, _ in self.optimizers.values()])
        return gathered

    def finish_into(self, record: MutableMapping[str, Any]) -> None:
        """``finish``, its figures put in the step's record as ``fsdp_memory``
        (the JSON keys of its fields that are set)."""
        figures = self.finish()
        if figures is not None:
            record["fsdp_memory"] = figures.to_dict()

    def gathered(self, key: int, name: str, nbytes: int) -> None:
        """The module ``key`` now holds ``nbytes`` gathered (0: resharded)."""
        old = self.live.pop(key, None)
        self.now -= old[1] if old else 0
        if nbytes:
            self.live[key] = (name, nbytes)
            self.now += nbytes
        if self.now > self.peak:
            self.peak, self.peak_modules = self.now, [n for n, _ in self.live.values()]
            if self.now > self.run_peak:
                self.run_peak, self.run_peak_modules = self.now, self.peak_modules


def _stepped(optimizer: Any, *_: Any) -> None:
    active = _ACTIVE
    if active is None or (active.fsdp_only and not active.shards):
        return
    entries = len(getattr(optimizer, "state", ()))
    if active.entries.get(id(optimizer)) == entries:
        return  # read already, and no parameter gained state since
    try:
        active.optimizers[id(optimizer)] = (type(optimizer).__name__, state_bytes(optimizer))
        active.entries[id(optimizer)] = entries
    except Exception as exc:  # noqa: BLE001 - an optimizer whose state is not tensors in dicts
        active.broken_state = f"{type(exc).__name__}: {exc}"


def _group_bytes(group: Any) -> int:
    """An FSDP2 group's parameters unsharded (in the dtype they are gathered in)."""
    total = 0
    for p in getattr(group, "fsdp_params", ()):
        dtype = getattr(p, "param_dtype", None) or p.orig_dtype
        total += p._orig_size.numel() * dtype.itemsize
    return total


def _fsdp2_shards(group: Any) -> tuple[int, int]:
    """An FSDP2 group's local shards' bytes, and its parameters' bytes unsharded
    (both in the dtype they are stored in, as ``capture.ranks.fsdp`` counts them)."""
    sharded = unsharded = 0
    for p in getattr(group, "fsdp_params", ()):
        local = p._sharded_local_tensor
        sharded += local.numel() * local.element_size()
        unsharded += p._orig_size.numel() * p.orig_dtype.itemsize
    return sharded, unsharded


def _fsdp2_after(group: Any) -> None:
    active: FsdpMemory = _ACTIVE  # type: ignore[assignment]
    held = group._all_gather_result is not None or group.is_unsharded
    active.gathered(id(group), group._module_fqn or "(root)", _group_bytes(group) if held else 0)
    if id(group) not in active.shards:
        active.shards[id(group)] = _fsdp2_shards(group)


def _fsdp1_after(handle: Any) -> None:
    active: FsdpMemory = _ACTIVE  # type: ignore[assignment]
    nbytes = 0
    if handle.uses_sharded_strategy:
        nbytes = handle._get_padded_unsharded_flat_param().untyped_storage().nbytes()
    active.gathered(id(handle), fsdp_module(sys._getframe(2)) or "?", nbytes)
    if id(handle) not in active.shards:
        flat = handle.flat_param
        full = getattr(flat, "_unpadded_unsharded_size", flat.shape)
        # the shard: after unshard ``flat_param`` holds the gathered data, so not
        # its size; ``_local_shard`` is the rank's (padded) shard throughout
        shard = getattr(flat, "_local_shard", None) if handle.uses_sharded_strategy else None
        local = shard if shard is not None else flat
        active.shards[id(handle)] = (local.numel() * local.element_size(),
                                     int(full.numel()) * flat.element_size())


def _wrap(cls: Any, names: tuple[str, ...], after: Callable[[Any], None]) -> None:
    for name in names:
        real = getattr(cls, name)
        if getattr(real, "_torchlens_wrapped", False):
            continue

        def wrapper(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            out = _real(self, *args, **kwargs)
            active = _ACTIVE
            if active is not None and active.broken is None:
                try:
                    after(self)
                except Exception as exc:  # noqa: BLE001 - FSDP's internals moved: the job runs on
                    active.broken = f"{type(exc).__name__}: {exc}"
            return out

        wrapper._torchlens_wrapped = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = real  # type: ignore[attr-defined]
        setattr(cls, name, wrapper)


def _patch(module: Any) -> None:
    if module.__name__ == _FSDP2:
        _wrap(module.FSDPParamGroup, ("unshard", "reshard"), _fsdp2_after)
    else:
        _wrap(module.FlatParamHandle, ("unshard", "reshard"), _fsdp1_after)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches an FSDP module right after it is first imported, by the job."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in (_FSDP1, _FSDP2) and fullname not in _AFTER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        real = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            real(module)
            if fullname in (_FSDP1, _FSDP2):
                _patch(module)
            for then in _AFTER.pop(fullname, ()):
                then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _AfterImport()
#: module name -> what to do with it once the job imports it (``when_imported``)
_AFTER: dict[str, list[Callable[[Any], None]]] = {}


def when_imported(name: str, then: Callable[[Any], None]) -> None:
    """``then(module)`` now if ``name`` is imported, else right after the job imports
    it (the FSDP phase timers of ``capture.ranks.phases``: one import hook for both)."""
    if name in sys.modules:
        then(sys.modules[name])
        return
    _AFTER.setdefault(name, []).append(then)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _watch_fsdp() -> None:
    """Patch the FSDP classes already imported; patch the others when they are."""
    for name in (_FSDP1, _FSDP2):
        if name in sys.modules:
            _patch(sys.modules[name])
    if _FINDER not in sys.meta_path and not all(n in sys.modules for n in (_FSDP1, _FSDP2)):
        sys.meta_path.insert(0, _FINDER)

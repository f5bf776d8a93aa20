"""Parameter sync: checksums of every DistributedDataParallel module a rank
built in a step and of every module the step returned, compared across ranks
by the checklist.
"""

from __future__ import annotations

import hashlib
from typing import Any

from torchlens.model.checksums import ModuleChecksums, ParamChecksum, ShardBytes
from torchlens.model.rank_report import WorkerStep


def module_checksums(name: str, module: Any) -> ModuleChecksums:
    """Sum, |sum|, sha1 and first values of every parameter and buffer.

    A sharded (FSDP) parameter is checksummed as the shard this rank holds,
    with which shard it is (``shard``) and its global shape, so that only
    ranks holding the same shard compare values; the module's ``fsdp`` bytes
    are its shards against the same parameters gathered.
    """
    import torch

    from torchlens.capture.ranks.fsdp import sharded_parameters

    shards = sharded_parameters(module)
    params = []
    for kind, items in (("parameter", module.named_parameters()),
                        ("buffer", module.named_buffers())):
        for pname, t in items:
            piece = shards.get(id(t)) if kind == "parameter" else None
            t = (piece.local if piece else t).detach().cpu().contiguous()
            flat = t.reshape(-1)
            try:
                digest = hashlib.sha1(flat.view(torch.uint8).numpy().tobytes()).hexdigest()
            except (RuntimeError, TypeError):
                digest = hashlib.sha1(repr(flat.tolist()).encode()).hexdigest()
            as_f64 = flat.to(torch.float64) if not t.is_complex() else flat.abs().double()
            param = ParamChecksum(kind=kind, name=pname, shape=list(t.shape),
                                  dtype=str(t.dtype).replace("torch.", ""),
                                  sum=float(as_f64.sum()), abs_sum=float(as_f64.abs().sum()),
                                  sha1=digest, head=as_f64[:3].tolist())
            if piece:
                param.shard, param.layout = piece.shard, piece.layout
                param.global_shape = piece.global_shape
            params.append(param)
    out = ModuleChecksums(name=name, params=params)
    if shards:
        out.fsdp = ShardBytes(sharded_bytes=sum(p.sharded_bytes for p in shards.values()),
                              unsharded_bytes=sum(p.unsharded_bytes for p in shards.values()))
    return out


def track_ddp() -> list[Any]:
    """Keep every DistributedDataParallel built during a step (for parameter sync)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    created: list[Any] = []
    real = DDP.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        created.append(self)

    DDP.__init__ = init  # type: ignore[method-assign]
    return created


def record_modules(record: WorkerStep, ddp_modules: list[Any], out: Any) -> None:
    """Checksums of every DDP module built and every module returned (parameter sync)."""
    modules = [module_checksums(f"DistributedDataParallel #{i} "
                                f"({type(m.module).__name__})", m.module)
               for i, m in enumerate(ddp_modules)]
    for i, m in enumerate(_returned_modules(out)):
        modules.append(module_checksums(f"returned #{i} ({type(m).__name__})", m))
    record.modules = modules
    record.returned = None if out is None else repr(out)[:200]


def _returned_modules(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.nn.Module):
        return [out]
    if isinstance(out, (list, tuple)):
        return [m for v in out for m in _returned_modules(v)]
    if isinstance(out, dict):
        return [m for v in out.values() for m in _returned_modules(v)]
    return []

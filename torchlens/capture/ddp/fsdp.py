"""FSDP's side of a collective and of a parameter: which module, which shard.

Why the module comes from the stack: FSDP issues every all_gather and
reduce_scatter of one module's parameters as one flat buffer, and equal
layers give equal buffers, so the op and shapes alone cannot tell layer 1's
all_gather from layer 2's; a rank that skipped a layer would look like one
that ran it (gloo pairs the two and the job computes garbage). FSDP2 issues
them from its ``FSDPParamGroup`` (``_module_fqn``: ``layers.1``), FSDP1 from
its runtime helpers with the ``FlatParamHandle`` in hand.

Why shards get a key: FSDP keeps one copy of each shard, on one rank, so two
ranks' local shards are different numbers by design. Parameter sync compares
a sharded parameter only between ranks holding the same piece (the replicas
of hybrid sharding); elsewhere only its global shape and sharding must agree.
"""

from __future__ import annotations

import os
from typing import Any

_FSDP_DIR = os.sep + os.path.join("torch", "distributed", "fsdp") + os.sep


def fsdp_module(frame: Any) -> str | None:
    """The FSDP module whose parameters the collective being issued moves, or None.

    Only FSDP's own frames are looked into (their locals are read, which
    costs a dictionary per frame): a collective issued by anything else
    walks the stack without reading a local.
    """
    while frame is not None:
        if _FSDP_DIR in frame.f_code.co_filename:
            local = frame.f_locals
            fqn = getattr(local.get("self"), "_module_fqn", None)
            if isinstance(fqn, str):
                return fqn or "(root)"
            module = getattr(local.get("handle"), "_fully_sharded_module", None)
            if module is not None:  # FSDP1: the module has no name of its own here
                return type(module).__name__
        frame = frame.f_back
    return None


def _dtensor_piece(p: Any) -> dict[str, Any] | None:
    placements, mesh = getattr(p, "placements", None), getattr(p, "device_mesh", None)
    if placements is None or mesh is None:
        return None
    coord = mesh.get_coordinate() or []
    pieces = [f"{pl}@{coord[d]}" if pl.is_shard() and d < len(coord) else str(pl)
              for d, pl in enumerate(placements)]
    local = p._local_tensor
    return {"shard": ", ".join(pieces), "layout": ", ".join(map(str, placements)),
            "global_shape": list(p.shape), "local": local,
            "sharded_bytes": local.numel() * local.element_size(),
            "unsharded_bytes": p.numel() * local.element_size()}


def sharded_parameters(module: Any) -> dict[int, dict[str, Any]]:
    """id(parameter) -> which piece of it this rank holds (FSDP2 DTensors, FSDP1 flat
    parameters and the views of them); parameters not sharded are left out."""
    out: dict[int, dict[str, Any]] = {}
    for p in module.parameters():
        piece = _dtensor_piece(p)
        if piece is not None:
            out[id(p)] = piece
    for m in module.modules():  # FSDP1: one FlatParamHandle per wrapped module
        handle = getattr(m, "_handle", None)
        flat = getattr(handle, "flat_param", None)
        if flat is None or id(flat) in out:
            continue
        full = getattr(flat, "_unpadded_unsharded_size", flat.shape)
        size = flat.element_size()
        common = {"shard": f"flat shard {handle.rank} of {handle.world_size}",
                  "layout": f"FSDP1 flat, {handle.world_size} shards"}
        out[id(flat)] = {**common, "global_shape": list(full), "local": flat.detach(),
                         "sharded_bytes": flat.numel() * size,
                         "unsharded_bytes": int(full.numel()) * size}
        for view in getattr(flat, "_params", None) or []:  # use_orig_params=True
            out.setdefault(id(view), {**common, "global_shape": None, "local": view.detach(),
                                      "sharded_bytes": 0, "unsharded_bytes": 0})
    return out

"""FSDP's side of a collective and of a parameter: which module, which shard.

Why the module comes from the stack: FSDP issues every all_gather and
reduce_scatter of one module's parameters as one flat buffer, and equal
layers give equal buffers, so the op and shapes alone cannot tell layer 1's
all_gather from layer 2's; a rank that skipped a layer would look like one
that ran it (gloo pairs the two and the job computes garbage). FSDP2 issues
them from its ``FSDPParamGroup`` (``_module_fqn``: ``layers.1``), FSDP1 from
its runtime helpers with the ``FlatParamHandle`` in hand (the module's name
there comes from the root's ``named_modules``: ``fsdp1_name``).

Why shards get a key: FSDP keeps one copy of each shard, on one rank, so two
ranks' local shards are different numbers by design. Parameter sync compares
a sharded parameter only between ranks holding the same piece (the replicas
of hybrid sharding); elsewhere only its global shape and sharding must agree.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
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
                return fsdp1_name(module, frame)
        frame = frame.f_back
    return None


#: FSDP1: per root (keyed by the ``_ExecOrderData`` the root shares with every
#: FSDP state under it), id(module) -> its name in the root, FSDP's wrapper
#: prefixes taken out (``layers.1``, as FSDP2 names it)
_FSDP1_NAMES: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def fsdp1_name(module: Any, frame: Any) -> str:
    """FSDP1's module by its name in the root FSDP module, its class where that is unknown.

    A frame of FSDP1's runtime holds the FSDP state it runs for (``state``
    or ``self``), not the root; every state shares the root's
    ``_exec_order_data``, and the root is on the stack in its forward (its
    ``_is_root``), which runs before any backward. The names are computed
    there once per root and looked up by that shared object afterwards.
    """
    names = None
    while frame is not None and names is None:
        if _FSDP_DIR in frame.f_code.co_filename:
            local = frame.f_locals
            for state in (local.get("state"), local.get("self")):
                names = _names_of(state)
                if names is not None:
                    break
        frame = frame.f_back
    found = (names or {}).get(id(module))
    return found if found is not None else type(module).__name__


def _names_of(state: Any) -> dict[int, str] | None:
    order = getattr(state, "_exec_order_data", None)
    if order is None:
        return None
    try:
        names = _FSDP1_NAMES.get(order)
    except TypeError:  # not weakly referenceable: not FSDP1's own object
        return None
    if names is None and getattr(state, "_is_root", False) and hasattr(state, "named_modules"):
        names = {id(m): _clean(n) for n, m in state.named_modules()}
        _FSDP1_NAMES[order] = names
    return names


def _clean(name: str) -> str:
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    return ".".join(parts) or "(root)"


#: the attribute names FSDP1 (and activation checkpointing) put between a
#: module and its children
_WRAPPER_PARTS = {"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"}


@dataclass
class ShardPiece:
    """Which piece of a parameter this rank holds: the shard (``Shard(dim=0)@1``,
    ``flat shard 1 of 4``), how the parameter is sharded, its global shape
    (None: a view into an FSDP1 flat parameter), the local tensor, and the
    bytes of the shard and of the whole parameter gathered."""

    shard: str
    layout: str
    global_shape: list[int] | None
    local: Any
    sharded_bytes: int
    unsharded_bytes: int


def _dtensor_piece(p: Any) -> ShardPiece | None:
    placements, mesh = getattr(p, "placements", None), getattr(p, "device_mesh", None)
    if placements is None or mesh is None:
        return None
    coord = mesh.get_coordinate() or []
    pieces = [f"{pl}@{coord[d]}" if pl.is_shard() and d < len(coord) else str(pl)
              for d, pl in enumerate(placements)]
    local = p._local_tensor
    return ShardPiece(shard=", ".join(pieces), layout=", ".join(map(str, placements)),
                      global_shape=list(p.shape), local=local,
                      sharded_bytes=local.numel() * local.element_size(),
                      unsharded_bytes=p.numel() * local.element_size())


def sharded_parameters(module: Any) -> dict[int, ShardPiece]:
    """id(parameter) -> which piece of it this rank holds (FSDP2 DTensors, FSDP1 flat
    parameters and the views of them); parameters not sharded are left out."""
    out: dict[int, ShardPiece] = {}
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
        shard = f"flat shard {handle.rank} of {handle.world_size}"
        layout = f"FSDP1 flat, {handle.world_size} shards"
        out[id(flat)] = ShardPiece(shard=shard, layout=layout, global_shape=list(full),
                                   local=flat.detach(), sharded_bytes=flat.numel() * size,
                                   unsharded_bytes=int(full.numel()) * size)
        for view in getattr(flat, "_params", None) or []:  # use_orig_params=True
            out.setdefault(id(view), ShardPiece(shard=shard, layout=layout, global_shape=None,
                                                local=view.detach(), sharded_bytes=0,
                                                unsharded_bytes=0))
    return out

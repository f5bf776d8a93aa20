"""FSDP in the %ddp_check checklist: which parameters can be compared, and what
the ranks' parameters weigh sharded and gathered, with the optimizer state.

FSDP keeps one copy of each shard, on one rank: two ranks' shards are
different numbers by design, so parameter sync compares a sharded parameter
only between ranks that hold the same shard (hybrid sharding's replicas);
elsewhere it checks that every rank shards the same parameter the same way.
The worker records each shard's key and global shape
(``capture.ranks.fsdp``), and per step the gathered peak and optimizer state it
measured (``capture.ranks.fsdp_memory``); no torch here.
"""

from __future__ import annotations

from typing import Any

import msgspec

from torchlens.model.checksums import ParamChecksum, ShardBytes
from torchlens.model.collectives import Fingerprint
from torchlens.model.rank_report import RankReport
from torchlens.model.units import format_bytes

#: how many bytes one element of a fingerprint's dtype takes (for the size of
#: an all_gather's output); a dtype not listed is left out of the estimate
_ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8,
               "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def shard_relation(a: ParamChecksum, b: ParamChecksum) -> str:
    """``same``: compare the values (not sharded, or the same shard on both ranks);
    ``other shard``: different pieces of one parameter sharded alike (nothing to
    compare); ``layout``: the ranks shard it differently or disagree on its shape."""
    (shard_a, *layout_a), (shard_b, *layout_b) = a.shard_key, b.shard_key
    if shard_a is None and shard_b is None:
        return "same"
    if layout_a != layout_b:
        return "layout"
    return "same" if shard_a == shard_b else "other shard"


def layout_text(a: ParamChecksum, b: ParamChecksum, ra: int, rb: int) -> str:
    """How two ranks shard one parameter differently (``shard_relation`` said ``layout``)."""
    def one(p: ParamChecksum, r: int) -> str:
        _, layout, global_shape = p.shard_key
        shape = "x".join(map(str, global_shape or [])) or "?"
        return f"rank {r} {layout or 'not sharded'}, global shape [{shape}]"

    return f"{one(a, ra)}; {one(b, rb)} (sharded differently, or a different model)"


def sharded_text(sharded: int, layout: str) -> str:
    """The parameter-sync sentence's part about shards (``''`` when there were none)."""
    if not sharded:
        return ""
    return (f"; {sharded} sharded parameter{'s' if sharded != 1 else ''} (FSDP) "
            f"{'have' if sharded != 1 else 'has'} the "
            f"same global shape and sharding ({layout}) on every rank; each rank holds its "
            "own shard, which has no copy on another rank to compare it with")


def rank_bytes(results: list[RankReport | None]) -> dict[int, dict[str, int]]:
    """Per rank: bytes of its parameter shards and of the same parameters gathered
    (the last step's modules that FSDP sharded)."""
    out: dict[int, dict[str, int]] = {}
    for res in results:
        if res is None:
            continue
        steps = [s for s in res.steps if s.modules]
        mods = [m.fsdp for m in (steps[-1].modules if steps else [])
                if isinstance(m.fsdp, ShardBytes)]
        if mods:
            out[res.rank] = {"sharded_bytes": sum(m.sharded_bytes for m in mods),
                             "unsharded_bytes": sum(m.unsharded_bytes for m in mods)}
    return out


def largest_gather(fingerprints: list[Fingerprint]) -> int:
    """Bytes of the largest all_gather output of one rank: one FSDP module gathered."""
    best = 0
    for fp in fingerprints or []:
        if not fp.module_name or "all_gather" not in fp.op:
            continue
        for shape, dtype in zip(fp.shapes, fp.dtypes, strict=False):
            n = 1
            for s in shape:
                n *= int(s)
            best = max(best, n * _ITEM_BYTES.get(str(dtype), 0))
    return best


#: how each gathered figure was obtained, as the memory line and ``details`` say it
ALIVE = "measured: gathered parameters alive at once"
ALLOCATOR = "measured: allocator peak"
MODELLED = "modelled: the largest all_gather output"


class FsdpRank(msgspec.Struct, omit_defaults=True):
    """One FSDP rank's figures (bytes, None where not known): its parameter
    shards and the same parameters gathered, the most gathered at once and its
    modules, how that figure was obtained (``gathered_how``: ``ALIVE`` or
    ``MODELLED``, and ``largest_gather_bytes`` when modelled), the allocator
    peak over the step or why it was not read, the optimizer state and its
    optimizers; ``*_error``: why a count failed. Unset figures are left out
    of the JSON (the checklist's ``details``)."""

    sharded_bytes: int | None = None
    unsharded_bytes: int | None = None
    gathered_peak_bytes: int | None = None
    gathered_peak_modules: list[str] = []
    gathered_error: str | None = None
    optimizer_state_bytes: int | None = None
    optimizers: list[str] = []
    optimizer_state_error: str | None = None
    allocator_peak_bytes: int | None = None
    allocator_unmeasured: str | None = None
    gathered_how: str | None = None
    largest_gather_bytes: int | None = None


def _measured(res: RankReport) -> dict[str, Any]:
    """The worker's ``fsdp_memory`` figures of the rank's last step that has them
    (the figures it set)."""
    steps = [s.fsdp_memory for s in res.steps if s.fsdp_memory is not None]
    return msgspec.to_builtins(steps[-1]) if steps else {}


def rank_figures(results: list[RankReport | None],
                 fingerprints: list[list[Fingerprint]]) -> dict[int, FsdpRank]:
    """Per FSDP rank: shard and gathered bytes, the gathered peak and how it was
    obtained (``gathered_how``), the allocator peak (CUDA) and the optimizer state."""
    shards = rank_bytes(results)
    figures = {r: FsdpRank(**b) for r, b in shards.items()}
    for res in results:
        if res is None:
            continue
        r, got = res.rank, _measured(res)
        if r not in figures and not got.get("gathered_peak_bytes"):
            continue  # no FSDP on this rank: its optimizer alone is not this line's
        f = figures[r] = msgspec.convert({**shards.get(r, {}), **got}, FsdpRank)
        if f.gathered_peak_bytes:
            f.gathered_how = ALIVE
        else:
            gather = largest_gather(fingerprints[r] if r < len(fingerprints) else [])
            if gather:
                f.largest_gather_bytes = f.gathered_peak_bytes = gather
                f.gathered_how = MODELLED
    return figures


def module_names(names: list[str]) -> list[str]:
    """FSDP modules as the text names them: an ``nn.Sequential``'s children are "0",
    "1" ... ("2 + 1" reads as a sum), so a bare number is "module 2"."""
    return [f"module {n}" if n.isdigit() else n for n in names]


def rank_text(f: FsdpRank) -> str:
    """One rank's FSDP figures in words, each said measured or modelled (or why
    not measured): the ``%ddp_check`` memory line's clause and the run report's."""
    parts = []
    if f.sharded_bytes is not None:
        parts.append(f"{format_bytes(f.sharded_bytes)} sharded of "
                     f"{format_bytes(f.unsharded_bytes)} gathered")
    how = f.gathered_how
    if how == ALIVE:
        mods = module_names(f.gathered_peak_modules or [])
        many = (f"; {len(mods)} modules together, {' + '.join(mods)}: a prefetch, or a "
                "module kept gathered" if len(mods) > 1 else f"; {mods[0]}" if mods else "")
        parts.append(f"gathered at once {format_bytes(f.gathered_peak_bytes)} "
                     f"({how}{many})")
    elif how == MODELLED:
        why = (f"the count failed: {f.gathered_error}" if f.gathered_error else
               "prefetching can hold two at once")
        parts.append(f"largest module gathered at once {format_bytes(f.gathered_peak_bytes)}"
                     f" ({how}; not measured: {why})")
    elif f.gathered_error:
        parts.append(f"gathered at once not measured (the count failed: {f.gathered_error})")
    if f.allocator_peak_bytes is not None:
        parts.append(f"allocator peak {format_bytes(f.allocator_peak_bytes)} over the step "
                     f"({ALLOCATOR}: activations and gradients included)")
    elif f.allocator_unmeasured:
        parts.append(f"allocator peak not measured {f.allocator_unmeasured}")
    if f.optimizer_state_bytes is not None:
        names = ", ".join(sorted(set(f.optimizers or []))) or "the optimizer"
        parts.append(f"optimizer state {format_bytes(f.optimizer_state_bytes)} "
                     f"(measured: {names}'s state tensors after its step)")
    else:
        why = (f"reading it failed: {f.optimizer_state_error}"
               if f.optimizer_state_error else "no optimizer.step() in the step")
        parts.append(f"optimizer state not measured ({why})")
    return ", ".join(parts)


def memory_text(results: list[RankReport | None],
                fingerprints: list[list[Fingerprint]]) -> tuple[str, dict[int, FsdpRank]]:
    """The memory line's FSDP sentence and its figures per rank ('' when no FSDP).
    Ranks with the same figures share one clause."""
    figures = rank_figures(results, fingerprints)
    if not figures:
        return "", {}
    return "; FSDP per rank: " + "; ".join(
        f"{ranks}: {text}" for ranks, text in by_text(
            {r: rank_text(f) for r, f in figures.items()})), figures


def by_text(texts: dict[int, str]) -> list[tuple[str, str]]:
    """(``rank 0`` or ``ranks 0-3``, text): ranks with the same text share one,
    so a thousand alike ranks read as one clause."""
    clauses: dict[str, list[int]] = {}
    for r, text in sorted(texts.items()):
        clauses.setdefault(text, []).append(r)
    return [(_ranks(rs), text) for text, rs in clauses.items()]


def _ranks(rs: list[int]) -> str:
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ", ".join(map(str, rs))


def rank_row(f: FsdpRank | None) -> dict[str, int | str | None]:
    """The ranks table's FSDP cells of one rank (empty without FSDP): shard bytes,
    the gathered peak and whether it was measured or modelled, the optimizer state."""
    if f is None:
        return {}
    how = f.gathered_how
    return {"fsdp_sharded": f.sharded_bytes, "fsdp_gathered": f.gathered_peak_bytes,
            "fsdp_gathered_how": how.split(":")[0] if how else None,
            "allocator_peak": f.allocator_peak_bytes,
            "optimizer_state": f.optimizer_state_bytes}

"""FSDP in the %ddp_check checklist: which parameters can be compared, and what
the ranks' parameters weigh sharded and gathered.

FSDP keeps one copy of each shard, on one rank: two ranks' shards are
different numbers by design, so parameter sync compares a sharded parameter
only between ranks that hold the same shard (hybrid sharding's replicas);
elsewhere it checks that every rank shards the same parameter the same way.
The worker records each shard's key and global shape
(``capture.ddp.fsdp``); plain dicts here, no torch.
"""

from __future__ import annotations

from typing import Any

from torchlens.model.units import format_bytes

#: how many bytes one element of a fingerprint's dtype takes (for the size of
#: an all_gather's output); a dtype not listed is left out of the estimate
_ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8,
               "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def shard_relation(a: dict[str, Any], b: dict[str, Any]) -> str:
    """``same``: compare the values (not sharded, or the same shard on both ranks);
    ``other shard``: different pieces of one parameter sharded alike (nothing to
    compare); ``layout``: the ranks shard it differently or disagree on its shape."""
    if a.get("shard") is None and b.get("shard") is None:
        return "same"
    if (a.get("layout"), a.get("global_shape")) != (b.get("layout"), b.get("global_shape")):
        return "layout"
    return "same" if a.get("shard") == b.get("shard") else "other shard"


def layout_text(a: dict[str, Any], b: dict[str, Any], ra: int, rb: int) -> str:
    """How two ranks shard one parameter differently (``shard_relation`` said ``layout``)."""
    def one(p: dict[str, Any], r: int) -> str:
        shape = "x".join(map(str, p.get("global_shape") or [])) or "?"
        return f"rank {r} {p.get('layout') or 'not sharded'}, global shape [{shape}]"

    return f"{one(a, ra)}; {one(b, rb)} (sharded differently, or a different model)"


def sharded_text(sharded: int, layout: str) -> str:
    """The parameter-sync sentence's part about shards (``''`` when there were none)."""
    if not sharded:
        return ""
    return (f"; {sharded} sharded parameter{'s' if sharded != 1 else ''} (FSDP) "
            f"{'have' if sharded != 1 else 'has'} the "
            f"same global shape and sharding ({layout}) on every rank; each rank holds its "
            "own shard, which has no copy on another rank to compare it with")


def rank_bytes(results: list[dict[str, Any] | None]) -> dict[int, dict[str, int]]:
    """Per rank: bytes of its parameter shards and of the same parameters gathered
    (the last step's modules that FSDP sharded)."""
    out: dict[int, dict[str, int]] = {}
    for res in results:
        if not res:
            continue
        steps = [s for s in res.get("steps") or [] if s.get("modules")]
        mods = [m["fsdp"] for m in (steps[-1]["modules"] if steps else []) if m.get("fsdp")]
        if mods:
            out[res["rank"]] = {k: sum(m[k] for m in mods)
                                for k in ("sharded_bytes", "unsharded_bytes")}
    return out


def largest_gather(fingerprints: list[dict[str, Any]]) -> int:
    """Bytes of the largest all_gather output of one rank: one FSDP module gathered."""
    best = 0
    for fp in fingerprints or []:
        if not fp.get("module") or "all_gather" not in str(fp.get("op")):
            continue
        for shape, dtype in zip(fp.get("shapes") or [], fp.get("dtypes") or [], strict=False):
            n = 1
            for s in shape:
                n *= int(s)
            best = max(best, n * _ITEM_BYTES.get(str(dtype), 0))
    return best


def memory_text(results: list[dict[str, Any] | None],
                fingerprints: list[list[dict[str, Any]]]) -> tuple[str, dict[int, dict[str, int]]]:
    """The memory line's FSDP sentence and its figures per rank ('' when no FSDP)."""
    figures = rank_bytes(results)
    if not figures:
        return "", {}
    parts = []
    for r, f in sorted(figures.items()):
        gather = largest_gather(fingerprints[r] if r < len(fingerprints) else [])
        if gather:
            f["largest_gather_bytes"] = gather
        parts.append(f"rank {r}: {format_bytes(f['sharded_bytes'])} sharded of "
                     f"{format_bytes(f['unsharded_bytes'])} gathered"
                     + (f", largest module gathered at once {format_bytes(gather)}"
                        if gather else ""))
    return ("; FSDP parameters " + "; ".join(parts)
            + " (the gathered peak is not measured: a CPU build keeps no allocator peak; "
            "it is the largest all_gather output, and prefetching can hold two at once; "
            "optimizer state is not measured)"), figures

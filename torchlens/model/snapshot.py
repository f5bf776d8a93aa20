"""Loading CUDA allocator snapshots (``torch.cuda.memory._dump_snapshot``) safely.

A snapshot is a pickle, and the stock unpickler runs whatever code a pickle
names. Users receive snapshots from colleagues and bug reports, so a snapshot
is untrusted input: it is loaded with an unpickler whose ``find_class`` refuses
every global. Real snapshots hold only dicts, lists, tuples, strings and
numbers, which pickle encodes with opcodes that never call ``find_class``, so
nothing legitimate is lost.

Snapshots written by older torch releases lack keys (``allocator_settings``,
``state``, ``requested_size``, ``segment_type``, ``stream`` ...). They are
normalized here, once, so that analysis code can index every key without
guessing. Defaults are chosen so that figures computed from a normalized
snapshot equal those computed from the raw one (sizes are derived from the
blocks that are there, never invented).

Pure Python: this module imports nothing of torchlens beyond ``errors``.
"""

from __future__ import annotations

import io
import pickle
from os import PathLike
from pathlib import Path
from typing import IO, Any

from torchlens.model.errors import InputError

#: Sizes below this are small-pool segments (the allocator's 2 MiB buffer).
_SMALL_SEGMENT = 2 * 1024 * 1024

#: Block states in torch's snapshot format.
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")

#: Trace actions in torch's snapshot format.
TRACE_ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "user_defined",
)


class _NoGlobalsUnpickler(pickle.Unpickler):
    """An unpickler that refuses every global, so loading can never run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise InputError(
            f"refused: the file tries to load {module}.{name}; "
            "snapshots contain only builtins"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise InputError(
            "refused: the file uses pickle persistent ids; "
            "snapshots contain only builtins"
        )


def _read_bytes(
    source: str | PathLike[str] | bytes | bytearray | memoryview | IO[bytes],
) -> tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), "<bytes>"
    if hasattr(source, "read"):
        return source.read(), getattr(source, "name", "<stream>")  # type: ignore[union-attr]
    path = Path(source)  # type: ignore[arg-type]
    try:
        return path.read_bytes(), str(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a snapshot file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def load_snapshot(
    path_or_bytes: str | PathLike[str] | bytes | bytearray | memoryview | IO[bytes],
) -> dict[str, Any]:
    """Load and normalize a CUDA allocator snapshot without running any code.

    Accepts a path, the file's bytes, or a binary file object. Raises
    ``InputError`` with a one-line reason for: a pickle that names any global
    (nothing is executed), a truncated or non-pickle file, and a pickle that is
    not a snapshot. Returns the normalized dict (see ``normalize_snapshot``).
    """
    data, name = _read_bytes(path_or_bytes)
    if not data:
        raise InputError(f"{name}: empty file, not a memory snapshot")
    try:
        obj = _NoGlobalsUnpickler(io.BytesIO(data)).load()
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None
    except EOFError:
        raise InputError(
            f"{name}: truncated: the pickle ends early (was the file copied completely?)"
        ) from None
    except (
        pickle.UnpicklingError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        OverflowError,
        MemoryError,
        UnicodeDecodeError,
    ) as exc:
        raise InputError(
            f"{name}: not a memory snapshot: cannot read it as a pickle ({exc})"
        ) from None
    return normalize_snapshot(obj, name=name)


def _as_int(value: Any, what: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(
            f"{name}: not a memory snapshot: {what} is {value!r}, not an integer"
        )
    return value


def _normalize_block(raw: Any, addr: int, name: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or "size" not in raw:
        raise InputError(f"{name}: not a memory snapshot: a block has no size")
    block = dict(raw)
    block["size"] = _as_int(block["size"], "a block size", name)
    block.setdefault("address", addr)
    block["address"] = _as_int(block["address"], "a block address", name)
    if "state" not in block:
        # torch < 2.0 wrote two booleans instead of a state string.
        if block.get("allocated"):
            block["state"] = "active_allocated"
        elif block.get("active"):
            block["state"] = "active_pending_free"
        else:
            block["state"] = "inactive"
    elif block["state"] == "active_awaiting_free":
        block["state"] = "active_pending_free"  # the docstring's name for it
    block.setdefault("requested_size", block["size"])
    block.setdefault("frames", [])
    return block


def _normalize_segment(raw: Any, name: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or "address" not in raw:
        raise InputError(f"{name}: not a memory snapshot: a segment has no address")
    seg = dict(raw)
    seg["address"] = _as_int(seg["address"], "a segment address", name)
    raw_blocks = seg.get("blocks")
    if raw_blocks is None:
        raw_blocks = []
    if not isinstance(raw_blocks, list):
        raise InputError(f"{name}: not a memory snapshot: segment blocks is not a list")
    blocks = []
    addr = seg["address"]
    for rb in raw_blocks:
        b = _normalize_block(rb, addr, name)
        blocks.append(b)
        addr = b["address"] + b["size"]
    seg["blocks"] = blocks
    total = sum(b["size"] for b in blocks)
    if "total_size" not in seg:
        seg["total_size"] = total
    seg["total_size"] = _as_int(seg["total_size"], "a segment total_size", name)
    active = [b for b in blocks if b["state"] != "inactive"]
    seg.setdefault(
        "allocated_size",
        sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
    )
    seg.setdefault("active_size", sum(b["size"] for b in active))
    seg.setdefault("requested_size", sum(b["requested_size"] for b in active))
    seg.setdefault("device", 0)
    seg.setdefault("stream", 0)
    if "segment_type" not in seg:
        # Small-pool segments are exactly one 2 MiB buffer; large-pool ones are
        # at least 10 MiB (rounded requests) or 20 MiB buffers.
        seg["segment_type"] = (
            "small" if seg["total_size"] <= _SMALL_SEGMENT else "large"
        )
    seg.setdefault("segment_pool_id", (0, 0))
    seg.setdefault("is_expandable", False)
    seg.setdefault("frames", [])
    return seg


def _normalize_trace_entry(raw: Any, name: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or "action" not in raw:
        raise InputError(f"{name}: not a memory snapshot: a trace entry has no action")
    entry = dict(raw)
    entry.setdefault("addr", 0)
    entry.setdefault("size", 0)
    entry.setdefault("stream", 0)
    entry.setdefault("frames", [])
    return entry


def normalize_snapshot(obj: Any, name: str = "snapshot") -> dict[str, Any]:
    """Return ``obj`` as a snapshot dict with every key torch's newest format has.

    Missing keys get defaults: ``device_traces=[]``, ``allocator_settings={}``,
    ``external_annotations=[]``; segment fields (``stream`` 0, ``segment_type``
    from the size, ``is_expandable`` False, sizes summed from the blocks);
    block fields (``address`` from the running offset, ``state`` from the old
    ``allocated``/``active`` booleans, ``requested_size`` = ``size``,
    ``frames`` []); trace fields (``stream`` 0, ``frames`` []). A bare list is
    the pre-dict format of ``memory_snapshot()`` (segments only). Anything else
    raises ``InputError``.
    """
    if isinstance(obj, list):
        obj = {"segments": obj}
    if not isinstance(obj, dict) or "segments" not in obj:
        kind = type(obj).__name__
        keys = (
            f" with keys {sorted(map(str, obj))[:5]}" if isinstance(obj, dict) else ""
        )
        raise InputError(
            f"{name}: not a memory snapshot: expected a dict with 'segments' "
            f"(from torch.cuda.memory._dump_snapshot), got a {kind}{keys}"
        )
    if not isinstance(obj["segments"], list):
        raise InputError(f"{name}: not a memory snapshot: 'segments' is not a list")
    snap = dict(obj)
    snap["segments"] = [_normalize_segment(s, name) for s in obj["segments"]]
    traces = snap.get("device_traces")
    if traces is None:
        traces = []
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise InputError(
            f"{name}: not a memory snapshot: 'device_traces' is not a list of lists"
        )
    snap["device_traces"] = [
        [_normalize_trace_entry(e, name) for e in t] for t in traces
    ]
    settings = snap.get("allocator_settings")
    snap["allocator_settings"] = dict(settings) if isinstance(settings, dict) else {}
    if not isinstance(snap.get("external_annotations"), list):
        snap["external_annotations"] = []
    return snap

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

import contextlib
import gc
import io
import pickle
import reprlib
from collections.abc import Iterator
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
        raise InputError(f"{path}: is a directory, not a snapshot file; for a folder of "
                         f"per-rank snapshots run torchlens report {path} or call "
                         f"torchlens.load_snapshots({str(path)!r})") from None
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
        with _no_gc():
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
        RecursionError,
    ) as exc:
        raise InputError(
            f"{name}: not a memory snapshot: cannot read it as a pickle ({exc})"
        ) from None
    return normalize_snapshot(obj, name=name)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic collector paused while unpickling: the tens of thousands of dicts and
    lists a snapshot holds are none of them garbage, and the collector would walk them
    again at each threshold (half the unpickling's CPU time for a 3 MB training step's
    snapshot: 0.047 s with it, 0.025 s without)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: No device has this much memory (1 PiB): a size past it is a damaged value
#: (a size of 10**30 would overflow numpy deep inside the analysis).
MAX_BYTES = 2**50
#: Addresses and stream handles are 64-bit values.
_MAX_U64 = 2**64 - 1


def _damaged(name: str, where: str, key: str, value: Any, want: str) -> InputError:
    text = reprlib.repr(value)  # depth-limited: a damaged value may nest thousands deep
    shown = f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"
    return InputError(
        f"{name}: damaged memory snapshot: {where} field {key!r} is {shown}, not {want}; "
        "take the snapshot again (torch.cuda.memory._dump_snapshot)")


def _check_int(d: dict[str, Any], key: str, where: str, name: str, hi: int = _MAX_U64,
               want: str = "a whole number of bytes") -> int:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise _damaged(name, where, key, value, want)
    return value


def _check_size(d: dict[str, Any], key: str, where: str, name: str) -> int:
    return _check_int(d, key, where, name, MAX_BYTES, "a size of 0 to 2**50 bytes")


class _Checked:
    """What ``_check_frames`` has checked in one snapshot: the ids of frame dicts and
    frame lists, and one list per distinct stack (keyed by its frames' ids). Pickle
    shares one dict between every stack that repeats a frame (700k frames, under 1k
    distinct in a training step's snapshot), so each is checked once; the ids stay
    valid because the snapshot being normalized holds every frame."""

    __slots__ = ("ids", "stacks")

    def __init__(self) -> None:
        self.ids: set[int] = set()
        self.stacks: dict[tuple[int, ...], list[Any]] = {}


def _check_frames(d: dict[str, Any], where: str, name: str, seen: _Checked) -> None:
    """``frames``: a list of dicts whose name and file are text and line a number.

    A list holding the same frame dicts as one checked before is replaced by that one
    (``d`` is the normalized copy): a training step's 12.7k lists hold a few hundred
    distinct stacks, and the analysis judges a list it has seen by its id alone."""
    frames = d["frames"]
    if not isinstance(frames, list):
        raise _damaged(name, where, "frames", frames, "a list of frames")
    ids = seen.ids
    if id(frames) in ids:
        return
    key = tuple(map(id, frames))
    same = seen.stacks.get(key)
    if same is not None:
        d["frames"] = same
        return
    if not ids.issuperset(key):
        for k, f in enumerate(frames):
            if id(f) in ids:
                continue
            if not isinstance(f, dict):
                raise _damaged(name, f"{where}.frames[{k}]", "frame", f, "a dict")
            for fkey in ("name", "filename"):
                if fkey in f and not isinstance(f[fkey], str):
                    raise _damaged(name, f"{where}.frames[{k}]", fkey, f[fkey], "text")
            if "line" in f and (isinstance(f["line"], bool) or not isinstance(f["line"], int)):
                raise _damaged(name, f"{where}.frames[{k}]", "line", f["line"],
                               "a line number")
            ids.add(id(f))
    ids.add(id(frames))
    seen.stacks[key] = frames


def _normalize_block(raw: Any, addr: int, name: str, where: str,
                     seen: _Checked) -> dict[str, Any]:
    if not isinstance(raw, dict) or "size" not in raw:
        raise InputError(f"{name}: not a memory snapshot: {where} has no size")
    block = dict(raw)
    _check_size(block, "size", where, name)
    block.setdefault("address", addr)
    _check_int(block, "address", where, name, want="an address")
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
    if block["state"] not in BLOCK_STATES:
        raise _damaged(name, where, "state", block["state"], " or ".join(BLOCK_STATES))
    block.setdefault("requested_size", block["size"])
    _check_size(block, "requested_size", where, name)
    block.setdefault("frames", [])
    _check_frames(block, where, name, seen)
    return block


def _normalize_segment(raw: Any, name: str, where: str, seen: _Checked) -> dict[str, Any]:
    if not isinstance(raw, dict) or "address" not in raw:
        raise InputError(f"{name}: not a memory snapshot: {where} has no address")
    seg = dict(raw)
    _check_int(seg, "address", where, name, want="an address")
    raw_blocks = seg.get("blocks")
    if raw_blocks is None:
        raw_blocks = []
    if not isinstance(raw_blocks, list):
        raise _damaged(name, where, "blocks", raw_blocks, "a list")
    blocks = []
    addr = seg["address"]
    for j, rb in enumerate(raw_blocks):
        b = _normalize_block(rb, addr, name, f"{where}.blocks[{j}]", seen)
        blocks.append(b)
        addr = b["address"] + b["size"]
    seg["blocks"] = blocks
    total = sum(b["size"] for b in blocks)
    if "total_size" not in seg:
        seg["total_size"] = total
    _check_size(seg, "total_size", where, name)
    active = [b for b in blocks if b["state"] != "inactive"]
    seg.setdefault(
        "allocated_size",
        sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
    )
    seg.setdefault("active_size", sum(b["size"] for b in active))
    seg.setdefault("requested_size", sum(b["requested_size"] for b in active))
    for key in ("allocated_size", "active_size", "requested_size"):
        _check_int(seg, key, where, name, _MAX_U64)  # sums of checked sizes
    seg.setdefault("device", 0)
    _check_int(seg, "device", where, name, 2**31, "a device number")
    seg.setdefault("stream", 0)
    _check_int(seg, "stream", where, name, want="a stream handle")
    if "segment_type" not in seg:
        # Small-pool segments are exactly one 2 MiB buffer; large-pool ones are
        # at least 10 MiB (rounded requests) or 20 MiB buffers.
        seg["segment_type"] = (
            "small" if seg["total_size"] <= _SMALL_SEGMENT else "large"
        )
    if seg["segment_type"] not in ("small", "large"):
        raise _damaged(name, where, "segment_type", seg["segment_type"], "'small' or 'large'")
    seg.setdefault("segment_pool_id", (0, 0))
    seg.setdefault("is_expandable", False)
    seg.setdefault("frames", [])
    _check_frames(seg, where, name, seen)
    return seg


def _normalize_trace_entry(raw: Any, name: str, where: str,
                           seen: _Checked) -> dict[str, Any]:
    if not isinstance(raw, dict) or "action" not in raw:
        raise InputError(f"{name}: not a memory snapshot: {where} has no action")
    entry = dict(raw)
    addr, size, stream = (entry.setdefault("addr", 0), entry.setdefault("size", 0),
                          entry.setdefault("stream", 0))
    # the usual entry passes in one test (19k entries: no call per field); any other
    # goes through the checks one by one, which name the first bad field
    if not (type(entry["action"]) is str and type(addr) is int and type(size) is int
            and type(stream) is int and 0 <= addr <= _MAX_U64 and 0 <= size <= MAX_BYTES
            and 0 <= stream <= _MAX_U64):
        if not isinstance(entry["action"], str):
            raise _damaged(name, where, "action", entry["action"], "an action name")
        _check_int(entry, "addr", where, name, want="an address")
        _check_size(entry, "size", where, name)
        _check_int(entry, "stream", where, name, want="a stream handle")
    entry.setdefault("frames", [])
    _check_frames(entry, where, name, seen)
    t = entry.get("time_us")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                          or not 0 <= t < 2**63):
        raise _damaged(name, where, "time_us", t, "a time in microseconds")
    if "device_free" in entry:
        _check_int(entry, "device_free", where, name)
    return entry


def _check_settings(settings: dict[str, Any], name: str) -> None:
    """The allocator settings the model reads (``AllocatorConfig.from_settings``)."""
    where = "allocator_settings"
    for key in ("max_split_size",):
        v = settings.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not -1 <= v <= _MAX_U64):
            raise _damaged(name, where, key, v, "a size in bytes (-1: none)")
    v = settings.get("garbage_collection_threshold")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                          or not 0.0 <= v <= 1.0):
        raise _damaged(name, where, "garbage_collection_threshold", v, "a fraction 0..1")
    rp = settings.get("roundup_power2_divisions")
    if rp is None:
        return
    if isinstance(rp, dict):
        keys, values = list(rp), list(rp.values())
    else:
        keys, values = [], rp if isinstance(rp, list) else None
    if (values is None
            or not all(isinstance(k, str) and k.isdigit() and len(k) < 12 for k in keys)
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 2**16
                       for d in values)):
        raise _damaged(name, where, "roundup_power2_divisions", rp,
                       "divisions per size interval")


def _held(obj: Any) -> str:
    """What a pickle held, in a few words: ``a list of 3 ints``, ``a str``."""
    kind = type(obj).__name__
    if isinstance(obj, dict):
        return f"a dict with keys {sorted(map(str, obj))[:5]}" if obj else "an empty dict"
    if isinstance(obj, (list, tuple)):
        if not obj:
            return f"an empty {kind}"
        kinds = sorted({type(x).__name__ for x in obj})
        if len(kinds) == 1:
            return f"a {kind} of {len(obj):,} {kinds[0]}{'s' if len(obj) > 1 else ''}"
        return f"a {kind} of {len(obj):,} items ({', '.join(kinds[:4])})"
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def normalize_snapshot(obj: Any, name: str = "snapshot") -> dict[str, Any]:
    """Return ``obj`` as a snapshot dict with every key torch's newest format has.

    Missing keys get defaults: ``device_traces=[]``, ``allocator_settings={}``,
    ``external_annotations=[]``; segment fields (``stream`` 0, ``segment_type``
    from the size, ``is_expandable`` False, sizes summed from the blocks);
    block fields (``address`` from the running offset, ``state`` from the old
    ``allocated``/``active`` booleans, ``requested_size`` = ``size``,
    ``frames`` []); trace fields (``stream`` 0, ``frames`` []). A bare list of
    segment dicts is the pre-dict format of ``memory_snapshot()``; a dict with
    ``device_traces`` and no ``segments`` gets ``segments=[]``. Anything else
    (a list of numbers, a trace's dict) raises ``InputError`` saying what it held.
    """
    if isinstance(obj, list) and obj and all(
            isinstance(s, dict) and "address" in s for s in obj):
        obj = {"segments": obj}  # torch 1.x: memory_snapshot()'s list of segments
    if not isinstance(obj, dict) or not ({"segments", "device_traces"} & obj.keys()):
        # any other pickle (a list of numbers, a trace's dict) is not read as one
        raise InputError(
            f"{name}: not a memory snapshot: it holds {_held(obj)}, not the dict with "
            "'segments' and 'device_traces' that torch.cuda.memory._dump_snapshot() "
            "writes; give that file instead"
        )
    obj = {"segments": [], **obj}  # device_traces alone: a process that freed everything
    if not isinstance(obj["segments"], list):
        raise InputError(f"{name}: not a memory snapshot: 'segments' is not a list")
    snap = dict(obj)
    seen = _Checked()
    snap["segments"] = [_normalize_segment(s, name, f"segments[{i}]", seen)
                        for i, s in enumerate(obj["segments"])]
    traces = snap.get("device_traces")
    if traces is None:
        traces = []
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise InputError(
            f"{name}: not a memory snapshot: 'device_traces' is not a list of lists"
        )
    snap["device_traces"] = [
        [_normalize_trace_entry(e, name, f"device_traces[{d}][{k}]", seen)
         for k, e in enumerate(t)]
        for d, t in enumerate(traces)
    ]
    settings = snap.get("allocator_settings")
    snap["allocator_settings"] = dict(settings) if isinstance(settings, dict) else {}
    _check_settings(snap["allocator_settings"], name)
    if not isinstance(snap.get("external_annotations"), list):
        snap["external_annotations"] = []
    return snap

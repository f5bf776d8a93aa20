"""Loading CUDA allocator snapshots (``torch.cuda.memory._dump_snapshot``) safely.

A snapshot is a pickle, and the stock unpickler runs whatever code a pickle
names. Users receive snapshots from colleagues and bug reports, so a snapshot
is untrusted input: it is loaded with an unpickler whose ``find_class`` refuses
every global. Real snapshots hold only dicts, lists, tuples, strings and
numbers, which pickle encodes with opcodes that never call ``find_class``, so
nothing legitimate is lost.

Snapshots written by older torch releases lack keys (``allocator_settings``,
``state``, ``requested_size``, ``segment_type``, ``stream`` ...). They are
normalized here, once, into typed structs (``Snapshot``, ``Segment``,
``SnapBlock``, ``TraceEntry``, ``Frame``) so that analysis code reads every field
without guessing. Defaults are chosen so that figures computed from a normalized
snapshot equal those computed from the raw one (sizes are derived from the
blocks that are there, never invented). ``Snapshot.to_torch()`` gives torch's dict
format back (an export, a saved result).

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

import msgspec

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


class Frame(msgspec.Struct, frozen=True, gc=False):
    """One frame of a recorded stack (a key torch left out reads as its default)."""

    filename: str = ""
    name: str = ""
    line: int = 0


class SnapBlock(msgspec.Struct, gc=False):
    """One block of a segment: its address, size (allocator-rounded), the bytes asked
    for, ``state`` (one of ``BLOCK_STATES``) and the stack that allocated it."""

    address: int
    size: int
    requested_size: int
    state: str
    frames: list[Frame] = []


class Segment(msgspec.Struct, gc=False):
    """One segment (a cudaMalloc, or a mapped range of an expandable segment)."""

    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    device: int = 0
    stream: int = 0
    segment_type: str = "large"  # "small" or "large"
    segment_pool_id: tuple[int, int] = (0, 0)
    is_expandable: bool = False
    frames: list[Frame] = []
    blocks: list[SnapBlock] = []


class TraceEntry(msgspec.Struct, gc=False):
    """One entry of a device's allocator history. ``action`` is one of
    ``TRACE_ACTIONS``; ``addr`` of an ``oom`` entry is 0 and its free bytes are
    ``device_free``. ``torch_category``: the ``[[t_us, category], ...]`` versions torch's
    memory profiler gave an ``alloc``'s tensor (a capture's, never torch's own key)."""

    action: str
    addr: int = 0
    size: int = 0
    stream: int = 0
    frames: list[Frame] = []
    time_us: int | float | None = None
    device_free: int | None = None
    compile_context: str | None = None
    user_metadata: str | None = None
    torch_category: list[Any] | None = None
    #: the tensor's dtype as torch's memory profiler saw it ("bfloat16"; None: not seen)
    torch_dtype: str | None = None


_OPTIONAL_ENTRY_KEYS = ("time_us", "device_free", "compile_context", "user_metadata",
                        "torch_category", "torch_dtype")


class Snapshot(msgspec.Struct):
    """A normalized allocator snapshot: every device's segments and histories.

    ``allocator_settings`` is torch's ``CUDAAllocatorConfig`` as it wrote it (its keys
    change between torch releases; ``AllocatorConfig.from_settings`` reads the ones the
    model needs) and ``extra`` every other top-level key of the file, passed through
    untouched (a torchlens export's capture record)."""

    segments: list[Segment] = []
    device_traces: list[list[TraceEntry]] = []
    allocator_settings: dict[str, Any] = {}
    external_annotations: list[Any] = []
    extra: dict[str, Any] = {}

    def to_torch(self) -> dict[str, Any]:
        """The snapshot in torch's dict format (``_dump_snapshot``'s pickle), plain data."""
        out = msgspec.to_builtins(self, builtin_types=(tuple,))
        for trace in out["device_traces"]:
            for e in trace:  # keys the entry did not have stay out, as torch writes it
                for key in _OPTIONAL_ENTRY_KEYS:
                    if e[key] is None:
                        del e[key]
        out.update(out.pop("extra"))
        return out

    def device_part(self, device: int) -> Snapshot:
        """This snapshot with only ``device``'s segments and history (others' lists empty)."""
        return msgspec.structs.replace(
            self, segments=[s for s in self.segments if s.device == device],
            device_traces=[t if i == device else [] for i, t in enumerate(self.device_traces)])


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
) -> Snapshot:
    """Load and normalize a CUDA allocator snapshot without running any code.

    Accepts a path, the file's bytes, or a binary file object. Raises
    ``InputError`` with a one-line reason for: a pickle that names any global
    (nothing is executed), a truncated or non-pickle file, and a pickle that is
    not a snapshot. Returns the normalized ``Snapshot`` (see ``normalize_snapshot``).
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


def _check_int(value: Any, key: str, where: str, name: str, hi: int = _MAX_U64,
               want: str = "a whole number of bytes") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise _damaged(name, where, key, value, want)
    return value


def _check_size(value: Any, key: str, where: str, name: str) -> int:
    return _check_int(value, key, where, name, MAX_BYTES, "a size of 0 to 2**50 bytes")


class _Checked:
    """What ``_frames`` has made of one snapshot's frames: each frame dict's ``Frame``
    and each distinct stack's list (keyed by the ids of its frame dicts, and by the id
    of every list that held them). Pickle shares one dict between every stack that
    repeats a frame (700k frames, under 1k distinct in a training step's snapshot), so
    each is checked once; the ids stay valid because the raw snapshot being normalized
    holds every frame."""

    __slots__ = ("frames", "lists", "stacks")

    def __init__(self) -> None:
        self.frames: dict[int, Frame] = {}
        self.lists: dict[int, list[Frame]] = {}
        self.stacks: dict[tuple[int, ...], list[Frame]] = {}


def _frames(frames: Any, where: str, name: str, seen: _Checked) -> list[Frame]:
    """``frames``: a list of dicts whose name and file are text and line a number, as
    ``Frame``s. Lists holding the same frame dicts give the same list (a training
    step's 12.7k lists hold a few hundred distinct stacks, and the analysis judges a
    list it has seen by its id alone)."""
    if frames is None:
        return []
    done = seen.lists.get(id(frames))
    if done is not None:
        return done
    if not isinstance(frames, list):
        raise _damaged(name, where, "frames", frames, "a list of frames")
    key = tuple(map(id, frames))
    same = seen.stacks.get(key)
    if same is None:
        made = seen.frames
        out = []
        for k, f in enumerate(frames):
            frame = made.get(id(f))
            if frame is None:
                frame = made[id(f)] = _frame(f, f"{where}.frames[{k}]", name)
            out.append(frame)
        same = seen.stacks[key] = out
    seen.lists[id(frames)] = same
    return same


def _frame(f: Any, where: str, name: str) -> Frame:
    if not isinstance(f, dict):
        raise _damaged(name, where, "frame", f, "a dict")
    for fkey in ("name", "filename"):
        if fkey in f and not isinstance(f[fkey], str):
            raise _damaged(name, where, fkey, f[fkey], "text")
    line = f.get("line", 0)
    if isinstance(line, bool) or not isinstance(line, int):
        raise _damaged(name, where, "line", line, "a line number")
    return Frame(f.get("filename", ""), f.get("name", ""), line)


def _normalize_block(raw: Any, addr: int, name: str, where: str,
                     seen: _Checked) -> SnapBlock:
    if not isinstance(raw, dict) or "size" not in raw:
        raise InputError(f"{name}: not a memory snapshot: {where} has no size")
    size = _check_size(raw["size"], "size", where, name)
    address = _check_int(raw["address"], "address", where, name, want="an address") \
        if "address" in raw else addr
    state = raw.get("state")
    if state is None:
        # torch < 2.0 wrote two booleans instead of a state string.
        if raw.get("allocated"):
            state = "active_allocated"
        elif raw.get("active"):
            state = "active_pending_free"
        else:
            state = "inactive"
    elif state == "active_awaiting_free":
        state = "active_pending_free"  # the docstring's name for it
    if state not in BLOCK_STATES:
        raise _damaged(name, where, "state", state, " or ".join(BLOCK_STATES))
    requested = _check_size(raw["requested_size"], "requested_size", where, name) \
        if "requested_size" in raw else size
    return SnapBlock(address, size, requested, state, _frames(raw.get("frames"), where, name, seen))


def _normalize_segment(raw: Any, name: str, where: str, seen: _Checked) -> Segment:
    if not isinstance(raw, dict) or "address" not in raw:
        raise InputError(f"{name}: not a memory snapshot: {where} has no address")
    address = _check_int(raw["address"], "address", where, name, want="an address")
    raw_blocks = raw.get("blocks")
    if raw_blocks is None:
        raw_blocks = []
    if not isinstance(raw_blocks, list):
        raise _damaged(name, where, "blocks", raw_blocks, "a list")
    blocks = []
    addr = address
    for j, rb in enumerate(raw_blocks):
        b = _normalize_block(rb, addr, name, f"{where}.blocks[{j}]", seen)
        blocks.append(b)
        addr = b.address + b.size
    sums = {
        "total_size": sum(b.size for b in blocks),
        "allocated_size": sum(b.size for b in blocks if b.state == "active_allocated"),
        "active_size": sum(b.size for b in blocks if b.state != "inactive"),
        "requested_size": sum(b.requested_size for b in blocks if b.state != "inactive"),
    }
    total = _check_size(raw["total_size"], "total_size", where, name) if "total_size" in raw \
        else sums["total_size"]
    allocated, active, requested = (
        _check_int(raw[key], key, where, name, _MAX_U64) if key in raw else sums[key]
        for key in ("allocated_size", "active_size", "requested_size"))
    device = _check_int(raw["device"], "device", where, name, 2**31, "a device number") \
        if "device" in raw else 0
    stream = _check_int(raw["stream"], "stream", where, name, want="a stream handle") \
        if "stream" in raw else 0
    # Small-pool segments are exactly one 2 MiB buffer; large-pool ones are at least
    # 10 MiB (rounded requests) or 20 MiB buffers.
    kind = raw.get("segment_type", "small" if total <= _SMALL_SEGMENT else "large")
    if kind not in ("small", "large"):
        raise _damaged(name, where, "segment_type", kind, "'small' or 'large'")
    pool = raw.get("segment_pool_id")
    if (not isinstance(pool, (list, tuple)) or len(pool) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in pool)):
        pool = (0, 0)  # read by nothing here; kept for an export when it is a pair
    return Segment(address, total, allocated, active, requested, device, stream, kind,
                   (pool[0], pool[1]), bool(raw.get("is_expandable", False)),
                   _frames(raw.get("frames"), where, name, seen), blocks)


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _normalize_trace_entry(raw: Any, name: str, where: str,
                           seen: _Checked) -> TraceEntry:
    if not isinstance(raw, dict) or "action" not in raw:
        raise InputError(f"{name}: not a memory snapshot: {where} has no action")
    action = raw["action"]
    addr, size, stream = raw.get("addr", 0), raw.get("size", 0), raw.get("stream", 0)
    # the usual entry passes in one test (19k entries: no call per field); any other
    # goes through the checks one by one, which name the first bad field
    if not (type(action) is str and type(addr) is int and type(size) is int
            and type(stream) is int and 0 <= addr <= _MAX_U64 and 0 <= size <= MAX_BYTES
            and 0 <= stream <= _MAX_U64):
        if not isinstance(action, str):
            raise _damaged(name, where, "action", action, "an action name")
        _check_int(addr, "addr", where, name, want="an address")
        _check_size(size, "size", where, name)
        _check_int(stream, "stream", where, name, want="a stream handle")
    frames = _frames(raw.get("frames"), where, name, seen)
    t = raw.get("time_us")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                          or not 0 <= t < 2**63):
        raise _damaged(name, where, "time_us", t, "a time in microseconds")
    free = _check_int(raw["device_free"], "device_free", where, name) if "device_free" in raw else None
    versions = raw.get("torch_category")
    return TraceEntry(action, addr, size, stream, frames, t, free,
                      _text_or_none(raw.get("compile_context")),
                      _text_or_none(raw.get("user_metadata")),
                      versions if isinstance(versions, list) else None,
                      _text_or_none(raw.get("torch_dtype")))


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


def normalize_snapshot(obj: Any, name: str = "snapshot") -> Snapshot:
    """Return ``obj`` (torch's snapshot dict, as unpickled) as a typed ``Snapshot``.

    Missing keys get defaults: ``device_traces=[]``, ``allocator_settings={}``,
    ``external_annotations=[]``; segment fields (``stream`` 0, ``segment_type``
    from the size, ``is_expandable`` False, sizes summed from the blocks);
    block fields (``address`` from the running offset, ``state`` from the old
    ``allocated``/``active`` booleans, ``requested_size`` = ``size``,
    ``frames`` []); trace fields (``stream`` 0, ``frames`` []). A bare list of
    segment dicts is the pre-dict format of ``memory_snapshot()``; a dict with
    ``device_traces`` and no ``segments`` gets ``segments=[]``. Other top-level
    keys are kept in ``extra``. Anything else (a list of numbers, a trace's dict)
    raises ``InputError`` saying what it held.
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
    raw_segments = obj.get("segments", [])  # device_traces alone: all was freed
    if not isinstance(raw_segments, list):
        raise InputError(f"{name}: not a memory snapshot: 'segments' is not a list")
    seen = _Checked()
    segments = [_normalize_segment(s, name, f"segments[{i}]", seen)
                for i, s in enumerate(raw_segments)]
    traces = obj.get("device_traces")
    if traces is None:
        traces = []
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise InputError(
            f"{name}: not a memory snapshot: 'device_traces' is not a list of lists"
        )
    device_traces = [
        [_normalize_trace_entry(e, name, f"device_traces[{d}][{k}]", seen)
         for k, e in enumerate(t)]
        for d, t in enumerate(traces)
    ]
    settings = obj.get("allocator_settings")
    settings = dict(settings) if isinstance(settings, dict) else {}
    _check_settings(settings, name)
    notes = obj.get("external_annotations")
    extra = {k: v for k, v in obj.items() if k not in _KNOWN_KEYS}
    return Snapshot(segments, device_traces, settings,
                    notes if isinstance(notes, list) else [], extra)


_KNOWN_KEYS = frozenset(("segments", "device_traces", "allocator_settings",
                         "external_annotations"))

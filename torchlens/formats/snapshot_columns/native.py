"""The compiled snapshot reader (``read.c``) through ctypes.

``read`` returns the columns of a snapshot's bytes, or None whenever the reader
declines them: not built, ``TORCHLENS_NO_NATIVE`` set, an opcode that names or
calls code (refused: nothing is run), one it does not take, a truncated file, or
any shape its checks do not pass. The caller then loads the file with the
Python loader (``model.snapshot.load_snapshot``), which refuses every global
too and gives every message; so a file either reads the same both ways or
only the Python way.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from typing import Any

import numpy as np

from torchlens.formats.native_library import SNAPSHOT_READER
from torchlens.formats.snapshot_columns.columns import SnapshotColumns
from torchlens.model.snapshot import Frame

#: ``sr_column``'s order: (name, dtype, count index of ``sr_count``)
COLUMNS = (("e_device", np.int32, 0), ("e_action", np.int8, 0), ("e_addr", np.uint64, 0),
           ("e_size", np.int64, 0), ("e_time", np.int64, 0), ("e_stack", np.int32, 0),
           ("s_addr", np.uint64, 1), ("s_total", np.int64, 1), ("s_device", np.int32, 1),
           ("s_first", np.int32, 1), ("s_count", np.int32, 1), ("s_stack", np.int32, 1),
           ("b_addr", np.uint64, 2), ("b_size", np.int64, 2), ("b_state", np.int8, 2),
           ("b_stack", np.int32, 2),
           ("f_file", np.int64, 3), ("f_file_len", np.int64, 3), ("f_name", np.int64, 3),
           ("f_name_len", np.int64, 3), ("f_line", np.int64, 3), ("f_has", np.int8, 3),
           ("st_start", np.int32, 4), ("st_items", np.int32, 5))
#: ``sr_status``: why the reader declined
STATUS = ("ok", "refused", "unsupported opcode", "truncated", "malformed", "shape",
          "out of memory")
_T_NONE, _T_BOOL, _T_INT, _T_FLOAT, _T_STR, _T_LIST, _T_TUPLE, _T_DICT = range(8)


def _load() -> Any:
    path = SNAPSHOT_READER.library_path()
    if path is None or not path.exists():
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        warnings.warn(f"torchlens: {path.name} does not load ({exc}); snapshots are read "
                      "by the slower Python path", stacklevel=2)
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    lib.sr_read.restype, lib.sr_read.argtypes = p, [ctypes.c_char_p, i64]
    lib.sr_free.restype, lib.sr_free.argtypes = None, [p]
    lib.sr_free_tree.restype, lib.sr_free_tree.argtypes = None, [p]
    lib.sr_status.restype, lib.sr_status.argtypes = ctypes.c_int, [p]
    lib.sr_error.restype, lib.sr_error.argtypes = ctypes.c_char_p, [p]
    lib.sr_top.restype, lib.sr_top.argtypes = i32, [p]
    lib.sr_count.restype, lib.sr_count.argtypes = i64, [p, ctypes.c_int]
    lib.sr_column.restype, lib.sr_column.argtypes = p, [p, ctypes.c_int]
    lib.sr_node_type.restype, lib.sr_node_type.argtypes = ctypes.c_int, [p, i32]
    lib.sr_node_len.restype, lib.sr_node_len.argtypes = i64, [p, i32]
    lib.sr_node_item.restype, lib.sr_node_item.argtypes = i32, [p, i32, i64]
    lib.sr_node_u.restype, lib.sr_node_u.argtypes = ctypes.c_uint64, [p, i32]
    lib.sr_node_flags.restype, lib.sr_node_flags.argtypes = ctypes.c_int, [p, i32]
    lib.sr_get.restype, lib.sr_get.argtypes = i32, [p, i32, ctypes.c_char_p]
    lib.sr_pair.restype = ctypes.c_int
    lib.sr_pair.argtypes = [i64, p, p, p, p, i64, p, p]
    return lib


_LIB = _load()


def available() -> bool:
    """Whether snapshots are read by the compiled reader (built, not turned off)."""
    return _LIB is not None and not os.environ.get("TORCHLENS_NO_NATIVE")


def status(data: bytes) -> tuple[str, str]:
    """(status, the reader's reason) for ``data``: what tests check of a refusal."""
    if _LIB is None:
        raise RuntimeError("the snapshot reader is not built")
    h = _LIB.sr_read(data, len(data))
    try:
        return STATUS[_LIB.sr_status(h)], _LIB.sr_error(h).decode()
    finally:
        _LIB.sr_free(h)


class _Nodes:
    """Small parts of the tree (allocator_settings ...) as Python values."""

    def __init__(self, h: int, data: bytes) -> None:
        self.h, self.data = h, data

    def value(self, k: int, depth: int = 0) -> Any:
        lib, h = _LIB, self.h
        if depth > 50:
            raise ValueError("nested too deep")
        t = lib.sr_node_type(h, k)
        if t == _T_NONE:
            return None
        if t == _T_BOOL:
            return bool(lib.sr_node_u(h, k))
        if t == _T_INT:
            flags, u = lib.sr_node_flags(h, k), lib.sr_node_u(h, k)
            if flags & 2:
                raise ValueError("an integer past 64 bits")
            return -u if flags & 1 else u
        if t == _T_FLOAT:
            return _float(lib.sr_node_u(h, k))
        if t == _T_STR:
            off, n = lib.sr_node_u(h, k), lib.sr_node_len(h, k)
            return self.data[off:off + n].decode("utf-8", "surrogatepass")
        items = [self.value(lib.sr_node_item(h, k, i), depth + 1)
                 for i in range(lib.sr_node_len(h, k))]
        if t == _T_LIST:
            return items
        if t == _T_TUPLE:
            return tuple(items)
        return dict(zip(items[::2], items[1::2], strict=True))


def _float(bits: int) -> float:
    return float(np.array([bits], np.uint64).view(np.float64)[0])


def _text(data: bytes, cache: dict[int, str], off: int, n: int) -> str:
    s = cache.get(off)
    if s is None:
        s = cache[off] = data[off:off + n].decode("utf-8", "surrogatepass")
    return s


def read(data: bytes, record_key: str) -> SnapshotColumns | None:
    """The columns of a snapshot's bytes, or None where the reader declines them (the
    Python loader then reads the file); a snapshot carrying ``record_key`` (a
    torchlens export, restored by the Python path) is declined too."""
    if not available() or not data:
        return None
    h = _LIB.sr_read(data, len(data))
    if not h:
        return None
    owner = _Owner(h)  # sr_free when the last column is dropped
    if _LIB.sr_status(h) != 0:
        return None
    top = _LIB.sr_top(h)
    if _LIB.sr_get(h, top, record_key.encode()) >= 0:
        return None
    nodes = _Nodes(h, data)
    try:
        extra = {key: nodes.value(k) for key in ("allocator_settings", "external_annotations")
                 if (k := _LIB.sr_get(h, top, key.encode())) >= 0}
    except (ValueError, UnicodeDecodeError):
        return None
    traces = _LIB.sr_get(h, top, b"device_traces")
    n_devices = (_LIB.sr_node_len(h, traces)
                 if traces >= 0 and _LIB.sr_node_type(h, traces) == _T_LIST else 0)
    _LIB.sr_free_tree(h)
    counts = [_LIB.sr_count(h, i) for i in range(6)]
    cols: dict[str, np.ndarray] = {}
    for k, (name, dtype, which) in enumerate(COLUMNS):
        n = counts[which] + (1 if name == "st_start" else 0)
        if not n:
            cols[name] = np.zeros(0, dtype)
            continue
        # read in place (no copy: fresh pages cost more than the walk)
        buf = (np.ctypeslib.as_ctypes_type(dtype) * n).from_address(_LIB.sr_column(h, k))
        buf._owner = owner
        cols[name] = np.frombuffer(buf, dtype)
    try:
        frames = _frames(data, cols)
    except UnicodeDecodeError:
        return None
    starts, items = cols.pop("st_start").tolist(), cols.pop("st_items").tolist()
    stack_items = [items[a:b] for a, b in zip(starts, starts[1:], strict=False)]
    for name in ("f_file", "f_file_len", "f_name", "f_name_len", "f_line", "f_has"):
        cols.pop(name)
    settings = extra.get("allocator_settings")
    notes = extra.get("external_annotations")
    return SnapshotColumns(**cols, n_devices=int(n_devices), frames=frames,
                           stack_items=stack_items,
                           allocator_settings=dict(settings) if isinstance(settings, dict)
                           else {},
                           external_annotations=notes if isinstance(notes, list) else [])


class _Owner:
    """Frees a reader's columns when the last array reading them is dropped."""

    __slots__ = ("h",)

    def __init__(self, h: int) -> None:
        self.h = h

    def __del__(self) -> None:
        if _LIB is not None:  # (not at interpreter exit, after the module is torn down)
            _LIB.sr_free(self.h)


def _frames(data: bytes, cols: dict[str, np.ndarray]) -> list[Frame]:
    """Each distinct frame once (stacks share them, as the Python loader's do)."""
    cache: dict[int, str] = {}
    out = []
    for fo, fl, no, nl, line, has in zip(cols["f_file"].tolist(), cols["f_file_len"].tolist(),
                                         cols["f_name"].tolist(), cols["f_name_len"].tolist(),
                                         cols["f_line"].tolist(), cols["f_has"].tolist(),
                                         strict=True):
        out.append(Frame(_text(data, cache, fo, fl) if has & 1 else "",
                         _text(data, cache, no, nl) if has & 2 else "",
                         line if has & 4 else 0))
    return out


def pair(action: np.ndarray, addr: np.ndarray,
         blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``sr_pair`` (the replay's pairing, ``python_reader.pair``'s), or None unbuilt."""
    if not available():
        return None
    n = len(action)
    action = np.ascontiguousarray(action, np.int8)
    addr = np.ascontiguousarray(addr, np.uint64)
    blocks = np.ascontiguousarray(blocks, np.uint64)
    kind, partner = np.zeros(n, np.int8), np.zeros(n, np.int32)
    touched = np.zeros(len(blocks), np.int8)
    if _LIB.sr_pair(n, action.ctypes.data, addr.ctypes.data, kind.ctypes.data,
                    partner.ctypes.data, len(blocks), blocks.ctypes.data, touched.ctypes.data):
        return None
    return kind, partner, touched.astype(bool)

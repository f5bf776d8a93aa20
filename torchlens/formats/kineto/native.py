"""The native path of trace ingest: ``scan.c`` through ctypes.

The scanner returns numbers as columns with a "present" mask, and strings as
codes into per-column tables of keys (spans of the input). This module turns
them into exactly what the Python path produces (``python_reader``): the
same codes in the same first-appearance order, the same labels, the same
defaults for absent values; ``tests/formats/test_ingest_native.py`` checks
that on every shared trace. It returns None whenever the scanner declines a
trace (or is not built, or ``TORCHLENS_NO_NATIVE`` is set): the caller then
takes the Python path, which handles and counts every odd case.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from torchlens.formats.kineto.columns import FLOW_PHASES, RawColumns
from torchlens.formats.kineto.schema import (
    SCANNER_COLUMNS,
    Args,
    Event,
    KinetoTrace,
    scanner_layout,
)
from torchlens.formats.kineto.values import compact_raw, id_code
from torchlens.formats.native_library import SCANNER

_TEXT, _INT, _FLOAT = (SCANNER_COLUMNS[k] for k in ("text", "int", "float"))


def _load(path: Path | None = None, expected: list[str] | None = None) -> Any:
    """The scanner library, or None (with a warning when one is there but unusable).

    A file that does not load, or reports a layout other than ``schema``'s
    (another build, another project's library), is refused: reading its
    arrays with the wrong column order would give wrong tables silently.
    """
    path = path or SCANNER.library_path()
    if path is None or not path.exists():
        stale = sorted(SCANNER.source.parent.glob(SCANNER.pattern))
        if stale:
            _refuse(stale[0], "it was built from another version of scan.c")
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        _refuse(path, f"it is not a loadable shared library ({exc})")
        return None
    try:
        layout = _layout(lib)
    except AttributeError:
        _refuse(path, "it does not report a layout (tl_layout): a foreign or older library")
        return None
    want = scanner_layout() if expected is None else expected
    if layout != want:
        diff = next((f"{have!r} where {need!r} expected"
                     for have, need in zip(layout, want, strict=False) if have != need),
                    f"{len(layout)} layout lines where {len(want)} expected")
        _refuse(path, f"its column layout differs ({diff})")
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.tl_scan.restype, lib.tl_scan.argtypes = p, [ctypes.c_char_p, i64]
    lib.tl_free.restype, lib.tl_free.argtypes = None, [p]
    for name in ("tl_rows", "tl_events_start", "tl_events_end"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = i64, [p]
    for name in ("tl_status", "tl_top_count"):
        getattr(lib, name).restype, getattr(lib, name).argtypes = ctypes.c_int, [p]
    for name in ("tl_int_any", "tl_float_any"):
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = [p, ctypes.c_int]
    lib.tl_top.restype, lib.tl_top.argtypes = ctypes.POINTER(i64), [p]
    lib.tl_text_count.restype, lib.tl_text_count.argtypes = i64, [p, ctypes.c_int]
    for name, ctype in (("tl_text", ctypes.c_int32), ("tl_text_off", i64),
                        ("tl_text_len", i64), ("tl_text_tag", ctypes.c_char),
                        ("tl_int", i64), ("tl_int_has", ctypes.c_uint8),
                        ("tl_float", ctypes.c_double), ("tl_float_has", ctypes.c_uint8)):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.POINTER(ctype), [p, ctypes.c_int]
    return lib


def _layout(lib: Any) -> list[str]:
    """What ``tl_layout`` reports, as ``schema.scanner_layout`` words it."""
    fn = lib.tl_layout  # AttributeError: no such symbol
    fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_char_p, ctypes.c_int64]
    size = 4096
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = fn(buf, size)
        if 0 <= n < size:
            lines = buf.value.decode("utf-8", "replace").splitlines()
            return lines[:4] + sorted(lines[4:])
        size = n + 1
    return []


def _refuse(path: Path, why: str) -> None:
    warnings.warn(
        f"torchlens: not using the C trace scanner {path}: {why}. Traces are read by "
        "the slower Python path; reinstall torchlens (pip install -e . in a "
        "checkout) to rebuild it.", RuntimeWarning, stacklevel=2)


_LIB = _load()


def available() -> bool:
    """Whether the compiled scanner is loaded (else every trace takes the Python path)."""
    return _LIB is not None and not os.environ.get("TORCHLENS_NO_NATIVE")


class _Declined(Exception):
    """A key the scanner accepted but the Python path would read differently."""


def scan(data: bytes) -> tuple[Scan, list[list[int]]] | None:
    """The scanner's columns of a whole document, and the spans of its top-level
    members (key offset, key length, value offset, value length); None when
    the scanner is not there or declines it."""
    if not available() or type(data) is not bytes:  # the scanner reads a NUL-ended bytes
        return None
    handle = _LIB.tl_scan(data, len(data))
    if not handle:
        return None
    try:
        if _LIB.tl_status(handle) != 0 or _LIB.tl_rows(handle) == 0:
            return None
        scanned = _copy_out(handle, _LIB.tl_rows(handle))
        n_top = _LIB.tl_top_count(handle)
        top = _copy(_LIB.tl_top(handle), 4 * n_top, np.int64).reshape(-1, 4).tolist()
    finally:
        _LIB.tl_free(handle)
    return scanned, top


def columns_of(data: bytes, scanned: tuple[Scan, list[list[int]]],
               pid_labels: dict[str, str], tid_labels: dict[str, str]) -> RawColumns | None:
    """One piece's columns (``formats.kineto.pieces``), its named pids and tids
    coded on from ``pid_labels`` / ``tid_labels`` (shared by every piece); a
    piece of metadata events alone has no rows. None: declined."""
    try:
        return _columns(data, scanned[0], pid_labels, tid_labels, meta_only=True)
    except (msgspec.MsgspecError, UnicodeDecodeError, _Declined):
        return None


def native_columns(data: bytes) -> tuple[RawColumns, KinetoTrace] | None:
    """Columns and the trace's other top-level fields, or None (use the Python path)."""
    scanned = scan(data)
    if scanned is None:
        return None
    scan_, top = scanned
    try:
        members = {msgspec.json.decode(b'"' + data[k:k + kn] + b'"'):
                   msgspec.json.decode(data[v:v + vn]) for k, kn, v, vn in top}
        rest = msgspec.convert(members, KinetoTrace)
        columns = _columns(data, scan_)
    except (msgspec.MsgspecError, UnicodeDecodeError, _Declined):
        return None
    return (columns, rest) if columns is not None else None


def _copy(ptr: Any, size: int, dtype: Any) -> np.ndarray:
    """One copy out of the scanner's buffer (freed right after)."""
    out = np.empty(size, dtype)
    if size:
        ctypes.memmove(out.ctypes.data, ptr, out.nbytes)
    return out


#: a scanned column: its values and which events set it
Present = tuple[np.ndarray, np.ndarray]


@dataclass
class Scan:
    """The scanner's columns copied out: ``n`` events; per text column its codes,
    and the offsets, lengths and tags of its distinct strings; per number
    column its values and which events set it."""

    n: int
    text: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict)
    ints: dict[str, Present] = field(default_factory=dict)
    floats: dict[str, Present] = field(default_factory=dict)

    def numbers(self, kind: str) -> dict[str, Present]:
        """The ``"int"`` or ``"float"`` columns."""
        return self.ints if kind == "int" else self.floats


def _copy_out(handle: int, n: int) -> Scan:
    arr = _copy
    out = Scan(n)
    for k, name in enumerate(_TEXT):
        count = _LIB.tl_text_count(handle, k)
        out.text[name] = (
            arr(_LIB.tl_text(handle, k), n, np.int32) if count else np.full(n, -1, np.int32),
            arr(_LIB.tl_text_off(handle, k), count, np.int64),
            arr(_LIB.tl_text_len(handle, k), count, np.int64),
            arr(_LIB.tl_text_tag(handle, k), count, np.uint8),
        )
    # A column no event set is not copied: its mask is all False.
    unset = np.zeros(n, bool)
    for k, name in enumerate(_INT):
        out.ints[name] = ((arr(_LIB.tl_int(handle, k), n, np.int64),
                             arr(_LIB.tl_int_has(handle, k), n, np.uint8).view(bool))
                            if _LIB.tl_int_any(handle, k) else (np.zeros(n, np.int64), unset))
    for k, name in enumerate(_FLOAT):
        out.floats[name] = ((arr(_LIB.tl_float(handle, k), n, np.float64),
                               arr(_LIB.tl_float_has(handle, k), n, np.uint8).view(bool))
                              if _LIB.tl_float_any(handle, k)
                              else (np.zeros(n, np.float64), unset))
    return out


class _Keys:
    """The Python value of each key of one text column, decoded on first use."""

    def __init__(self, data: bytes, off: np.ndarray, length: np.ndarray,
                 tag: np.ndarray) -> None:
        self.data, self.off, self.len, self.tag = data, off, length, tag
        self.cache: dict[int, Any] = {}

    def __getitem__(self, code: int) -> Any:
        if code < 0:
            return None
        hit = self.cache.get(code, self)
        if hit is not self:
            return hit
        start = int(self.off[code])
        body = self.data[start:start + int(self.len[code])]
        tag = chr(self.tag[code])
        if tag == "i":
            value: Any = int(body)
        elif tag == "r":
            value = compact_raw(body)
        elif b"\\" in body:
            value = msgspec.json.decode(b'"' + body + b'"')
        else:
            value = body.decode("utf-8")
        self.cache[code] = value
        return value


def _first_seen(codes: np.ndarray, in_order: bool) -> np.ndarray:
    """Distinct codes (>= 0) in order of first appearance."""
    present = codes[codes >= 0]
    if in_order:  # the scanner numbers keys as it meets them
        return np.flatnonzero(np.bincount(present, minlength=0)) if len(present) else present
    uniq, first = np.unique(present, return_index=True)
    return uniq[np.argsort(first, kind="stable")]


def _text(codes: np.ndarray, keys: Any, in_order: bool,
          rename: dict[Any, Any] | None = None) -> tuple[np.ndarray, list[str]]:
    """Codes re-numbered over equal values, labels as the Python path's ``intern``."""
    n_keys = int(codes.max()) + 1 if len(codes) else 0
    if n_keys <= 0:
        return np.full(len(codes), -1, np.int32), []
    lut = np.full(n_keys + 1, -1, np.int32)  # code -1 picks the trailing -1
    values: dict[Any, int] = {}
    for c in _first_seen(codes, in_order).tolist():
        v = keys[c]
        if rename:
            v = rename.get(v, v)
        lut[c] = values.setdefault(v, len(values))
    return lut[codes], [str(v) for v in values]


def _ids(v: np.ndarray, has: np.ndarray, codes: np.ndarray, keys: _Keys,
         labels: dict[str, str]) -> np.ndarray:
    """pid/tid as ``values.id_column`` codes them."""
    if has.all():
        return v
    rows = np.flatnonzero(~has)
    missing = codes[rows].astype(np.int64)
    shifted = missing + 1  # None (-1) becomes key 0
    uniq, first = np.unique(shifted, return_index=True)
    # the codes given so far (an earlier piece's), so a piece's new ones go on from them
    seen: dict[str, int] = {key: int(code) for code, key in labels.items()}
    lut = np.zeros(int(uniq.max()) + 1, np.int64)
    for s in uniq[np.argsort(first, kind="stable")].tolist():
        lut[s] = id_code(keys[s - 1], seen, labels)
    out = v.copy()
    out[rows] = lut[shifted]
    return out


def _columns(data: bytes, scan: Scan, pid_labels: dict[str, str] | None = None,
             tid_labels: dict[str, str] | None = None, meta_only: bool = False
             ) -> RawColumns | None:
    text = {name: (codes, _Keys(data, off, length, tag))
            for name, (codes, off, length, tag) in scan.text.items()}
    ph_codes, ph_keys = text["ph"]
    m_code = next((c for c in range(len(ph_keys.off)) if ph_keys[c] == "M"), -1)
    is_meta = ph_codes == m_code
    n_meta = int(is_meta.sum())
    if n_meta == scan.n and not meta_only:
        return None  # no row events: the Python path words the error
    keep = ~is_meta if n_meta else slice(None)
    in_order = n_meta == 0

    def codes_of(name: str) -> np.ndarray:
        return text[name][0][keep]

    def ints(name: str, default: int = -1) -> np.ndarray:
        v, has = scan.ints[name]
        return np.where(has[keep], v[keep], default)

    def floats(name: str, default: float) -> np.ndarray:
        v, has = scan.floats[name]
        return np.where(has[keep], v[keep], default)

    def either(first: str, second: str, default: Any, kind: str) -> np.ndarray:
        a, ha = scan.numbers(kind)[first]
        b, hb = scan.numbers(kind)[second]
        return np.where(ha[keep], a[keep], np.where(hb[keep], b[keep], default))

    cols: dict[str, np.ndarray] = {}
    cats: dict[str, list[str]] = {}
    raw = RawColumns(cols, cats, None, [], {} if pid_labels is None else pid_labels,
                     {} if tid_labels is None else tid_labels)
    for name in ("name", "cat", "call_stack", "collective", "dtype"):
        cols[name], cats[name] = _text(codes_of(name), text[name][1], in_order)
    cols["ph"], cats["ph"] = _text(codes_of("ph"), ph_keys, in_order, {"I": "i"})
    raw.names = LabelAt(cols["name"], cats["name"])
    for name in ("input_dims", "input_types"):
        cols[name], cats[name] = _text(codes_of(name), text[name][1], in_order)
    pg_name, pg_id = codes_of("pg_name"), codes_of("pg_id")
    n_names = len(text["pg_name"][1].off)
    either_pg = np.where(pg_name >= 0, pg_name, np.where(pg_id >= 0, pg_id + n_names, -1))
    cols["pg_name"], cats["pg_name"] = _text(
        either_pg, _Either(text["pg_name"][1], text["pg_id"][1], n_names), False)

    cols["ts"] = scan.floats["ts"][0][keep]
    cols["dur"] = floats("dur", 0.0)
    for name, labels in (("pid", raw.pid_labels), ("tid", raw.tid_labels)):
        v, has = scan.ints[name]
        cols[name] = _ids(v[keep], has[keep], codes_of(name), text[name][1], labels)
    cols["external_id"] = either("external_id", "external_id_lc", -1, "int")
    cols["correlation"] = ints("correlation")
    flow_codes = [cats["ph"].index(p) for p in FLOW_PHASES if p in cats["ph"]]
    id_v, id_has = scan.ints["id"]
    cols["flow_id"] = np.where(id_has[keep] & np.isin(cols["ph"], flow_codes),
                               id_v[keep], -1)
    cols["device"], cols["stream"] = ints("device"), ints("stream")
    cols["flops"] = either("flops", "flops_uc", np.nan, "float")
    for name in ("bytes", "in_nelems", "out_nelems", "group_size", "addr",
                 "total_allocated", "total_reserved", "device_type", "device_id"):
        cols[name] = ints(name)
    cols["mem_bytes"] = ints("mem_bytes", default=0)
    if n_meta:
        raw.meta_events = _meta_events(np.flatnonzero(is_meta), scan, text)
    return raw


class LabelAt:
    """``names[i]``: the label of row i (read only for rows without a category)."""

    def __init__(self, codes: np.ndarray, labels: list[str]) -> None:
        self.codes, self.labels = codes, labels

    def __getitem__(self, i: int) -> str | None:
        c = int(self.codes[i])
        return self.labels[c] if c >= 0 else None


class _Either:
    """Keys of two columns numbered one after the other (``pg_name`` else ``pg_id``)."""

    def __init__(self, first: _Keys, second: _Keys, n_first: int) -> None:
        self.first, self.second, self.n_first = first, second, n_first

    def __getitem__(self, code: int) -> Any:
        if code < self.n_first:
            return self.first[code]
        return self.second[code - self.n_first]


def _meta_events(rows: np.ndarray, scan: Scan,
                 text: dict[str, tuple[np.ndarray, _Keys]]) -> list[Event]:
    """The ``M`` events as the records ``columns._metadata`` reads."""
    def value(name: str, r: int) -> Any:
        codes, keys = text[name]
        return keys[int(codes[r])]

    def ident(name: str, r: int) -> Any:
        v, has = scan.ints[name]
        return int(v[r]) if has[r] else value(name, r)

    return [Event(ph="M", name=value("name", r), pid=ident("pid", r), tid=ident("tid", r),
                  args=Args(meta_name=value("meta_name", r), labels=value("labels", r)))
            for r in rows.tolist()]

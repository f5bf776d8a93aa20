"""Python values of one trace field -> a numpy column (both reader paths).

Kineto writes the same field with different types across traces and
versions (ints as strings, hex stream ids on AMD, floats in int fields): these
helpers convert the common case in C (``np.fromiter``, dict lookups) and
fall back to a per-value path only for odd values, counting what they could
not use instead of dropping it silently.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import msgspec
import numpy as np


def without(items: list[Any], cut: slice) -> list[Any]:
    return items[:cut.start] + items[cut.stop:]


class Absent(list):
    """A column of ``None`` for an args key no event has (no need to count)."""


def _all_none(values: list[Any]) -> bool:
    return type(values) is Absent or values.count(None) == len(values)


def intern(values: list[Any]) -> tuple[np.ndarray, list[str]]:
    """Strings to int32 codes into a label list; ``None`` to -1 (hashing in C).

    A mostly empty column (NCCL or memory fields) is interned from its few
    present values only.
    """
    n = len(values)
    if type(values) is Absent:
        return np.full(n, -1, np.int32), []
    missing = values.count(None)
    if missing == n:
        return np.full(n, -1, np.int32), []
    if missing > n // 2:
        idx = present_rows(values)
        codes = np.full(n, -1, np.int32)
        codes[idx], labels = intern([values[i] for i in idx])
        return codes, labels
    return intern_dense(values)


def intern_dense(values: list[Any]) -> tuple[np.ndarray, list[str]]:
    """``intern`` for columns set on (nearly) every event: no counting first.

    A dict keyed by the values (insertion order = first appearance) and one
    C-level lookup per row: about twice as fast as ``pd.factorize`` on an
    object array for the few hundred distinct names of a trace.
    """
    lut: dict[Any, int] = dict.fromkeys(values)  # type: ignore[assignment]
    missing = None in lut
    if missing:
        del lut[None]
    for code, key in enumerate(lut):
        lut[key] = code
    labels = [str(k) for k in lut]
    if missing:
        lut[None] = -1
    return np.fromiter(map(lut.__getitem__, values), np.int32, len(values)), labels


def present_rows(values: list[Any]) -> list[int]:
    return [i for i, v in enumerate(values) if v is not None]


def intern_raw(values: list[Any]) -> tuple[np.ndarray, list[str]]:
    """``Input Dims`` / ``Input type`` (raw JSON) interned as compact text.

    Each distinct raw value is compacted once; values that differ only in
    spacing share a label, in order of first appearance.
    """
    n = len(values)
    codes = np.full(n, -1, np.int32)
    if _all_none(values):
        return codes, []
    idx = [i for i, r in enumerate(values) if r]
    if not idx:
        return codes, []
    raws = [bytes(values[i]) for i in idx]
    lut: dict[bytes, int] = dict.fromkeys(raws)  # type: ignore[assignment]
    labels: dict[str, int] = {}
    for raw in lut:
        lut[raw] = labels.setdefault(compact_raw(raw), len(labels))
    codes[idx] = np.fromiter(map(lut.__getitem__, raws), np.int32, len(raws))
    return codes, list(labels)


def int_column(values: list[Any], default: int, name: str,
                unparsed: Counter) -> np.ndarray:
    """Ints (None -> default); hex or decimal strings parsed; the rest counted.

    A mostly empty column is converted from its present values only.
    """
    n = len(values)
    if type(values) is Absent:
        return np.full(n, default, np.int64)
    missing = values.count(None)
    if missing == n:
        return np.full(n, default, np.int64)
    if missing > n // 2:
        idx = present_rows(values)
        out = np.full(n, default, np.int64)
        out[idx] = _int_values([values[i] for i in idx], default, name, unparsed)
        return out
    return _int_values(values if not missing else
                       [default if v is None else v for v in values],
                       default, name, unparsed)


def _int_values(values: list[Any], default: int, name: str,
                unparsed: Counter) -> np.ndarray:
    try:  # ints (and decimal strings, floats truncated), in C
        return np.fromiter(values, np.int64, len(values))
    except (TypeError, ValueError, OverflowError):
        pass
    out = []
    for v in values:
        if v is None:
            out.append(default)
            continue
        parsed = v if type(v) is int else _to_int(v)
        if parsed is None or not _INT64_MIN <= parsed <= _INT64_MAX:
            unparsed[name] += 1  # e.g. an id beyond 64 bits: counted, not fatal
            parsed = default
        out.append(parsed)
    return np.asarray(out, dtype=np.int64)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _to_int(v: Any) -> int | None:
    if isinstance(v, float):
        return int(v) if math.isfinite(v) else None
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            try:
                return int(float(v))
            except (ValueError, OverflowError):  # "1e999" is inf
                return None
    return None


def float_column(values: list[Any], default: float) -> np.ndarray:
    if type(values) is Absent:
        return np.full(len(values), default, np.float64)
    try:
        out = np.fromiter(values, np.float64, len(values))  # all numbers: fastest
    except (TypeError, ValueError):
        try:
            out = np.asarray(values, dtype=np.float64)  # None -> NaN
        except (TypeError, ValueError):
            out = np.asarray([_to_float(v) for v in values], dtype=np.float64)
    if not math.isnan(default):
        out[np.isnan(out)] = default
    return out


def _to_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def id_column(values: list[Any], labels: dict[str, str]) -> np.ndarray:
    """pid/tid: ints stay; other ids get negative ints, named in ``labels``.

    Each distinct id is coded once (in order of first appearance), then the
    codes are spread over the rows in C.
    """
    if set(map(type, values)) == {int}:  # the usual case
        try:
            return np.fromiter(values, np.int64, len(values))
        except OverflowError:
            pass
    codes: dict[str, int] = {}
    distinct: dict[Any, int] = dict.fromkeys(values)  # type: ignore[assignment]
    for v in distinct:
        distinct[v] = id_code(v, codes, labels)
    return np.fromiter(map(distinct.__getitem__, values), np.int64, len(values))


def id_code(v: Any, codes: dict[str, int], labels: dict[str, str]) -> int:
    """One pid/tid value as an int: numeric ids as themselves, any other id
    (a name, or a missing id) as the next negative code, named in ``labels``."""
    number: int | None = None
    if type(v) is int:
        number = v
    elif isinstance(v, str) and v.strip().lstrip("-").isdigit() and len(v.strip()) <= 20:
        number = int(v)
    elif isinstance(v, float) and v.is_integer():
        number = int(v)
    if number is not None and _INT64_MIN <= number <= _INT64_MAX:
        return number
    # a name, a missing id or a number no int64 holds: a label of its own
    key = "" if v is None else str(v)
    if key not in codes:
        codes[key] = -(len(codes) + 1)
        labels[str(codes[key])] = key
    return codes[key]


def compact_raw(raw: msgspec.Raw | bytes) -> str | None:
    """``Input Dims`` / ``Input type`` as compact JSON text, without parsing it."""
    if not raw:
        return None
    return bytes(raw).replace(b", ", b",").decode("utf-8", "replace")


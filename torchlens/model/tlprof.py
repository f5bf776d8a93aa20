"""The ``.tlprof`` file: a zip of JSON metadata and ``.npz`` tables.

Layout (format version 2)::

    manifest.json           {"format": "torchlens-profile", "format_version": 2,
                             kind, title, environment, payload, ...}
    tables/<name>.npz       one Table (columns, and __categories__ as JSON)
    traces/<key>.npz        a Trace's events Table
    traces/<key>.json       its meta
    snapshots/<key>.json    an allocator snapshot (builtins only)
    attachments/<i>         a raw file kept byte for byte

Compatibility rule: a reader accepts every ``format_version`` up to its own and
fills keys an older writer did not know with defaults; a newer major version
is refused with a message that says to upgrade. Loading never unpickles.
Version 1 kept each kind's facts in untyped ``options`` and ``extra`` dicts
(and a DDP run's collectives twice); ``payloads.upgrade_v1`` reads them into
the typed payload.

This module reads and writes the file in terms of a profile's fields (the
keyword arguments of ``Profile``: tables, JSON-able values, snapshots, bytes,
each trace as ``(events, meta)``), below ``model.profile``, which it never
imports: ``Profile.save`` and ``Profile.load`` call it, and ``model.store``
(``save_profile``, ``load_profile``) calls them.
"""

from __future__ import annotations

import io
import json
import reprlib
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from torchlens.model.errors import FormatVersionError, InputError
from torchlens.model.guarded_open import check_members, open_guarded
from torchlens.model.payloads import PAYLOADS, from_json, to_json, upgrade_v1
from torchlens.model.snapshot import Snapshot, normalize_snapshot
from torchlens.model.table import Table

FORMAT = "torchlens-profile"
FORMAT_VERSION = 2
_CATEGORIES_KEY = "__categories__"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    return str(obj)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, default=_json_default, allow_nan=True).encode()


def _table_bytes(table: Table) -> bytes:
    buf = io.BytesIO()
    arrays = dict(table.columns.items())  # a sparse column saved whole
    cats = json.dumps(table.categories).encode()
    arrays[_CATEGORIES_KEY] = np.frombuffer(cats, dtype=np.uint8)
    np.savez(buf, **arrays)
    return buf.getvalue()


def _table_from_bytes(data: bytes) -> Table:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        columns = {k: npz[k] for k in npz.files if k != _CATEGORIES_KEY}
        cats = (
            json.loads(npz[_CATEGORIES_KEY].tobytes().decode())
            if _CATEGORIES_KEY in npz.files
            else {}
        )
    return Table(columns, cats)


def write_tlprof(fields: dict[str, Any], path: str | Path) -> str:
    """Write a profile's ``fields`` (the keyword arguments of ``Profile``, each
    trace as ``(events, meta)``: what ``read_tlprof`` gives back) to ``path``;
    returns the path as a string."""
    path = Path(path)
    traces: dict[str, tuple[Table, dict[str, Any]]] = fields["traces"]
    tables: dict[str, Table] = fields["tables"]
    snapshots: dict[str, Snapshot] = fields["snapshots"]
    attachments: dict[str, bytes] = fields["attachments"]
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": fields["kind"],
        "title": fields["title"],
        "environment": fields["environment"],
        "payload": to_json(fields["payload"]),
        "created_at": fields["created_at"],
        "wall_time_s": fields["wall_time_s"],
        "source": fields["source"],
        "unmeasured": fields["unmeasured"],
        "error": fields["error"],
        "traces": list(traces),
        "tables": list(tables),
        "snapshots": list(snapshots),
        "attachments": list(attachments),
    }
    tmp = path.with_name(path.name + ".partial")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("manifest.json", _dumps(manifest))
        for i, (events, meta) in enumerate(traces.values()):
            zf.writestr(f"traces/{i}.npz", _table_bytes(events))
            zf.writestr(f"traces/{i}.json", _dumps(meta))
        for i, table in enumerate(tables.values()):
            zf.writestr(f"tables/{i}.npz", _table_bytes(table))
        for i, snap in enumerate(snapshots.values()):
            zf.writestr(f"snapshots/{i}.json", _dumps(snap.to_torch()))
        for i, blob in enumerate(attachments.values()):
            zf.writestr(f"attachments/{i}", blob)
    tmp.replace(path)  # a crash mid-write never leaves a half file under the name
    return str(path)


#: what reading a damaged zip member, its JSON or its ``.npz`` raises (a changed byte,
#: a file cut short, a nest deeper than the parser follows)
_DAMAGED = (KeyError, ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error,
            NotImplementedError, RecursionError, OverflowError)
#: the manifest's keys and the type each must have when present
_MANIFEST_TYPES: dict[str, type | tuple[type, ...]] = {
    "kind": str, "title": str, "environment": dict, "payload": (dict, type(None)),
    "created_at": (int, float), "wall_time_s": (int, float, type(None)), "source": str,
    "unmeasured": list, "error": (dict, type(None)), "traces": list, "tables": list,
    "snapshots": list, "attachments": list, "options": (dict, type(None)),
    "extra": (dict, type(None)),
}


def _check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Each key the reader uses has its type: a damaged value is named, not a traceback."""
    for key, types in _MANIFEST_TYPES.items():
        if key in manifest and (not isinstance(manifest[key], types)
                                or isinstance(manifest[key], bool)):
            raise InputError(f"{path}: damaged .tlprof file: manifest.json field {key!r} is "
                             f"{_shown(manifest[key])}; save the result again.")
    for key in ("traces", "tables", "snapshots", "attachments"):
        if not all(isinstance(k, str) for k in manifest.get(key, [])):
            raise InputError(f"{path}: damaged .tlprof file: manifest.json field {key!r} "
                             "holds a name that is not text; save the result again.")


def _shown(value: Any) -> str:
    text = reprlib.repr(value)  # depth-limited: a damaged value may nest thousands deep
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def read_tlprof(path: str | Path) -> dict[str, Any]:
    """Read a ``.tlprof`` file: the keyword arguments of ``Profile``, each trace
    as ``(events, meta)``; raises ``InputError`` with advice on bad input."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file. Check the path.")
    try:  # a regular file only (no FIFO, no device), its members within the cap below
        fh = open_guarded(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        zf = zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
        fh.close()
        raise InputError(
            f"{path}: not a torchlens .tlprof file (not a zip archive, or one cut short); "
            "for a Kineto trace use a .json or .json.gz file."
        ) from None
    with fh, zf:
        check_members(zf, str(path))  # what its members inflate to, before any is read
        try:
            manifest = json.loads(zf.read("manifest.json"))
        except KeyError:
            raise InputError(
                f"{path}: not a torchlens .tlprof file (no manifest.json)."
            ) from None
        except _DAMAGED as exc:
            raise InputError(f"{path}: damaged .tlprof file: its manifest.json cannot be "
                             f"read ({_why(exc)}); save the result again.") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise InputError(f"{path}: not a torchlens .tlprof file.")
        version = manifest.get("format_version", 0)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise FormatVersionError(
                f"{path}: written in .tlprof format version {version}, newer than "
                f"this torchlens reads ({FORMAT_VERSION}). Upgrade torchlens."
            )
        _check_manifest(path, manifest)
        member = "manifest.json"
        try:
            traces = {}
            for i, key in enumerate(manifest.get("traces", [])):
                member = f"traces/{i}.npz"
                events = _table_from_bytes(zf.read(member))
                member = f"traces/{i}.json"
                meta = json.loads(zf.read(member))
                if not isinstance(meta, dict):
                    raise ValueError(f"holds a {type(meta).__name__}, not an object")
                traces[key] = (events, meta)
            tables = {}
            for i, key in enumerate(manifest.get("tables", [])):
                member = f"tables/{i}.npz"
                tables[key] = _table_from_bytes(zf.read(member))
            snapshots = {}
            for i, key in enumerate(manifest.get("snapshots", [])):
                member = f"snapshots/{i}.json"
                # checked as a snapshot file is: the memory analysis reads every field
                snapshots[key] = normalize_snapshot(json.loads(zf.read(member)),
                                                    name=f"{path} ({member})")
            attachments = {}
            for i, key in enumerate(manifest.get("attachments", [])):
                member = f"attachments/{i}"
                attachments[key] = zf.read(member)
        except InputError:
            raise  # already names the file, the member and the field
        except _DAMAGED as exc:
            raise InputError(f"{path}: damaged .tlprof file: {member} cannot be read "
                             f"({_why(exc)}); save the result again.") from None
    skipped = _skip_bad_numbers(manifest)
    kind = manifest.get("kind", "trace")
    if kind not in PAYLOADS:
        raise InputError(f"{path}: holds a result of kind {kind!r}, which this torchlens "
                         f"does not know ({', '.join(PAYLOADS)}). Upgrade torchlens.")
    try:
        if version < 2:
            payload = upgrade_v1(kind, manifest.get("options") or {},
                                 manifest.get("extra") or {})
            tables.pop("collectives", None)  # version 1 kept a copy of the fingerprints
        else:
            payload = from_json(kind, manifest.get("payload"))
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        raise InputError(f"{path}: damaged .tlprof file: manifest.json's "
                         f"{'payload' if version >= 2 else 'options'} cannot be read "
                         f"({_why(exc)}); save the result again.") from None
    return dict(
        kind=kind,
        title=manifest.get("title", ""),
        environment=manifest.get("environment", {}),
        payload=payload,
        created_at=manifest.get("created_at", 0.0),
        wall_time_s=manifest.get("wall_time_s"),
        source=manifest.get("source", str(path)),
        traces=traces,
        tables=tables,
        snapshots=snapshots,
        unmeasured=[*manifest.get("unmeasured", []), *skipped],
        error=manifest.get("error"),
        attachments=attachments,
    )


#: the manifest's numbers and the range each must lie in (a time from 1970 to 9999,
#: a duration of at most a year): a value outside it is named and left out
_NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "created_at": (0.0, 253402300799.0), "wall_time_s": (0.0, 366 * 86400.0)}


def _skip_bad_numbers(manifest: dict[str, Any]) -> list[str]:
    """Each number of ``_NUMBER_RANGES`` that is not finite or out of its range
    (``1e400`` reads as infinity) dropped from ``manifest``, said in words
    for the report's "Not measured"; the rest of the file is read as it is."""
    said = []
    for key, (lo, hi) in _NUMBER_RANGES.items():
        value = manifest.get(key)
        if isinstance(value, (int, float)) and not lo <= value <= hi:  # NaN fails too
            del manifest[key]
            said.append(f"the saved file's {key} ({_shown(value)}) is not a usable "
                        "value and was left out")
    return said


def _why(exc: BaseException) -> str:
    """An exception in words for a one-line message: no class names, no line breaks."""
    if isinstance(exc, RecursionError):
        return "nested deeper than the reader follows"
    if isinstance(exc, (zlib.error, zipfile.BadZipFile, EOFError)):
        # zlib says "Error -3 while decompressing data: invalid ..."; keep the detail
        detail = str(exc).split("decompressing data: ")[-1].splitlines()[0][:120]
        return f"compressed data damaged or cut short: {detail}"
    text = " ".join(str(exc).split())
    return text[:160] or "damaged"

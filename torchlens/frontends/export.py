"""Writing a result to a file: the one place that maps a suffix to a format.

Magics (``--export``), the Python API (``result.export``) and the CLI all go
through ``export_profile`` so the formats stay the same everywhere; which
suffixes a kind has, and the writer of each, come from ``kinds``.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any

from torchlens.frontends import kinds
from torchlens.model import InputError, Profile

#: Suffix -> what it writes (which suffixes a kind accepts: ``kinds.export_suffixes``).
FORMATS = kinds.EXPORT_FORMATS


def export_format(path: str | Path, kind: str | None = None) -> str:
    """The suffix key of ``path`` in FORMATS, or an InputError naming the choices
    (those of ``kind`` when given)."""
    name = str(path).lower()
    choices = kinds.export_suffixes(kind) if kind else list(FORMATS)
    for suffix in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(suffix):
            if suffix not in choices:
                raise InputError(f"cannot export {kind} results to {path!s}; use one of "
                                 + ", ".join(choices))
            return suffix
    raise InputError(f"cannot export to {path!s}: unknown file type; use one of "
                     + ", ".join(choices))


def check_export_path(path: str | Path, kind: str | None = None) -> None:
    """Fail early (before any capture) on a bad suffix or a missing folder."""
    fmt = export_format(path, kind)
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise InputError(f"cannot export to {path!s}: folder {parent} does not exist")
    target = Path(path).expanduser()
    if fmt == "/" and target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InputError(f"cannot export the run folder to {path!s}: it exists and is not "
                         "an empty folder (nothing is overwritten)")


def export_profile(profile: Profile, path: str | Path, analysis: Any = None) -> str:
    """Write ``profile`` to ``path`` in the format its suffix names. ``analysis``
    is the profile's analysis when the caller has it (it is made if needed)."""
    fmt = export_format(path, profile.kind)
    path = Path(path).expanduser()
    if fmt == ".tlprof":
        return profile.save(str(path))
    if fmt == ".html":
        analysis = kinds.analyze(profile) if analysis is None else analysis
        path.write_text(kinds.report_html(profile, analysis), encoding="utf-8")
        return str(path)
    return kinds.exporter(profile, fmt)(profile, analysis, path)


def write_trace(profile: Profile, analysis: Any, path: Path) -> str:
    """The Kineto JSON as the profiler wrote it (gzipped for ``.json.gz``).
    Writers take the analysis when the caller has one, else None."""
    raw = profile.attachments.get("trace.json")
    if raw is None:
        raise InputError(
            f"cannot export {path!s}: this result holds no profiler trace "
            "(export .html or .tlprof instead)"
        )
    path.write_bytes(gzip.compress(raw) if str(path).lower().endswith(".gz") else raw)
    return str(path)


def _builtins_only(obj: Any) -> Any:
    """A copy made of dicts, lists, tuples, str, int, float, bool and None only,
    so the file loads with an unpickler that refuses every global."""
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, (int, str)) else k: _builtins_only(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_builtins_only(v) for v in obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def write_snapshot(profile: Profile, analysis: Any, path: Path) -> str:
    """The profile's snapshot as torch writes it (``_dump_snapshot``: a pickled dict).

    A CPU capture has no CUDA segments: its file holds the CPU allocator's
    trace and, as ``segments``, what the allocator model would hold after it
    (``allocator_settings`` says which setting), so memory_viz draws both.
    A capture's file also holds what the format has no key for (the device it
    measured on, cell numbers, runs: ``formats.gpumem_record``), so loading it
    gives the live result's figures.
    """
    import msgspec

    from torchlens.formats.gpumem_record import RECORD_KEY, make_record

    if not profile.snapshots:
        raise InputError(f"cannot export {path!s}: this result holds no allocator snapshot")
    snap = next(iter(profile.snapshots.values()))
    payload = profile.payload
    if payload.measured_on == "cpu":  # type: ignore[union-attr]
        model = (analysis or kinds.analyze(profile)).model
        if model is not None:
            snap = msgspec.structs.replace(snap, segments=model.snapshot.segments,
                                           allocator_settings=model.snapshot.allocator_settings)
    snap = snap.to_torch()
    if payload.measured_on in ("cpu", "cuda"):  # type: ignore[union-attr]
        record = make_record(payload, list(profile.unmeasured),  # type: ignore[arg-type]
                             profile.error)
        snap[RECORD_KEY] = msgspec.to_builtins(record)
    path.write_bytes(pickle.dumps(_builtins_only(snap), protocol=4))
    return str(path)


def write_run_folder(profile: Profile, analysis: Any, path: Path) -> str:
    """A --profile run's folder (traces, steps, manifest) copied to ``path``, with
    the result itself as ``result.tlprof``, so the folder alone re-renders the report."""
    from torchlens.formats.run_folder.files import RESULT_FILE, copy_run

    profiling = getattr(profile.payload, "profiling", None)
    if profiling is None or not profiling.run_dir:
        raise InputError(f"cannot export {path!s}: this run was not profiled (no run folder); "
                         "run %ddp_check with --profile")
    source = Path(profiling.run_dir)
    if not source.is_dir():
        raise InputError(f"cannot export {path!s}: the run folder {source} is gone")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"cannot export the run folder to {path!s}: it exists and is not "
                         "an empty folder (nothing is overwritten)")
    copy_run(str(source), str(path))
    profile.save(str(path / RESULT_FILE))
    return str(path)
